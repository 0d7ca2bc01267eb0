"""Row sharding on several devices of one process (latentzoo.inference.distributed).

The device count must be set before JAX starts, so the four-device checks run in one fresh
interpreter with ``--xla_force_host_platform_device_count=4`` (one script: compiling is most of
the time). There, FA's Gibbs sweep, EM, CAVI and online FA's default EM on rows split over four
devices are held to the one-device runs of the zoo's own entry points (``MCMC``,
``fit_fa_variational``, ``OnlineFactorAnalysis``) to 1e-9. The multi-process checks are in
test_distributed_processes.py; the environment and helper checks below run here, on one device.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from latentzoo.inference.distributed import (
    DistributedSetupError,
    failure_sentence,
    initialize_from_env,
    local_rows,
    read_process_env,
    row_mesh,
    shard_rows,
    stream_order,
)

_FOUR_DEVICES = textwrap.dedent("""
    import functools
    import jax, numpy as np
    import latentzoo
    from numpyro.infer import MCMC
    from latentzoo.models.factor_analysis import factor_analysis, default_fa_data
    from latentzoo.inference.cavi import CAVI
    from latentzoo.inference.gibbs import ConjugateGibbs
    from latentzoo.inference.fa import fa_updates, fa_em, fa_cavi, fit_fa_variational, OnlineFactorAnalysis
    from latentzoo.inference.fa import online_kernels as kern
    from latentzoo.inference.fa.em import em_init
    from latentzoo.inference.fa.vb import read_fa_priors
    from latentzoo.inference.distributed import (row_mesh, shard_rows, gather, sharded_gibbs,
                                                 fit_sharded, ShardedStream)
    assert jax.device_count() == 4, jax.devices()
    mesh = row_mesh()
    X = default_fa_data(0, N=48, D=5, K=2)

    def close(a, b, what):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, (what, a.shape, b.shape)
        err = float(np.max(np.abs(a - b)))
        assert err <= 1e-9, (what, err)

    # Gibbs: 3 warm-up sweeps and 5 draws, interweaving moves on; MCMC on one device is the truth
    mcmc = MCMC(ConjugateGibbs(factor_analysis, fa_updates()), num_warmup=3, num_samples=5,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(7), X, K=2)
    draws = sharded_gibbs(ConjugateGibbs(factor_analysis, fa_updates()), jax.random.PRNGKey(7), X,
                          mesh=mesh, num_samples=5, num_warmup=3, K=2)
    assert len(draws.samples["z"].sharding.device_set) == 4
    assert draws.samples["z"].sharding.spec == jax.sharding.PartitionSpec(None, "rows")
    assert draws.samples["W"].sharding.is_fully_replicated
    got = gather(draws.samples)
    ref = mcmc.get_samples()
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    for k in ref:
        close(got[k], ref[k], "gibbs " + k)
    print("GIBBS-OK")

    # EM and CAVI through the CAVI driver: every parameter and the objective trace
    for method, make in (("em", fa_em), ("vb", fa_cavi)):
        one = fit_fa_variational(X, 2, method=method, num_steps=15, seed=3)
        fa = make()
        four = fit_sharded(CAVI(factor_analysis, fa.guide, fa.algorithm, on_decrease="raise"),
                           jax.random.PRNGKey(3), 15, X, mesh=mesh, K=2, priors=None, rtol=1e-9)
        assert four.params["z_loc"].sharding.spec == jax.sharding.PartitionSpec("rows")
        assert len(four.params["z_loc"].sharding.device_set) == 4
        p = gather(four.params)
        assert set(p) == set(one.params)
        for k in p:
            close(p[k], one.params[k], method + " " + k)
        np.testing.assert_allclose(np.asarray(four.losses), np.asarray(one.losses), rtol=1e-12)
    # the start a multi-process run passes (traced by JAX, no host copy of the data)
    em = fa_em()
    init = lambda key, X, K, **_: em_init(key, X, read_fa_priors(factor_analysis, X, K=K), K=K)
    traced = fit_sharded(CAVI(factor_analysis, em.guide, em.algorithm), jax.random.PRNGKey(3), 15, X,
                         mesh=mesh, init=init, K=2, priors=None, rtol=1e-9)
    one = fit_fa_variational(X, 2, method="em", num_steps=15, seed=3)
    for k, v in gather(traced.params).items():
        close(v, one.params[k], "em init= " + k)
    print("CAVI-OK")

    # CVQ's variational and exact EM (the zoo's fit_cvq on one device is the truth) and NOCA's
    # exact MAP-EM (its recipe on a one-device mesh: fit_noca adds re-seeding rounds)
    from latentzoo.models.cvq import cvq
    from latentzoo.models.noca import noca
    from latentzoo.inference.cvq.em import fit_cvq, cvq_vem, cvq_exact_em, cvq_guide
    from latentzoo.inference.noca.blocks import noca_exact_em, noca_guide
    Xc = np.random.default_rng(0).normal(size=(48, 6))
    for method, algo in (("vb", cvq_vem()), ("em", cvq_exact_em())):
        one = fit_cvq(Xc, 2, method=method, num_steps=15, seed=3)
        four = fit_sharded(CAVI(cvq, cvq_guide, algo), jax.random.PRNGKey(3), 15, Xc, mesh=mesh,
                           K=2, rtol=1e-9)
        for k, v in gather(four.params).items():
            close(v, one.params[k], "cvq " + method + " " + k)
    B = (np.random.default_rng(1).random((48, 6)) < 0.3).astype(float)
    runs = [gather(fit_sharded(CAVI(noca, noca_guide, noca_exact_em()), jax.random.PRNGKey(3), 15, B,
                               mesh=m, K=2, num_pos=int(B.sum()), priors=None, rtol=1e-7).params)
            for m in (row_mesh(jax.devices()[:1]), mesh)]
    for k in runs[0]:
        close(runs[1][k], runs[0][k], "noca em " + k)
    # NOCA's variational MAP-EM, 15 full sweeps (rtol 0), on data with two sources over six
    # items. Measured, 4 devices against 1: theta 8.9e-8, lam 7.3e-8, theta0 5.5e-9, pi 4.4e-9,
    # q 8e-20, the bound 1.7e-7 of 140.6 apart: the same fit to round-off, amplified over the
    # sweeps' iterative M-step solves to ~1e-7 (the exact EM above, with closed-form sums, stays
    # at 1e-10; where the variational path gains the extra digits is not pinned down). A sweep
    # that skipped the all-reduce would move them by O(1). So the parameters are held to 1e-6
    # and q to 1e-9 wherever an item has an open gate (max theta over parents > 1e-6). On data
    # without structure (B above) every gate goes to its floor (1e-8) and q, each 1's split over
    # the parents, is then a ratio of two 1e-8-sized numbers that the last bits decide (0.56
    # apart, with the bound 3e-8 apart): not identified, so not compared.
    from latentzoo.inference.noca.blocks import noca_vem, positive_index
    from latentzoo.models.noca import simulate_noca
    B = simulate_noca(np.where(np.kron(np.eye(2), np.ones(3)) > 0, 2.3, 0.05), np.full(6, 0.05),
                      np.full(2, 0.4), 48, np.random.default_rng(2))[0]
    vb = [gather(fit_sharded(CAVI(noca, noca_guide, noca_vem()), jax.random.PRNGKey(3), 15, B,
                             mesh=m, K=2, num_pos=int(B.sum()), priors=None, rtol=0.0).params)
          for m in (row_mesh(jax.devices()[:1]), mesh)]
    for k in ("pi_loc", "theta_loc", "theta0_loc", "lam"):
        err = float(np.max(np.abs(np.asarray(vb[1][k]) - np.asarray(vb[0][k]))))
        assert err <= 1e-6, ("noca vb " + k, err)
    item = np.asarray(positive_index(jax.numpy.asarray(B), int(B.sum()))[1])
    gate_open = np.asarray(vb[0]["theta_loc"]).max(0)[item] > 1e-6
    assert gate_open.sum() > 0.5 * len(item), (gate_open.sum(), len(item))  # not vacuous
    close(np.asarray(vb[1]["q"])[gate_open], np.asarray(vb[0]["q"])[gate_open], "noca vb q")
    print("BINARY-EM-OK")

    # online FA, default EM: two chunks, the second not a multiple of the batch
    ofa = OnlineFactorAnalysis(2, batch_size=8, warmup=8, averaging_start=16, random_state=5)
    ofa.partial_fit(X[:24]).partial_fit(X[24:44])
    step = functools.partial(kern.em_batch_step, warmup=8, sa_start=8, kappa=0.5,
                             averaging_start=16, psi_floor=1e-6, expansion=True)
    stream = ShardedStream(step, kern.em_init(kern.init_factors(jax.random.PRNGKey(5), 5, 2)),
                           batch_size=8, mesh=mesh)
    stream.partial_fit(X[:24]).partial_fit(X[24:44])
    F, psi = kern.em_finalize(stream.state, psi_floor=1e-6, expansion=True)
    assert stream.n_seen == ofa.n_samples_seen_ == 44
    close(np.asarray(F).T, ofa.components_, "online F")
    close(psi, ofa.noise_variance_, "online psi")
    close(stream.state.mean, ofa.mean_, "online mean")
    print("ONLINE-OK")

    # bad input: one sentence naming the counts
    for call, words in ((lambda: shard_rows(X[:30], mesh), ["30 rows", "4 devices"]),
                        (lambda: ShardedStream(step, None, batch_size=6, mesh=mesh), ["batch_size=6", "4 devices"])):
        try:
            call()
        except ValueError as e:
            assert all(w in str(e) for w in words) and str(e).count(". ") == 0, str(e)
        else:
            raise AssertionError("no error")

    # random draws do not depend on the sharding, with either threefry setting
    for partitionable in (True, False):
        jax.config.update("jax_threefry_partitionable", partitionable)
        f = jax.jit(lambda k, b: b + jax.random.normal(k, b.shape))
        b = np.zeros((8, 3))
        one = f(jax.random.PRNGKey(1), b)
        four = f(jax.random.PRNGKey(1), shard_rows(b, mesh))
        assert len(four.sharding.device_set) == 4
        assert np.array_equal(np.asarray(one), np.asarray(four)), partitionable
    print("ALL-OK")
""")


def test_four_devices_give_the_one_device_results():
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                                       " --xla_force_host_platform_device_count=4").strip(),
           "JAX_PLATFORMS": "cpu"}
    for name in ("LATENTZOO_COORDINATOR", "LATENTZOO_NUM_PROCESSES", "LATENTZOO_PROCESS_ID"):
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-c", _FOUR_DEVICES], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and "ALL-OK" in r.stdout and "BINARY-EM-OK" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])


# ------------------------------------------------------------------- one device, no subprocess
def test_no_variables_is_one_process():
    info = read_process_env({})
    assert (info.process_id, info.num_processes, info.coordinator) == (0, 1, None)
    assert initialize_from_env({}) == info  # starts nothing


@pytest.mark.parametrize("env, words", [
    ({"LATENTZOO_NUM_PROCESSES": "2", "LATENTZOO_PROCESS_ID": "0"}, ["LATENTZOO_COORDINATOR is not set"]),
    ({"LATENTZOO_COORDINATOR": "h:1", "LATENTZOO_NUM_PROCESSES": "2"}, ["LATENTZOO_PROCESS_ID is not set"]),
    ({"LATENTZOO_COORDINATOR": "nohostport", "LATENTZOO_NUM_PROCESSES": "2",
      "LATENTZOO_PROCESS_ID": "0"}, ["host:port", "'nohostport'"]),
    ({"LATENTZOO_COORDINATOR": "h:1", "LATENTZOO_NUM_PROCESSES": "2", "LATENTZOO_PROCESS_ID": "2"},
     ["LATENTZOO_PROCESS_ID=2", "from 0 to 1"]),
    ({"LATENTZOO_COORDINATOR": "h:1", "LATENTZOO_NUM_PROCESSES": "two", "LATENTZOO_PROCESS_ID": "0"},
     ["LATENTZOO_NUM_PROCESSES must be an integer"]),
    ({"LATENTZOO_INIT_TIMEOUT": "0"}, ["LATENTZOO_INIT_TIMEOUT must be at least 1"]),
])
def test_a_bad_environment_is_one_sentence(env, words):
    with pytest.raises(ValueError) as err:
        read_process_env(env)
    msg = str(err.value)
    assert all(w in msg for w in words), msg
    assert "\n" not in msg and msg.endswith(".")


def test_joining_after_jax_started_is_refused():
    jax.numpy.zeros(1).block_until_ready()  # this interpreter's JAX is running
    env = {"LATENTZOO_COORDINATOR": "127.0.0.1:1", "LATENTZOO_NUM_PROCESSES": "2",
           "LATENTZOO_PROCESS_ID": "0"}
    with pytest.raises(DistributedSetupError, match="before any JAX computation"):
        initialize_from_env(env)


def test_lost_peer_is_one_sentence():
    exc = jax.errors.JaxRuntimeError(
        "INTERNAL: Error dispatching computation: Gloo all-reduce failed: "
        "[pair.cc:538] Read error [127.0.0.1]:33410: Connection reset by peer\nmore")
    msg = failure_sentence(exc)
    assert msg.startswith("Process 0 of 1 lost contact with another process") and "\n" not in msg
    assert failure_sentence(ValueError("Plain sentence.")) == "Plain sentence."


def test_stream_order():
    assert list(stream_order(5, 4, 1)) == [0, 1, 2, 3, 4]
    # two processes of 5 rows, batches of 4: 2 rows from each process per batch
    assert list(stream_order(5, 4, 2)) == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9]
    with pytest.raises(ValueError, match="batch_size=5 cannot be split over 2 processes"):
        stream_order(4, 5, 2)


def test_local_rows_and_one_device_mesh():
    X = np.arange(12.0).reshape(6, 2)
    assert np.array_equal(local_rows(X, 1, 3), X[2:4])
    with pytest.raises(ValueError, match="6 rows, which 4 processes cannot share equally"):
        local_rows(X, 0, 4)
    mesh = row_mesh(jax.devices()[:1])
    assert mesh.axis_names == ("rows",)
    Xs = shard_rows(X, mesh)
    assert np.array_equal(np.asarray(Xs), X) and shard_rows(Xs, mesh) is Xs
