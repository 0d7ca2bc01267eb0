"""MFA's summary quantities are invariant to relabelling the components (so their R-hat means
something) and are what they say: the trace of the mixture's covariance, computed densely here."""

import numpy as np

from latentzoo.families.mfa import MFA, mixture_summaries


def _draws(seed=0, J=3, D=4, K=2):
    rng = np.random.default_rng(seed)
    return (rng.dirichlet(np.ones(J), size=(2, 5)), rng.normal(size=(2, 5, J, D, K)),
            rng.normal(size=(2, 5, J, D)), rng.gamma(2.0, size=(2, 5, D)))


def test_summaries_do_not_change_when_the_components_are_relabelled():
    pi, W, mu, psi = _draws()
    before = mixture_summaries(pi, W, mu, psi)
    perm = [2, 0, 1]
    after = mixture_summaries(pi[..., perm], W[..., perm, :, :], mu[..., perm, :], psi)
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-12, err_msg=name)
    # a wrong summary (the unsorted weights) is not invariant: the test can fail
    assert not np.allclose(pi[..., perm], pi)


def test_summaries_are_the_mixture_moments():
    pi, W, mu, psi = _draws(1)
    got = mixture_summaries(pi, W, mu, psi)
    i = (1, 3)
    cov = sum(pi[i][j] * (W[i][j] @ W[i][j].T + np.diag(1 / psi[i]) + np.outer(mu[i][j], mu[i][j]))
              for j in range(3))
    m = pi[i] @ mu[i]
    np.testing.assert_allclose(got["mixture_mean"][i], m, rtol=1e-12)
    np.testing.assert_allclose(got["mixture_total_variance"][i], np.trace(cov - np.outer(m, m)), rtol=1e-12)
    np.testing.assert_allclose(got["weights_sorted"][i], np.sort(pi[i])[::-1])
    assert set(got) <= set(MFA.identified)  # the summary and the rank plot show them
