"""Geweke, SBC and conditional-consistency tests of every FA Gibbs update, with broken controls.

Thresholds: Geweke z-scores are Bonferroni-corrected at familywise level 0.01 over all first and
second moments (|z| < ~3.5 for 40 moments); SBC requires every chi-square p-value above 0.01/F.
The broken psi update (shape off by N/2) shifts psi's posterior by ~50%: it gives |z| > 50 and
p < 1e-100 at these seeds, so the same thresholds separate right from wrong by a wide margin.
"""

import jax
import numpy as np
import pytest

from latentzoo.inference.fa import gibbs as fa_gibbs
from latentzoo.inference.checks import check_conditional, geweke_test, sbc_runs
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.models.factor_analysis import factor_analysis

from .fa_fixtures import SMALL, TEST_FUNCTIONS, broken_psi_update, broken_scale_move, table_with


@pytest.mark.parametrize("update", fa_gibbs.fa_updates()[:4], ids=lambda u: u.name.split()[0])
def test_conditional_matches_joint_density(update):
    err = check_conditional(factor_analysis, update, SMALL, jax.random.PRNGKey(0))
    assert err < 1e-9


def test_conditional_check_catches_broken_update():
    err = check_conditional(factor_analysis, broken_psi_update(), SMALL, jax.random.PRNGKey(0))
    assert err > 1e-2


def _geweke(table, seed=1):
    kernel = ConjugateGibbs(factor_analysis, table)
    return geweke_test(
        factor_analysis, kernel, SMALL, TEST_FUNCTIONS, jax.random.PRNGKey(seed), num_steps=20000
    )


def test_geweke_passes_full_table():
    result = _geweke(fa_gibbs.fa_updates())
    assert result.passed, dict(zip(result.labels, np.round(result.z_scores, 2)))


def test_geweke_passes_without_interweaving():
    result = _geweke(fa_gibbs.fa_updates(interweave=False), seed=2)
    assert result.passed, dict(zip(result.labels, np.round(result.z_scores, 2)))


def test_geweke_fails_broken_psi_update():
    result = _geweke(table_with({"psi": broken_psi_update()}))
    assert not result.passed
    assert result.max_abs_z > 10 * result.threshold


def test_geweke_fails_broken_scale_move():
    result = _geweke(table_with({"scale": broken_scale_move()}))
    assert not result.passed


def test_sbc_passes_full_table_and_fails_broken_psi_update():
    # knob 0 is the full table exactly, knob 1 the broken psi update: one compiled program
    def kernel_of(knob):
        return ConjugateGibbs(factor_analysis, table_with({"psi": broken_psi_update(knob)}))

    good, bad = sbc_runs(factor_analysis, kernel_of, [0.0, 1.0], SMALL, TEST_FUNCTIONS,
                         jax.random.PRNGKey(3), num_simulations=200, num_warmup=50, num_draws=99,
                         thin=3)
    assert good.passed, dict(zip(good.labels, np.round(good.p_values, 4)))
    assert not bad.passed
    assert bad.p_values.min() < 1e-20
