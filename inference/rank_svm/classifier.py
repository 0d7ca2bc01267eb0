"""A scikit-learn classifier over the rank-likelihood factor SVM: :class:`RankFactorSVC`.

``fit`` runs the Gibbs sampler (:func:`~latentzoo.inference.rank_svm.fit_gibbs`) or mean-field VB
(:func:`~latentzoo.inference.rank_svm.vb.fit_vb`, whose approximate posterior is then sampled);
``predict_proba`` is the posterior predictive of :mod:`latentzoo.inference.rank_svm.predict` (new
samples' ranks inserted into the training order for the R variants). Works with ``clone``,
``get_params``/``set_params``, pipelines and cross-validation.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from latentzoo.inference.interrupts import interruptible
from latentzoo.inference.rank_svm.predict import predict_proba as _posterior_proba
from latentzoo.models.rank_factor_svm import VARIANTS, coarsen_ranks, rank_cuts

__all__ = ["RankFactorSVC", "align_signs"]

# the sites prediction reads, and those that flip sign with a factor (A_k, z_k, beta_k, mu_k)
_KEEP = ("A", "beta", "z", "tau", "mu", "psi", "nu")
_FLIP = ("A", "beta", "z", "mu")


def _check_X(X, what: str = "X") -> np.ndarray:
    X = np.asarray(X)
    if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        raise ValueError(f"{what} must be numeric, got dtype {X.dtype}.")
    if np.iscomplexobj(X):
        raise ValueError(f"{what} is complex; the model needs real numbers.")
    X = X.astype(float)
    if X.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (samples x features), got shape {X.shape}.")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{what} has an empty axis (shape {X.shape}).")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{what} contains {int(np.sum(~np.isfinite(X)))} NaN or infinite value(s).")
    return X


class RankFactorSVC(ClassifierMixin, BaseEstimator):
    """Max-margin rank-likelihood discriminative factor model as a binary classifier.

    Args:
        variant: ``"G-L"``, ``"R-L"``, ``"G-NL"`` or ``"R-NL"`` (Gaussian or rank likelihood of
            the features; one linear SVM or a DP mixture of them on the factor scores).
        K: number of factors. T: truncation of the DP mixture (NL).
        method: ``"gibbs"`` (MCMC) or ``"vb"`` (mean-field VB, sampled ``num_samples`` times).
        num_warmup, num_samples: Gibbs sweeps discarded and kept (VB: ``num_warmup`` is the
            maximum number of CAVI sweeps).
        seed: of the fit and of the predictions (which are reproducible for a fixed seed).
        priors: entries overriding :func:`~latentzoo.models.rank_factor_svm.default_priors`.
        levels: the R variants see each feature's values in at most this many groups of about
            equal size (cut at the training data's order statistics: :func:`rank_cuts`; None keeps
            every distinct value, the paper's model). Each adjacent pair's hinge is worth at most
            2ε nats while ordering hundreds of values costs the factors far more, so with all
            distinct values kept the loadings collapse to 0 on continuous features (breast
            cancer: held-out accuracy at chance); 16 groups keep them. A monotone transform of a
            column moves its cuts with it, so the invariance is kept.
        max_draws: posterior draws used for prediction (evenly spaced). num_sweeps, burn_in: the
            R variants' Gibbs sweeps per draw for a new sample's factors (see
            :func:`~latentzoo.inference.rank_svm.predict.new_sample_states`).
        progress: show the fit's progress bar (NumPyro's for Gibbs, the CAVI sweeps' for VB), after
            a line saying that XLA is compiling. (Ctrl-C while the bar moves raises
            ``KeyboardInterrupt`` within seconds; one pressed while XLA compiles takes effect
            when the compilation returns, since Python runs its handler only between bytecodes.)

    Any two class labels are accepted; ``classes_[1]`` is the positive class (+1 in the model).
    The G variants centre and scale each column inside the estimator (a constant column keeps
    scale 1); the R variants use only each column's order, so scaling would change nothing.

    Fitted attributes: ``classes_``, ``n_features_in_``, ``posterior_`` (the draws prediction
    uses, sign-aligned), ``loadings_`` (D, K) posterior mean of the loadings A and ``coef_``
    (T, K) of the classifier coefficients β on the factors (T = 1 for L). Each factor's sign is
    not identified ((A_k, z_k, β_k) and their negation have the same likelihood); every draw is
    aligned to the last one's signs before averaging. Factor order (and, for NL, component
    labels) are not aligned: within one chain they rarely switch.
    """

    def __init__(self, variant="R-L", K=10, T=5, method="gibbs", num_warmup=300, num_samples=300,
                 seed=0, priors=None, max_draws=100, num_sweeps=30, burn_in=15, levels=16,
                 progress=False):
        self.variant = variant
        self.K = K
        self.T = T
        self.method = method
        self.num_warmup = num_warmup
        self.num_samples = num_samples
        self.seed = seed
        self.priors = priors
        self.max_draws = max_draws
        self.num_sweeps = num_sweeps
        self.burn_in = burn_in
        self.levels = levels
        self.progress = progress

    # ------------------------------------------------------------------ validation (one place)
    def _check_settings(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"Unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}.")
        if self.method not in ("gibbs", "vb"):
            raise ValueError(f"Unknown method {self.method!r}; choose gibbs or vb.")
        for name in ("K", "T", "num_samples", "max_draws", "num_sweeps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if isinstance(self.num_warmup, bool) or not isinstance(self.num_warmup, (int, np.integer)) \
                or self.num_warmup < 0:
            raise ValueError(f"num_warmup must be a non-negative integer, got {self.num_warmup!r}.")
        if self.levels is not None and (isinstance(self.levels, bool) or not isinstance(
                self.levels, (int, np.integer)) or self.levels < 2):
            raise ValueError(f"levels must be None or an integer of at least 2, got {self.levels!r}.")
        if not 0 <= self.burn_in < self.num_sweeps:
            raise ValueError(f"burn_in must be at least 0 and below num_sweeps ({self.num_sweeps}), "
                             f"got {self.burn_in!r}.")

    def _check_fit_data(self, X, y):
        """(X float (N, D), y in {-1, +1} (N,), classes (2,)); ValueError naming the problem."""
        X = _check_X(X)
        if X.shape[0] < 2:
            raise ValueError(f"X has {X.shape[0]} row(s); at least 2 are needed.")
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError(f"y must hold one label per row of X ({X.shape[0]}), got shape {y.shape}.")
        if y.dtype.kind in "fc" and not np.all(np.isfinite(y)):
            raise ValueError(f"y contains {int(np.sum(~np.isfinite(y)))} NaN or infinite label(s).")
        classes = np.unique(y)
        if len(classes) < 2:
            raise ValueError(f"y has only one class ({classes[0]!r}); the classifier needs two.")
        if len(classes) > 2:
            raise ValueError(f"y has {len(classes)} classes; RankFactorSVC is a binary classifier "
                             "(wrap it in sklearn.multiclass.OneVsRestClassifier for more).")
        return X, np.where(y == classes[1], 1.0, -1.0), classes

    def _scaled(self, X):
        """The features the model sees: standardised (G) or coarsened ranks (R, ``levels``)."""
        if self.variant.startswith("G"):
            return (X - self.mean_) / self.scale_
        return X if self.cuts_ is None else coarsen_ranks(X, self.cuts_)

    # ---------------------------------------------------------------------------------- fit
    @interruptible
    def fit(self, X, y):
        """Fit the model to features X (N, D) and labels y (N,) with two classes."""
        self._check_settings()
        X, y_pm, self.classes_ = self._check_fit_data(X, y)
        self.n_features_in_ = X.shape[1]
        sd = X.std(0)
        self.mean_, self.scale_ = X.mean(0), np.where(sd > 0, sd, 1.0)
        self.cuts_ = None if self.variant.startswith("G") or self.levels is None \
            else rank_cuts(X, self.levels)
        Xs = self._scaled(X)
        if self.method == "gibbs":
            from latentzoo.inference.rank_svm import fit_gibbs

            mcmc = fit_gibbs(Xs, y_pm, variant=self.variant, K=int(self.K), T=int(self.T),
                             num_warmup=int(self.num_warmup), num_samples=int(self.num_samples),
                             seed=int(self.seed), priors=self.priors, progress=bool(self.progress))
            samples = mcmc.get_samples()
        else:
            samples = self._vb_draws(Xs, y_pm)
        self.posterior_ = align_signs({k: np.asarray(v) for k, v in samples.items() if k in _KEEP})
        self.X_fit_ = Xs  # the training order the new samples' ranks are inserted into
        self.loadings_ = self.posterior_["A"].mean(0)
        self.coef_ = self.posterior_["beta"].mean(0)
        return self

    def _vb_draws(self, Xs, y_pm) -> dict:
        import jax
        from numpyro.infer import Predictive

        from latentzoo.inference.rank_svm.vb import fit_vb
        from latentzoo.models.rank_factor_svm import observed_data

        fit = fit_vb(Xs, y_pm, variant=self.variant, K=int(self.K), T=int(self.T),
                     num_steps=max(int(self.num_warmup), 1), seed=int(self.seed), priors=self.priors,
                     progress_bar=bool(self.progress))
        data, kw = observed_data(Xs, y_pm, self.variant, self.priors)
        draws = Predictive(fit.guide, params=fit.params, num_samples=int(self.num_samples))
        return draws(jax.random.PRNGKey(int(self.seed) + 1), data, K=int(self.K), T=int(self.T),
                     priors=self.priors, **kw)

    # ----------------------------------------------------------------------------- predict
    @interruptible
    def _positive_probability(self, X) -> np.ndarray:
        check_is_fitted(self, "posterior_")
        X = _check_X(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but the classifier was fitted with "
                             f"{self.n_features_in_}.")
        return _posterior_proba(self.posterior_, self.X_fit_, self._scaled(X), variant=self.variant,
                                priors=self.priors, seed=int(self.seed),
                                max_draws=int(self.max_draws), num_sweeps=int(self.num_sweeps),
                                burn_in=int(self.burn_in))

    def predict_proba(self, X) -> np.ndarray:
        """(M, 2) posterior predictive probabilities of ``classes_[0]`` and ``classes_[1]``."""
        p = self._positive_probability(X)
        return np.stack([1.0 - p, p], 1)

    def decision_function(self, X) -> np.ndarray:
        """(M,) log-odds of ``classes_[1]`` (positive: predicted ``classes_[1]``)."""
        p = np.clip(self._positive_probability(X), 1e-15, 1.0 - 1e-15)
        return np.log(p) - np.log1p(-p)

    def predict(self, X) -> np.ndarray:
        """(M,) the more probable class of each row."""
        positive = self._positive_probability(X) > 0.5
        return self.classes_[positive.astype(int)]


def align_signs(draws: dict) -> dict:
    """Draws with each factor's sign flipped, draw by draw, to agree with the last draw's
    loadings (sign of the inner product of A[:, k]); the flip is applied to A, z, β and μ
    together, which leaves the likelihood and every prediction unchanged."""
    A = draws["A"]
    sign = np.sign(np.einsum("sdk,dk->sk", A, A[-1]))
    sign[sign == 0] = 1.0
    out = dict(draws)
    for name in _FLIP:
        if name in out:
            out[name] = out[name] * sign.reshape(sign.shape[:1] + (1,) * (out[name].ndim - 2) + sign.shape[1:])
    return out
