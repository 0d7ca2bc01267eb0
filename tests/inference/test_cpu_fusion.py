"""The per-program XLA option of the streaming kernels: applied where it exists, same numbers,
a jaxlib without it compiles plainly."""

from __future__ import annotations

import re

import numpy as np
import pytest

import jax.numpy as jnp

from latentzoo.inference import cpu_fusion
from latentzoo.inference.fa.online import OnlineFactorAnalysis

pytestmark = pytest.mark.smoke  # the option's name and values are the jaxlib's, so every version


def _library_fusions(compiled_text: str) -> list[str]:
    """op_name of every fusion XLA handed to its CPU library (``kind=kCustom``)."""
    return re.findall(r"= \S+ fusion\(.*kind=kCustom.*op_name=\"([^\"]+)\"", compiled_text)


def _reduce_and_dot(x, a):
    return jnp.sum(jnp.exp(x) * 2.0 + 1.0, axis=0), x @ a


def test_the_tuned_program_hands_only_matrix_products_to_the_library():
    if not cpu_fusion.dot_only_fusion_enabled():
        pytest.skip("this backend or jaxlib has no such option")
    f = cpu_fusion.jit_dot_only_fusion(_reduce_and_dot)
    args = (jnp.ones((128, 4096)), jnp.ones((4096, 8)))
    plain = _library_fusions(f.plain.lower(*args).compile().as_text())
    tuned = _library_fusions(f.tuned.lower(*args).compile().as_text())
    if all(name.endswith("dot_general") for name in plain):
        pytest.skip("this jaxlib hands only matrix products to its library anyway")
    # the default also hands over the reduction; with the option only the product goes
    assert tuned and all(name.endswith("dot_general") for name in tuned), tuned


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("LATENTZOO_XLA_DOT_ONLY_FUSION", "0")
    assert not cpu_fusion.dot_only_fusion_enabled()


def test_a_jaxlib_without_the_option_compiles_plainly(monkeypatch):
    # an option this jaxlib does not know is refused at compile time (not an abort): the probe
    # says no, and a wrapped function made then runs as plain jax.jit
    monkeypatch.setattr(cpu_fusion, "DOT_ONLY_FUSION", {"xla_cpu_no_such_option_here": "1"})
    assert not cpu_fusion.dot_only_fusion_enabled()
    f = cpu_fusion.jit_dot_only_fusion(_reduce_and_dot)
    out = f(jnp.ones((4, 8)), jnp.ones((8, 2)))
    np.testing.assert_allclose(np.asarray(out[1]), 8.0)


@pytest.mark.parametrize("method", ["em", "sga"])
def test_online_fa_fits_the_same_model_with_and_without_it(method, monkeypatch):
    # the option changes which loops XLA fuses, not the arithmetic: same fit to round-off, on
    # blocks of features (2 blocks and a tail) and a ragged last batch
    rng = np.random.default_rng(3)
    X = rng.standard_normal((45, 6)) @ rng.standard_normal((6, 2500)) + rng.standard_normal((45, 2500))
    fits = []
    for flag in ("1", "0"):
        monkeypatch.setenv("LATENTZOO_XLA_DOT_ONLY_FUSION", flag)
        m = OnlineFactorAnalysis(3, method=method, batch_size=8, warmup=8, block_size=1024,
                                 random_state=0).fit(X)
        fits.append((m.components_, m.noise_variance_, m.mean_))
    for tuned, plain in zip(*fits):
        np.testing.assert_allclose(tuned, plain, rtol=1e-9, atol=1e-12)
