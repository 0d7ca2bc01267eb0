"""Mutation score of the inference modules: plant one arithmetic mutant at a time, run the tests.

A mutant is one small ast-level change at one site inside a function body of a module under
``inference/`` (a swapped operator, a dropped term, a changed constant, a swapped index, a flipped
comparison, ``jnp.where`` reduced to one branch). Each mutant is written into a private copy of the
repository, the tests mapped to that module run against it, and the file is restored. A mutant
is *killed* when the tests fail (or hang past the per-mutant timeout), *survived* when they pass.
The score of a module is killed / mutants.

The copy is a ``git worktree`` of HEAD in a temporary directory (removed at the end) with its own
virtual environment holding an editable install of the copy, so ``latentzoo.inference`` resolves
to the mutated files (the package maps ``latentzoo.inference -> inference/`` and
``latentzoo.models -> models/``, which a plain PYTHONPATH would not reproduce); the script checks
that before the first mutant. Uncommitted edits in the working tree are not seen: commit first.

Mutants are sampled per module with a fixed seed, the hand-derived update and move functions of
each module (``FOCUS``) first and the operators interleaved, so the score is reproducible and a
small ``--max-mutants`` still covers the arithmetic that matters. Runtime is dominated by XLA
compilation: a killed mutant costs one compile of the first failing test, a survivor the whole
mapped test set. See docs/mutation_testing.md.

    python experiments/mutation_score.py --modules inference/fa/gibbs.py --max-mutants 10 \
        --json experiments/results/mutation_score.json
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass

# module -> test files that exercise it, fastest and most discriminating first (pytest -x stops at
# the first failure, so the order decides how much a killed mutant costs). Found by grepping tests/
# for the module and for the modules that import it.
TESTS = {
    "inference/fa/gibbs.py": [
        "tests/inference/test_update_checks.py",
        "tests/inference/test_mutation_gaps.py",
        "tests/inference/test_known_mutants.py",
        "tests/inference/test_fa_checks.py",
        "tests/inference/test_gibbs_builder.py",
        "tests/inference/test_ais.py",
        "tests/test_conformance.py",
    ],
    "inference/ta/gibbs.py": ["tests/inference/test_ta_gibbs.py", "tests/inference/test_ta_ais.py"],
    "inference/ta/moves.py": ["tests/inference/test_ta_gibbs.py", "tests/inference/test_ta_ais.py"],
    # the shift moves are checked by the registry-wide orbit and invariance checks
    "inference/ta/shift.py": ["tests/inference/test_update_checks.py", "tests/inference/test_ta_gibbs.py"],
    "inference/ta/mcem.py": ["tests/inference/test_ta_mcem.py"],
    "inference/mfa/em.py": ["tests/inference/test_mfa_em.py"],
    "inference/mfa/moves.py": ["tests/inference/test_update_checks.py", "tests/inference/test_mfa_gibbs.py"],
    "inference/mcem.py": ["tests/inference/test_mcem.py"],
    "inference/ais.py": ["tests/inference/test_ais.py", "tests/inference/test_ta_ais.py"],
    "inference/samplers/replica_exchange.py": ["tests/inference/test_replica_exchange.py"],
    "inference/cvq/moves.py": ["tests/inference/test_cvq_moves.py", "tests/inference/test_cvq_gibbs.py"],
    "inference/cvq/split_merge.py": ["tests/inference/test_cvq_split_merge.py"],
    "inference/ais_weights.py": ["tests/inference/test_ais.py", "tests/inference/test_ta_ais.py"],
    "inference/conjugate.py": [
        "tests/inference/test_mutation_gaps_core.py",
        "tests/inference/test_update_checks.py",
        "tests/inference/test_fa_vb.py",
        "tests/inference/test_fa_checks.py",
        "tests/inference/test_mfa_gibbs.py",
        "tests/inference/test_cvq_gibbs.py",
        "tests/inference/test_noca_mcmc.py",
    ],
    "inference/small_linalg.py": [
        "tests/inference/test_small_linalg.py",
        "tests/inference/test_rank_svm_gibbs.py",
    ],
    "inference/gaussian.py": [
        "tests/inference/test_mutation_gaps_core.py",
        "tests/inference/test_update_checks.py",
        "tests/inference/test_fa_vb.py",
        "tests/inference/test_fa_checks.py",
        "tests/inference/test_mfa_gibbs.py",
        "tests/inference/test_online_fa.py",
    ],
    "inference/cvq/gibbs.py": [
        "tests/inference/test_mutation_gaps_cvq.py",
        "tests/inference/test_update_checks.py",
        "tests/inference/test_cvq_gibbs.py",
    ],
    "inference/mfa/gibbs.py": [
        "tests/inference/test_update_checks.py",
        "tests/inference/test_mfa_gibbs.py",
        "tests/models/test_mfa.py",
    ],
    "inference/fa/vb.py": ["tests/inference/test_fa_vb.py", "tests/inference/test_cavi_driver.py"],
    "inference/fa/em.py": ["tests/inference/test_fa_vb.py", "tests/inference/test_cavi_driver.py"],
    "inference/cvq/em.py": ["tests/inference/test_cvq_em.py"],
    "inference/noca/em.py": ["tests/inference/test_mutation_gaps.py", "tests/inference/test_noca_em.py"],
    "inference/noca/bound.py": ["tests/inference/test_mutation_gaps.py", "tests/inference/test_noca_em.py",
                                "tests/inference/test_noca_fit.py"],
    "inference/noca/blocks.py": ["tests/inference/test_mutation_gaps.py", "tests/inference/test_noca_em.py",
                                 "tests/inference/test_noca_fit.py"],
    "inference/noca/mcmc.py": ["tests/inference/test_update_checks.py", "tests/inference/test_noca_mcmc.py"],
    "inference/noca/slice.py": ["tests/inference/test_noca_slice.py"],
    "inference/binary_draw.py": [
        "tests/inference/test_mutation_gaps_cvq.py",
        "tests/inference/test_noca_mcmc.py",
        "tests/inference/test_cvq_gibbs.py",
    ],
    "inference/fa/online_kernels.py": ["tests/inference/test_mutation_gaps.py", "tests/inference/test_online_fa.py"],
    "inference/fa/online.py": ["tests/inference/test_online_fa.py", "tests/cli/test_streaming_run.py"],
    "inference/fa/fit.py": ["tests/inference/test_fa_vb.py", "tests/cli/test_cli.py"],
    "inference/gibbs.py": [
        "tests/inference/test_gibbs_builder.py",
        "tests/inference/test_fa_checks.py",
        "tests/inference/test_parallel_chains.py",
    ],
    "inference/updates.py": [
        "tests/inference/test_update_checks.py",
        "tests/inference/test_gibbs_builder.py",
        "tests/inference/test_fa_checks.py",
    ],
    "inference/cavi.py": [
        "tests/inference/test_mutation_gaps_cavi.py",
        "tests/inference/test_cavi_driver.py",
        "tests/inference/test_fa_vb.py",
    ],
    "inference/cavi_blocks.py": ["tests/inference/test_cavi_driver.py", "tests/inference/test_fa_vb.py"],
    "inference/checks.py": [
        "tests/inference/test_update_checks.py",
        "tests/inference/test_fa_checks.py",
        "tests/test_conformance.py",
    ],
    "inference/enumerate.py": [
        "tests/inference/test_mutation_gaps_core.py",
        "tests/inference/test_cvq_gibbs.py",
        "tests/inference/test_cvq_em.py",
        "tests/inference/test_noca_em.py",
    ],
    "inference/validation.py": ["tests/inference/test_online_fa.py", "tests/inference/test_cvq_em.py"],
    # the conditional checks (fast, exact) run first; Geweke/SBC and the moves' orbit tests after
    "inference/rank_svm/gibbs.py": ["tests/inference/test_rank_svm_gibbs.py",
                                    "tests/inference/test_rank_svm_tempered.py"],
    "inference/rank_svm/hinge.py": ["tests/inference/test_rank_svm_tempered.py",
                                    "tests/inference/test_rank_svm_classifier_scale.py",
                                    "tests/inference/test_rank_svm_gibbs.py"],
    "inference/rank_svm/dp.py": ["tests/inference/test_rank_svm_gibbs.py",
                                 "tests/inference/test_rank_svm_tempered.py"],
    "inference/rank_svm/shrinkage.py": ["tests/inference/test_rank_svm_gibbs.py"],
    "inference/rank_svm/moves.py": ["tests/inference/test_rank_svm_gibbs.py"],
    "inference/rank_svm/classifier_scale.py": ["tests/inference/test_rank_svm_classifier_scale.py",
                                               "tests/inference/test_rank_svm_tempered.py",
                                               "tests/inference/test_rank_svm_gibbs.py"],
    "inference/rank_svm/rotation.py": ["tests/inference/test_rank_svm_rotation.py"],
    "inference/rank_svm/relabel.py": ["tests/inference/test_rank_svm_relabel.py"],
    "inference/conv_factor/shifts.py": ["tests/inference/test_conv_factor_gibbs.py"],
    "inference/conv_factor/gibbs.py": ["tests/inference/test_conv_factor_gibbs.py",
                                       "tests/inference/test_conv_factor_tempered.py"],
    "inference/conv_factor/joint_b.py": ["tests/inference/test_conv_factor_gibbs.py",
                                       "tests/inference/test_conv_factor_tempered.py"],
    "inference/conv_factor/element_move.py": ["tests/inference/test_conv_factor_element_move.py"],
    "inference/conv_factor/vb_moments.py": ["tests/inference/test_conv_factor_vb.py"],
    "inference/conv_factor/vb.py": ["tests/inference/test_conv_factor_vb.py"],
    "inference/conv_factor/restore.py": ["tests/inference/test_conv_factor_restore.py"],
}

# The hand-derived updates and moves of each module: mutants here are selected first.
FOCUS = {
    "inference/fa/gibbs.py": [
        "z_natural", "W_natural", "mu_conditional", "psi_conditional",
        "scale_step", "shift_step", "shear_step",
    ],
    "inference/fa/vb.py": ["cavi_z", "cavi_W", "cavi_mu", "cavi_psi", "cavi_elbo_terms", "z_moments", "sq_resid"],
    "inference/fa/em.py": ["em_e_step", "em_W_mu", "em_psi", "em_objective_terms"],
    "inference/rank_svm/hinge.py": ["lam_rate", "hinge_lam_law", "hinge_lam_draw", "hinge_log_marginal"],
    "inference/rank_svm/gibbs.py": ["lam_update", "_svm_terms", "z_row_precision",
                                    "z_update", "A_update", "beta_update", "tau_update"],
    "inference/rank_svm/classifier_scale.py": ["classifier_scale_log_target",
                                               "classifier_scale_move"],
    "inference/rank_svm/rotation.py": ["rotation_angle_law", "_rotate", "factor_rotation_move"],
    "inference/rank_svm/relabel.py": ["swap_components", "label_swap", "stick_swap",
                                      "_accept", "relabel_move"],
    "inference/rank_svm/dp.py": ["t_logits", "t_lam_update", "_counts", "nu_update", "alpha_update",
                                 "mu_update", "psi_update"],
    "inference/cvq/gibbs.py": ["_s_logits", "s_draw", "_W_natural", "_tau_conditional"],
    "inference/noca/mcmc.py": ["_log1mexp", "_s_prior_logs", "s_logits", "s_draw"],
    "inference/noca/slice.py": ["slice_step", "theta_log_density", "_theta_draw", "_log1mexp"],
    "inference/cvq/em.py": ["cvq_e_step", "cvq_m_step", "cvq_bound", "_entropy", "_state_log_joint"],
    "inference/noca/em.py": [
        "lam_update", "_q_grad", "q_update", "theta_update", "theta0_update", "exact_m_step",
        "solve_decreasing", "_solve_log", "prior_terms", "pi_update",
    ],
    "inference/mfa/gibbs.py": [
        "c_marginal_logits", "_z_natural", "_z_prior", "_component_precisions", "_W_natural",
        "_mu_conditional", "_psi_conditional", "_pi_conditional", "c_conditional",
    ],
    "inference/conjugate.py": [
        "gamma_precision_posterior", "normal_mean_posterior", "beta_bernoulli_posterior",
        "dirichlet_categorical_posterior", "gamma_moments", "gamma_entropy", "beta_log_moments",
        "dirichlet_log_moments", "normal_expected_log_prior", "gamma_expected_log_prior",
    ],
    "inference/small_linalg.py": [
        "cholesky", "solve_lower", "solve_upper", "cho_solve", "tril_inverse", "cholesky_of_inverse",
    ],
    "inference/gaussian.py": [
        "precision_solve", "mvn_from_precision", "gaussian_draw", "gaussian_block", "cov_from_tril",
        "gaussian_entropy",
    ],
    "inference/fa/online_kernels.py": [
        "latent_posterior", "posterior_means", "log_likelihood", "thesis_em_step", "_sga_gradients",
        "thesis_sga_step", "sga_batch_step", "em_batch_step", "em_finalize", "_factor_map",
    ],
    "inference/noca/bound.py": None,  # every function
    "inference/cvq/moves.py": None,  # every function
    "inference/cvq/split_merge.py": None,  # every function
    "inference/samplers/replica_exchange.py": ["swap_log_ratio", "swap_step", "adapt_ladder",
                                               "adaptation_ends",
                                               "_sample_one", "geometric_ladder"],
    "inference/ta/gibbs.py": ["group_natural", "collapsed_log_Z", "label_group_logits", "select_rows",
                              "_label_conditional", "_features", "_loadings_prior", "loadings_natural",
                              "_split_loadings", "_Psi_conditional", "_pi_conditional", "_group_basis"],
    "inference/ta/moves.py": None,
    "inference/conv_factor/shifts.py": ["_class_terms", "draw_maps_coloured", "draw_maps_parallel",
                                        "max_pool", "_pool_element", "scan_from_zero", "_set_class"],
    "inference/conv_factor/gibbs.py": ["residual", "b_logits", "_b_draw", "atom_natural", "_d_draw",
                                       "_gamma_conditional", "_precision_update"],
    "inference/conv_factor/joint_b.py": None,
    "inference/conv_factor/element_move.py": ["element_birth_log_ratio", "_step", "log_student",
                                              "atom_proposal_log_density", "_proposal_centres"],
    "inference/conv_factor/restore.py": ["impute_missing", "_chain"],
    "inference/ta/shift.py": None,
    "inference/mfa/em.py": ["_component_terms", "mfa_log_likelihood", "mfa_em_step"],
    "inference/mfa/moves.py": ["shift_orbit", "shift_natural", "_shift_step", "scale_orbit",
                               "scale_orbit_log_jacobian", "_scale_step"],
    # the MAP pseudo-counts and the exact E-step's statistics; the rest is plumbing
    "inference/noca/blocks.py": ["noca_log_prior", "read_noca_priors", "_hyper", "exact_statistics",
                                 "noca_data_init"],
    # the core's glue has no hand-derived algebra: every function, except where the numbers are
    "inference/cavi_blocks.py": ["coordinate_ascent", "expected_log_prior", "plan_blocks", "_BlockELBO", "_total"],
}

# Survivors judged equivalent (no input the code can receive changes behaviour), with the reason;
# they are left out of the score's denominator. Key: (module, function, original line, mutated
# line), both lines stripped, so a verdict survives unrelated edits that move the line.
EQUIVALENT = {
    ("inference/noca/slice.py", "slice_step",
     "go_right = go_right & (i < right_budget) & (log_f(right) > y)",
     "go_right = go_right & (i < right_budget) & ((log_f(right) >= y))"):
        "y is g0 minus a continuous exponential draw: log f(right) == y has probability 0",
    ("inference/noca/slice.py", "_theta_draw",
     "return jnp.where(jnp.isnan(g), -jnp.inf, g)",
     "return jnp.where(jnp.isnan(g), (jnp.inf), g)"):
        "g has no nan at any t the step reaches: the likelihood's terms are finite for finite "
        "t > 0 (log(1 - e^-z) floored, 0 * inf guarded), and NumPyro's priors give -inf, not nan, "
        "outside their support (checked: Beta(2, 2) at 1.5, Uniform(0, 0.4) at 0.9); the guard "
        "is for a user's prior that does not",
    ("inference/conv_factor/element_move.py", "element_birth_log_ratio",
     "maps, R_new = maps[0], R_new[0]", "maps, R_new = maps[0], R_new[(1)]"):
        "R_new has one image (axis of length 1), and JAX clamps an index past the end of an axis "
        "when it reads, so R_new[1] is R_new[0]",
    ("inference/ais.py", "beta_schedule",
     "s = 1.0 / (1.0 + np.exp(-np.linspace(-SIGMOID_WIDTH, SIGMOID_WIDTH, num_temps)))",
     "s = (-(1.0 / (1.0 + np.exp(-np.linspace(-SIGMOID_WIDTH, SIGMOID_WIDTH, num_temps)))))"):
        "the next line rescales s affinely to [0, 1], (s - s[0]) / (s[-1] - s[0]), which is "
        "unchanged when s is negated",
    ("inference/ais.py", "beta_schedule",
     "s = 1.0 / (1.0 + np.exp(-np.linspace(-SIGMOID_WIDTH, SIGMOID_WIDTH, num_temps)))",
     "s = 1.0 / (1.0 + np.exp((np.linspace(-SIGMOID_WIDTH, SIGMOID_WIDTH, num_temps))))"):
        "the grid is symmetric, so sigma(-g_i) = 1 - sigma(g_i), an affine map of s that the "
        "rescaling to [0, 1] removes",
    ("inference/rank_svm/classifier_scale.py", "classifier_scale_move",
     "accept = jnp.log(jax.random.uniform(k_acc)) < log_ratio",
     "accept = (jnp.log(jax.random.uniform(k_acc)) <= log_ratio)"):
        "u is a continuous uniform draw: log u == log_ratio has probability 0",
    ("inference/ta/moves.py", "_step",
     "accept = jnp.log(jax.random.uniform(k_acc, ll.shape, ll.dtype)) < ll_prop - ll",
     "accept = (jnp.log(jax.random.uniform(k_acc, ll.shape, ll.dtype)) <= ll_prop - ll)"):
        "u is a continuous uniform draw: log u == ll_prop - ll has probability 0",
    ("inference/mfa/moves.py", "_scale_step",
     "t_mode, sigma = scale_proposal(jnp.where(moved, a, 1.0), b, p)  # the Laplace proposal FA's move uses",
     "t_mode, sigma = scale_proposal(jnp.where(moved, a, (2.0)), b, p)  # the Laplace proposal FA's move uses"):
        "the placeholder only stands in where a column of W is all zeros (moved is False): the "
        "step's t is then 0 whatever the proposal, so any positive placeholder gives the same move",
    ("inference/mfa/em.py", "_component_terms",
     "r = X[None] - mu[:, None, :]  # (J, N, D)",
     "r = (-(X[None] - mu[:, None, :]))  # (J, N, D)"):
        "r enters the log-likelihood only through r * r and v * v; it flips the sign of the factor "
        "means, so the M-step returns -W with mu and Psi unchanged (S and XtZ transform by "
        "diag(-1, ..., -1, 1)): the model's W -> -W symmetry, the same likelihood at every iteration",
    ("inference/fa/gibbs.py", "scale_step",
     "accept = jnp.log(jax.random.uniform(k_acc, (K,))) < log_alpha",
     "accept = (jnp.log(jax.random.uniform(k_acc, (K,))) <= log_alpha)"):
        "u is a continuous uniform draw: log u == log alpha has probability 0",
    ("inference/cvq/gibbs.py", "s_draw",
     "new = (u < prob).astype(X.dtype)",
     "new = ((u <= prob)).astype(X.dtype)"):
        "u is a continuous uniform draw: u == prob has probability 0",
    ("inference/binary_draw.py", "single_site_scan",
     "new = (u < jax.nn.sigmoid(logit)).astype(s.dtype)",
     "new = ((u <= jax.nn.sigmoid(logit))).astype(s.dtype)"):
        "u is a continuous uniform draw: u == sigmoid(logit) has probability 0",
    ("inference/noca/em.py", "theta_update",
     "dg = seg(jnp.where(q > 0, lam_p * f2 / qs, 0.0)) + p2",
     "dg = seg(jnp.where((q >= 0), lam_p * f2 / qs, 0.0)) + p2"):
        "for q = 0, qs = Q_TINY = 1e-300 and theta >= THETA_MIN = 1e-8, so a_ >= 1e292 and "
        "f2(a_) = -(f1 + f1^2) is exactly 0 in float64: the term the mask removes is already 0",
    ("inference/noca/bound.py", "positive_terms",
     "return jnp.where(q > 0, q * (lam_p * on + (1.0 - lam_p) * off), 0.0)",
     "return (q * (lam_p * on + (1.0 - lam_p) * off))"):
        "where q = 0 the unmasked term is 0 * (finite): on = f(theta0 + theta / Q_TINY) = f(>= 1e292) "
        "= 0 and off = f(theta0) is finite, since every caller keeps theta0 >= THETA_MIN = 1e-8",
    ("inference/noca/bound.py", "noca_importance_loglik",
     "s = (jax.random.uniform(key, r.shape) < r).astype(X.dtype)  # (N, K)",
     "s = ((jax.random.uniform(key, r.shape) <= r)).astype(X.dtype)  # (N, K)"):
        "u is a continuous uniform draw: u == r has probability 0",
    ("inference/noca/blocks.py", "noca_data_init",
     "dist_ = 1.0 - np.where(union > 0, inter / np.maximum(union, 1.0), 1.0)",
     "dist_ = 1.0 - np.where(union > 0, inter / np.maximum(union, 1.0), (2.0))"):
        "union = 0 only when the seed and the row are both empty, i.e. every row is empty (seeds "
        "are drawn from non-empty rows otherwise); then every weight is <= 0 either way and the "
        "seed is drawn uniformly",
    ("inference/noca/blocks.py", "noca_data_init",
     "dist_ = 1.0 - np.where(union > 0, inter / np.maximum(union, 1.0), 1.0)",
     "dist_ = 1.0 - (inter / np.maximum(union, 1.0))"):
        "differs only when every row is empty (see above): the rows are then identical, so which "
        "ones seed the sources cannot change the start",
    ("inference/fa/online_kernels.py", "em_batch_step",
     "cols = new if lo == 0 else cols.at[:, lo:].set(new)",
     "cols = new if lo == (1) else cols.at[:, lo:].set(new)"):
        "lo = n_full * block is 0 or a multiple of block > 1, never 1; for lo == 0 both branches give new",
    ("inference/gaussian.py", "precision_solve",
     "mean = jsl.cho_solve((L, True), b[..., None])[..., 0]",
     "mean = jsl.cho_solve((L, True), b[..., None])[..., (1)]"):
        "the last axis has size 1 and JAX clamps an out-of-range static index: the same element",
    ("inference/gaussian.py", "gaussian_draw",
     "noise = jsl.solve_triangular(jnp.swapaxes(factor, -1, -2), eps[..., None], lower=False)[..., 0]",
     "noise = jsl.solve_triangular(jnp.swapaxes(factor, -1, -2), eps[..., None], lower=False)[..., (1)]"):
        "the last axis has size 1 and JAX clamps an out-of-range static index: the same element",
    ("inference/gaussian.py", "gaussian_draw",
     "return mean + eps @ factor  # rows: (L^{-T} e)ᵀ = eᵀ L^{-1}",
     "return (mean - eps @ factor)  # rows: (L^{-T} e)ᵀ = eᵀ L^{-1}"):
        "eps is standard normal, so -eps has the same law: the draw's distribution is unchanged "
        "(only which draw a given key yields)",
    ("inference/gibbs.py", "read_model",
     "tr = trace(substitute(seed(model, jax.random.PRNGKey(0)), data=values)).get_trace(",
     "tr = trace(substitute(seed(model, jax.random.PRNGKey((1))), data=values)).get_trace("):
        "the key only draws sites that values leaves out: sweeps, moves and checks pass every "
        "latent site, and the CAVI planner (empty values) reads only each site's family and "
        "whether it is observed, which no draw changes",
}

CORE = [
    "inference/gibbs.py", "inference/updates.py", "inference/cavi.py", "inference/conjugate.py",
    "inference/gaussian.py", "inference/small_linalg.py", "inference/checks.py", "inference/enumerate.py",
    "inference/binary_draw.py", "inference/cavi_blocks.py",
]
FAMILY_GLOBS = ["inference/fa/*.py", "inference/mfa/*.py", "inference/cvq/*.py", "inference/noca/*.py"]

PYTEST = ["-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider"]


# ----------------------------------------------------------------------------------------------
# Mutants
# ----------------------------------------------------------------------------------------------


@dataclass
class Mutant:
    module: str
    function: str  # qualified name of the enclosing function, e.g. "scale_step.log_target"
    line: int
    operator: str
    original: str  # the original source line(s)
    mutated: str  # the same line(s) after the mutation
    source: str = ""  # the whole mutated module (not written to JSON)

    def key(self):
        return f"{self.module}:{self.line} {self.operator}: {self.original.strip()} -> {self.mutated.strip()}"


BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div}
CMP_SWAP = {
    ast.Lt: [ast.LtE, ast.Gt], ast.LtE: [ast.Lt, ast.GtE], ast.Gt: [ast.GtE, ast.Lt],
    ast.GtE: [ast.Gt, ast.LtE], ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq],
}


def _is_number(node):
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    )


def _new_constant(v):
    if v == 0.5:
        return 1.0
    if v == 2:
        return 1 if isinstance(v, int) else 1.0
    if v == 1:
        return 2 if isinstance(v, int) else 2.0
    if v == 0:
        return 1 if isinstance(v, int) else 1.0
    return v + 1


def _is_where(node):
    f = node.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "where"
        and isinstance(f.value, ast.Name)
        and f.value.id in ("jnp", "np", "numpy")
        and len(node.args) == 3
        and not node.keywords
    )


def _is_index_name(node):
    """A variable used as an index (k, l, j, site): not a builtin or a class (``z[bool]``,
    ``sample[CAVIBlock]`` would be mutants that only fail to run)."""
    return (
        isinstance(node, ast.Name)
        and not hasattr(builtins, node.id)
        and not node.id[:1].isupper()
    )


def _index_names(slice_node):
    elts = slice_node.elts if isinstance(slice_node, ast.Tuple) else [slice_node]
    return [i for i, e in enumerate(elts) if _is_index_name(e)]


def _is_text(node):
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _skip_ids(func):
    """ids of nodes that are not arithmetic: docstring, annotations, strings, __all__."""
    skip = set()
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.update(id(n) for n in ast.walk(body[0]))
    for n in ast.walk(func):
        if isinstance(n, ast.AnnAssign) and n.annotation is not None:
            skip.update(id(m) for m in ast.walk(n.annotation))
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                skip.update(id(m) for m in ast.walk(n))
        if isinstance(n, (ast.JoinedStr, ast.Raise, ast.Assert)):  # messages and input checks
            skip.update(id(m) for m in ast.walk(n))
        if isinstance(n, ast.BinOp) and (_is_text(n.left) or _is_text(n.right)):  # building a message
            skip.update(id(m) for m in ast.walk(n))
        if isinstance(n, ast.keyword) and n.arg == "stacklevel":  # only where a warning points
            skip.update(id(m) for m in ast.walk(n))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and n is not func:
            for a in ast.walk(n.args):  # nested defaults and annotations
                if isinstance(a, ast.arg) and a.annotation is not None:
                    skip.update(id(m) for m in ast.walk(a.annotation))
            if not isinstance(n, ast.Lambda) and n.returns is not None:
                skip.update(id(m) for m in ast.walk(n.returns))
            if not isinstance(n, ast.Lambda):
                skip.update(id(m) for d in n.decorator_list for m in ast.walk(d))
    return skip


def _sites(func):
    """Yield (node, operator name, replacement expression) for every mutation site in func's body."""
    skip = _skip_ids(func)
    index_names = sorted(
        {
            s.slice.elts[i].id if isinstance(s.slice, ast.Tuple) else s.slice.id
            for s in ast.walk(func)
            if isinstance(s, ast.Subscript)
            for i in _index_names(s.slice)
        }
    )
    nodes = [n for stmt in func.body for n in ast.walk(stmt) if id(n) not in skip]
    for n in nodes:
        if isinstance(n, ast.BinOp):
            if type(n.op) in BINOP_SWAP:
                yield n, "binop_swap", ast.BinOp(n.left, BINOP_SWAP[type(n.op)](), n.right)
            if isinstance(n.op, ast.Pow):
                if not (_is_number(n.right) and n.right.value == 1):
                    yield n, "pow_to_1", ast.BinOp(n.left, ast.Pow(), ast.Constant(1))
            if isinstance(n.op, (ast.Add, ast.Sub)):
                yield n, "drop_term", n.left
                if isinstance(n.op, ast.Add):
                    yield n, "drop_term", n.right
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            if not _is_number(n.operand):  # -1.0 is a constant, mutated below
                yield n, "unary_minus_drop", n.operand
            else:
                yield n, "constant", ast.Constant(-_new_constant(n.operand.value))
        elif isinstance(n, ast.Constant) and _is_number(n):
            yield n, "constant", ast.Constant(_new_constant(n.value))
        elif isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in CMP_SWAP:
            for new in CMP_SWAP[type(n.ops[0])]:
                yield n, "compare_flip", ast.Compare(n.left, [new()], n.comparators)
        elif isinstance(n, ast.Call) and _is_where(n):
            yield n, "where_branch", n.args[1]
            yield n, "where_branch", n.args[2]
        elif isinstance(n, ast.Subscript) and len(index_names) >= 2:
            elts = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
            for i in _index_names(n.slice):
                for other in index_names:
                    if other == elts[i].id:
                        continue
                    new_elts = list(elts)
                    new_elts[i] = ast.Name(other, ast.Load())
                    new_slice = ast.Tuple(new_elts, ast.Load()) if isinstance(n.slice, ast.Tuple) else new_elts[0]
                    yield n, "swap_index", ast.Subscript(n.value, new_slice, n.ctx)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp):
            yield n.value, "unary_minus_add", ast.UnaryOp(ast.USub(), n.value)


def _functions(tree):
    """(qualified name, outermost name, node) for every function, nested ones included."""

    def visit(node, prefix, outer):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}.{child.name}" if prefix else child.name
                yield q, outer or child.name, child
                yield from visit(child, q, outer or child.name)
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}.{child.name}" if prefix else child.name, outer)
            else:
                yield from visit(child, prefix, outer)

    yield from visit(tree, "", None)


def _replace(src_bytes_lines, node, text):
    """Source with node's segment replaced by text (positions are utf-8 byte offsets)."""
    lines = src_bytes_lines
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    data = b"".join(lines)
    a = starts[node.lineno - 1] + node.col_offset
    b = starts[node.end_lineno - 1] + node.end_col_offset
    return (data[:a] + text.encode() + data[b:]).decode()


def generate_mutants(repo, module, rev="HEAD"):
    # HEAD's text, as in the copy: uncommitted edits of the working tree are not mutated
    src = run(["git", "-C", repo, "show", f"{rev}:{module}"]).stdout
    tree = ast.parse(src)
    blines = src.encode().splitlines(keepends=True)
    tlines = src.splitlines()
    base_dump = ast.dump(tree)
    out, seen = [], set()
    for qual, outer, func in _functions(tree):
        # a nested function's nodes are reached from the outer one; attribute them to the innermost
        for node, op, new in _sites(func):
            text = "(" + ast.unparse(ast.fix_missing_locations(copy.deepcopy(new))) + ")"
            mutated = _replace(blines, node, text)
            try:
                mtree = ast.parse(mutated)
            except SyntaxError:
                continue
            dump = ast.dump(mtree)
            if dump == base_dump or dump in seen:  # no-op, or the same mutant spelled otherwise
                continue
            seen.add(dump)
            mlines = mutated.splitlines()
            lo = node.lineno - 1
            n_lines = node.end_lineno - node.lineno + 1
            extra = len(mlines) - len(tlines)
            out.append(
                Mutant(
                    module, qual, node.lineno, op,
                    "\n".join(tlines[lo:lo + n_lines]),
                    "\n".join(mlines[lo:lo + n_lines + extra]),
                    mutated,
                )
            )
    # the innermost function owns a site: drop duplicates reported under the outer name
    best = {}
    for m in out:
        k = m.source
        if k not in best or m.function.count(".") > best[k].function.count("."):
            best[k] = m
    return [m for m in out if best[m.source] is m]


def select(mutants, module, max_mutants, only_functions, seed):
    """Seeded, operator-interleaved sample: focus functions first, then the rest of the module."""
    if only_functions:
        rx = re.compile(only_functions)
        mutants = [m for m in mutants if rx.search(m.function) or rx.search(m.function.split(".")[0])]
    focus = FOCUS.get(module)
    in_focus = lambda m: focus is None or m.function.split(".")[0] in focus  # noqa: E731
    rng = random.Random(seed * 1_000_003 + zlib.crc32(module.encode()))
    picked = []
    for group in ([m for m in mutants if in_focus(m)], [m for m in mutants if not in_focus(m)]):
        by_op = {}
        for m in group:
            by_op.setdefault(m.operator, []).append(m)
        queues = []
        for op in sorted(by_op):
            q = by_op[op][:]
            rng.shuffle(q)
            queues.append(q)
        rng.shuffle(queues)
        while any(queues) and (max_mutants is None or len(picked) < max_mutants):
            for q in queues:
                if q and (max_mutants is None or len(picked) < max_mutants):
                    picked.append(q.pop())
    return sorted(picked, key=lambda m: (m.line, m.operator))


# ----------------------------------------------------------------------------------------------
# Private copy
# ----------------------------------------------------------------------------------------------


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def make_copy(repo, work, venv, rev):
    copy_dir = os.path.join(work, "repo")
    run(["git", "-C", repo, "worktree", "add", "--detach", copy_dir, rev])
    # "python -m pip", not bin/pip: a copied venv keeps the original's path in bin/pip's shebang
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        print(f"creating venv {venv}", flush=True)
        run([sys.executable, "-m", "venv", venv])
        run([*pip, "install", "-q", "setuptools>=77"])
        run([*pip, "install", "-q", "-e", f"{copy_dir}[test]"])
    else:  # reused venv: repoint its editable install at this copy (one run per venv at a time)
        run([*pip, "install", "-q", "--no-deps", "-e", copy_dir])
    return copy_dir


def check_resolves(py, copy_dir):
    """latentzoo, latentzoo.inference and latentzoo.models must come from the copy (not executed
    beyond the package __init__ files, so a module that fails to import still gets its baseline)."""
    code = (
        "import importlib\n"
        "for n in ('latentzoo', 'latentzoo.inference', 'latentzoo.models'):\n"
        "    print(*importlib.import_module(n).__path__)"
    )
    p = subprocess.run([py, "-c", code], cwd=copy_dir, env=env_for(copy_dir), capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"cannot import latentzoo from the copy:\n{p.stderr}")
    real = os.path.realpath(copy_dir)
    # latentzoo's __path__ may hold the copy's root itself (a source checkout adds it, so that
    # latentzoo.models / latentzoo.inference resolve to the sibling folders)
    bad = [f for f in p.stdout.split()
           if os.path.realpath(f) != real and not os.path.realpath(f).startswith(real + os.sep)]
    if bad:
        raise SystemExit(f"imports do not resolve to the copy {copy_dir}: {bad}")


def env_for(copy_dir, jax_cache=None):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a same-size mutant in the same second must not hit a stale .pyc
    env.setdefault("JAX_PLATFORMS", "cpu")
    if jax_cache:  # tests/conftest.py keeps a JAX_COMPILATION_CACHE_DIR that is already set
        env["JAX_COMPILATION_CACHE_DIR"] = jax_cache
    return env


def private_cache(work):
    """A copy of the test suite's JAX compilation cache (tests/conftest.py) for this run.

    The unmutated programs of a mutant's tests (the model, the other updates, the harness) load
    from it instead of compiling, which cuts a run several-fold; the mutated programs are written
    to the copy only, so the user's cache does not fill with programs that exist nowhere else.
    Removed with the rest of the work folder.
    """
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    src = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(home, "latentzoo", "jax")
    dst = os.path.join(work, "jax-cache")
    if os.path.isdir(src):
        shutil.copytree(src, dst)
    else:
        os.makedirs(dst)
    return dst


def run_tests(py, copy_dir, tests, timeout, jax_cache=None):
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [py, *PYTEST, *tests], cwd=copy_dir, env=env_for(copy_dir, jax_cache), capture_output=True,
            text=True, timeout=timeout, start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        _kill_group(e)
        return "timeout", time.monotonic() - t0, ""
    tail = (p.stdout + p.stderr).strip().splitlines()
    return ("passed" if p.returncode == 0 else "failed"), time.monotonic() - t0, "\n".join(tail[-3:])


def _kill_group(exc):
    # subprocess.run kills the child on timeout; with start_new_session its group is its pid
    pid = getattr(getattr(exc, "process", None), "pid", None)
    if pid:
        try:
            os.killpg(pid, 9)
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------


def default_modules(repo, rev):
    tracked = run(["git", "-C", repo, "ls-tree", "-r", "--name-only", rev, "inference"]).stdout.split()
    mods = list(CORE)
    for g in FAMILY_GLOBS:
        mods += sorted(p for p in tracked if fnmatch.fnmatch(p, g) and not p.endswith("__init__.py"))
    return mods


def _ident(rec):
    """A mutant's identity across runs: where and what, not the line number (edits move it)."""
    return (rec["module"], rec["function"], rec["operator"], rec["original"].strip(), rec["mutated"].strip())


def survivors_of(path):
    """module -> identities of the mutants that survived or timed out in a results file
    (equivalents excluded): a timeout on a loaded machine may be a slow survivor."""
    with open(path) as f:
        old = json.load(f)
    out = {}
    for mod, e in old["modules"].items():
        for m in e.get("mutants", []):
            if m["result"] in ("survived", "timeout") and not m.get("equivalent"):
                out.setdefault(mod, set()).add(_ident(m))
    return out


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=os.path.dirname(here), help="repository (its HEAD is copied)")
    ap.add_argument("--modules", nargs="+", help="modules under inference/ (default: core and families)")
    ap.add_argument("--tests", nargs="+", help="test files for every module (overrides the mapping)")
    ap.add_argument("--max-test-files", type=int, help="run only the first N mapped test files (quick run)")
    ap.add_argument("--max-mutants", type=int, default=10, help="per module; 0 = all")
    ap.add_argument("--only-functions", help="regex of function names to mutate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, help="seconds per mutant (default: 3 x baseline + 120)")
    ap.add_argument("--venv", help="reuse (or create) this venv instead of a temporary one; "
                                   "parallel runs need one each")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--merge", action="store_true",
                    help="merge into the --json file: replace the modules measured now, keep the others")
    ap.add_argument("--rerun-survivors", metavar="JSON",
                    help="run only the mutants that survived in this results file (after adding tests); "
                         "with --merge their new outcomes replace the old ones in the --json file")
    ap.add_argument("--merge-from", nargs="+", metavar="JSON",
                    help="run nothing: merge these results files (of parallel runs) into the --json file")
    ap.add_argument("--report", metavar="JSON",
                    help="run nothing: print the table of a results file (with --markdown, as in the docs)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--no-cache", action="store_true",
                    help="compile everything afresh instead of starting from a copy of the tests' JAX cache")
    ap.add_argument("--list", action="store_true", help="only list the selected mutants")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print_table(json.load(f), markdown=args.markdown)
        return 0
    if (args.merge or args.merge_from) and not args.json:
        ap.error("--merge and --merge-from need --json")
    if args.merge_from:
        merged = None
        for path in args.merge_from:
            with open(path) as f:
                merged = merge(args.json, json.load(f))
            _write(args.json, merged)
        print_table(merged)
        return 0

    repo = os.path.abspath(args.repo)
    rev = run(["git", "-C", repo, "rev-parse", "HEAD"]).stdout.strip()  # fixed: HEAD may move meanwhile
    wanted = survivors_of(args.rerun_survivors) if args.rerun_survivors else None
    modules = args.modules or (sorted(wanted) if wanted is not None else default_modules(repo, rev))
    max_m = None if args.max_mutants == 0 else args.max_mutants
    plan = {}
    for mod in modules:
        tests = args.tests or TESTS.get(mod)
        if tests and args.max_test_files and not args.tests:
            tests = tests[: args.max_test_files]
        if not tests:
            print(f"{mod}: no tests mapped (add it to TESTS or pass --tests); skipped", flush=True)
            continue
        allm = generate_mutants(repo, mod, rev)
        if wanted is not None:
            ids = wanted.get(mod, set())
            chosen = [m for m in allm if _ident(asdict(m)) in ids]
            missing = len(ids) - len({_ident(asdict(m)) for m in chosen})
            if missing:
                print(f"{mod}: {missing} survivor(s) no longer generated (the code changed); not rerun", flush=True)
            if not chosen:
                continue
        else:
            chosen = select(allm, mod, max_m, args.only_functions, args.seed)
        plan[mod] = (tests, len(allm), chosen)
    if args.list:
        for mod, (tests, n, ms) in plan.items():
            print(f"== {mod}: {len(ms)} of {n} mutants; tests {' '.join(tests)}")
            for m in ms:
                print(f"  {m.line:4d} {m.function:28s} {m.operator:16s} {m.original.strip()}  ->  {m.mutated.strip()}")
        return 0

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the copy when killed
    work = tempfile.mkdtemp(prefix="mutation-")
    venv = os.path.abspath(args.venv) if args.venv else os.path.join(work, "venv")
    copy_dir = None
    settings = {"repo_head": rev, "seed": args.seed, "max_mutants": args.max_mutants,
                "only_functions": args.only_functions, "max_test_files": args.max_test_files}
    results = {"rerun": args.rerun_survivors is not None, "modules": {}}

    def save():
        if args.json:
            _write(args.json, merge(args.json, results) if args.merge else results)

    try:
        copy_dir = make_copy(repo, work, venv, rev)
        jax_cache = None if args.no_cache else private_cache(work)
        py = os.path.join(venv, "bin", "python")
        check_resolves(py, copy_dir)
        baselines = {}
        for mod, (tests, n_all, mutants) in plan.items():
            target = os.path.join(copy_dir, mod)
            original = open(target, encoding="utf-8").read()
            key = tuple(tests)  # modules mapped to the same tests share one baseline run
            if key not in baselines:
                baselines[key] = run_tests(py, copy_dir, tests, None, jax_cache)
            status, base_t, tail = baselines[key]
            print(f"== {mod}: baseline {status} in {base_t:.0f}s; {len(mutants)} of {n_all} mutants", flush=True)
            entry = {"tests": tests, "candidates": n_all, "baseline_seconds": round(base_t, 1),
                     "run": dict(settings), "mutants": []}
            results["modules"][mod] = entry
            if status != "passed":
                entry["baseline_failed"] = tail
                print(f"   baseline fails, module skipped:\n{tail}", flush=True)
                continue
            # generous: on a shared machine the load, hence a run's time, varies several-fold
            timeout = args.timeout or 3 * base_t + 120
            for m in mutants:
                try:
                    with open(target, "w", encoding="utf-8") as f:
                        f.write(m.source)
                    outcome, secs, tail = run_tests(py, copy_dir, tests, timeout, jax_cache)
                finally:
                    with open(target, "w", encoding="utf-8") as f:
                        f.write(original)
                verdict = {"failed": "killed", "timeout": "timeout", "passed": "survived"}[outcome]
                rec = {k: v for k, v in asdict(m).items() if k != "source"}
                rec.update(result=verdict, seconds=round(secs, 1), repo_head=rev)
                entry["mutants"].append(rec)
                print(f"   {verdict:8s} {secs:5.0f}s  {m.key()}", flush=True)
            summarise(entry)
            save()
    finally:
        if copy_dir:
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", copy_dir], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    save()
    print_table(merge(args.json, results) if args.merge else results)
    return 0


def summarise(entry):
    """Counts and score of a module entry; survivors listed in EQUIVALENT are marked and left out
    of the denominator (score = killed (timeouts included) / non-equivalent mutants)."""
    ms = entry["mutants"]
    for m in ms:
        m.pop("equivalent", None)
        reason = EQUIVALENT.get(_ident(m)[:2] + _ident(m)[3:])
        if m["result"] in ("survived", "timeout") and reason:  # a timeout of an equivalent: load
            m["equivalent"] = reason
    k = sum(m["result"] == "killed" for m in ms)
    t = sum(m["result"] == "timeout" and not m.get("equivalent") for m in ms)
    s = sum(m["result"] == "survived" for m in ms)
    eq = sum(bool(m.get("equivalent")) for m in ms)
    entry.update(n=len(ms), killed=k, timed_out=t, survived=s, equivalent=eq,
                 score=round((k + t) / (len(ms) - eq), 3) if len(ms) > eq else None)
    return entry


def merge(path, results):
    """The results file at ``path`` with the modules of ``results`` (one run's) in it.

    A full run replaces a module's entry. A rerun of survivors (``results["rerun"]``) replaces
    only the rerun mutants' records (the old outcome is kept as ``was``) and recounts the module; the module keeps its
    original run settings and lists the commits of its reruns.
    """
    try:
        with open(path) as f:
            old = json.load(f)
    except FileNotFoundError:
        old = {"modules": {}}
    out = copy.deepcopy(old)
    out.pop("rerun", None)
    out.setdefault("modules", {})
    for mod, new in results["modules"].items():
        prev = out["modules"].get(mod)
        if not results.get("rerun") or prev is None or "mutants" not in prev:
            out["modules"][mod] = new
            continue
        if "baseline_failed" in new:  # nothing was rerun: keep the old outcomes
            continue
        fresh = {_ident(m): m for m in new["mutants"]}
        for i, m in enumerate(prev["mutants"]):
            if _ident(m) in fresh:
                rec = dict(fresh[_ident(m)])
                rec["was"] = m["result"]
                prev["mutants"][i] = rec
        heads = prev.setdefault("reruns", [])
        if new["run"]["repo_head"] not in heads:
            heads.append(new["run"]["repo_head"])
        prev["rerun_tests"] = new["tests"]
        prev.pop("to_remeasure", None)
        summarise(prev)
    for e in out["modules"].values():  # verdicts added to EQUIVALENT since a module was measured
        if "mutants" in e and "n" in e:
            summarise(e)
    return out


def _write(path, results):
    """Write atomically: a killed run must not leave half a results file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def print_table(results, markdown=False):
    rows = [(mod, e) for mod, e in results["modules"].items() if "n" in e]
    if markdown:
        return print_markdown(rows)
    print(f"\n{'module':34s} {'mutants':>7s} {'killed':>6s} {'equiv':>5s} {'survived':>8s} {'timeout':>7s} "
          f"{'score':>6s}")
    for mod, e in rows:
        score = "-" if e["score"] is None else f"{e['score']:.2f}"
        flag = "  (to re-measure)" if e.get("to_remeasure") else ""
        print(f"{mod:34s} {e['n']:7d} {e['killed']:6d} {e.get('equivalent', 0):5d} {e['survived']:8d} "
              f"{e['timed_out']:7d} {score:>6s}{flag}")
    tot = sum(e["n"] - e.get("equivalent", 0) for _, e in rows)
    if tot:
        dead = sum(e["killed"] + e["timed_out"] for _, e in rows)
        print(f"{'total (equivalents excluded)':34s} {tot:7d} {dead:6d} {'':5s} {tot - dead:8d} {'':7s} "
              f"{dead / tot:6.2f}")
    surv = [(mod, m) for mod, e in rows for m in e["mutants"] if m["result"] == "survived"]
    if surv:
        print("\nsurviving mutants:")
        for mod, m in surv:
            eq = f"  [equivalent: {m['equivalent']}]" if m.get("equivalent") else ""
            print(f"  {mod}:{m['line']} [{m['function']}] {m['operator']}{eq}\n"
                  f"    - {m['original'].strip()}\n    + {m['mutated'].strip()}")


def print_markdown(rows):
    """The per-module table of docs/mutation_testing.md."""
    print("| module | mutants | killed | equivalent | survived (not equivalent) | score | commit | tests run |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mod, e in sorted(rows):
        eq = e.get("equivalent", 0)
        score = "–" if e["score"] is None else f"{e['score']:.2f}"
        if e.get("to_remeasure"):
            score += " (to re-measure)"
        heads = [e["run"]["repo_head"][:7]] + [h[:7] for h in e.get("reruns", [])]
        tests = e.get("rerun_tests") or e["tests"]
        names = ", ".join(t.rsplit("/", 1)[-1].removesuffix(".py") for t in tests)
        print(f"| `{mod}` | {e['n']} | {e['killed'] + e['timed_out']} | {eq} | "
              f"{e['n'] - e['killed'] - e['timed_out'] - eq} | "
              f"{score} | {' + '.join(heads)} | {names} |")
    tot = sum(e["n"] - e.get("equivalent", 0) for _, e in rows)
    dead = sum(e["killed"] + e["timed_out"] for _, e in rows)
    if tot:
        print(f"| **total** | {sum(e['n'] for _, e in rows)} | {dead} | "
              f"{sum(e.get('equivalent', 0) for _, e in rows)} | {tot - dead} | {dead / tot:.2f} | | |")


if __name__ == "__main__":
    sys.exit(main())
