"""Checkpoints and --resume: a run killed mid-sampling (or mid-fit) continues where its last
checkpoint left off, and ends with exactly the draws (or estimates) of an uninterrupted run."""

import gc
import os
import signal
import subprocess
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from latentzoo import arviz_adapter as azx
from latentzoo.checkpoint import load_tree, run_mcmc_segments, save_tree
from latentzoo.cli import main
from latentzoo.inference.fa import fa_updates
from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.models.factor_analysis import default_fa_data, factor_analysis
from latentzoo.registry import RunConfig
from latentzoo.runs import run_mcmc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
X = jnp.asarray(default_fa_data(0, N=30, D=4, K=1))
MODEL = partial(factor_analysis, K=1)


def _same_draws(a, b):
    sa, sb = a.get_samples(group_by_chain=True), b.get_samples(group_by_chain=True)
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(np.asarray(sa[k]), np.asarray(sb[k]), err_msg=k)
    ea, eb = a.get_extra_fields(group_by_chain=True), b.get_extra_fields(group_by_chain=True)
    for k in ea:
        np.testing.assert_array_equal(np.asarray(ea[k]), np.asarray(eb[k]), err_msg=k)


# --------------------------------------------------------------- segments = one run
@pytest.mark.filterwarnings("ignore::latentzoo.inference.gibbs.ConjugacyFallbackWarning")
@pytest.mark.parametrize("kernel", ["gibbs", "composite", "nuts"])
def test_segments_and_resumes_give_the_draws_of_one_run(kernel, tmp_path):
    # NumPyro keeps the PRNG key in the kernel's state, so warm-up, then draws in segments each
    # continuing from the last state, is the same chain: equal to the bit, not just in law.
    # "composite": W ~ Laplace, so the Gibbs builder runs NumPyro's composite Gibbs (NUTS on W).
    kw = {"priors": {"W": dist.Laplace(0.0, 1.0)}} if kernel == "composite" else {}
    make = (lambda: NUTS(MODEL, max_tree_depth=4)) if kernel == "nuts" else \
        (lambda: ConjugateGibbs(MODEL, fa_updates()))
    cfg = RunConfig(K=1, chains=2, warmup=20, samples=30, seed=3)
    one = run_mcmc(make(), cfg, X, **kw)
    ck = cfg._replace(checkpoint_dir=str(tmp_path), checkpoint_every=10)
    _same_draws(one, run_mcmc(make(), ck, X, **kw))
    folder = tmp_path / "mcmc"
    assert sorted(os.listdir(folder)) == ["draws-0000.pkl", "draws-0001.pkl", "draws-0002.pkl",
                                          "meta.json", "warmup.pkl"]
    # killed after the first segment was saved: resume from it, with a fresh kernel
    for name in ("draws-0001.pkl", "draws-0002.pkl"):
        os.remove(folder / name)
    _same_draws(one, run_mcmc(make(), ck._replace(resume=True), X, **kw))
    # killed during the first segment: resume from the warm-up's state
    for name in ("draws-0000.pkl", "draws-0001.pkl", "draws-0002.pkl"):
        os.remove(folder / name)
    _same_draws(one, run_mcmc(make(), ck._replace(resume=True), X, **kw))


def _sampling_loops_compiled_by(cfg):
    """How many compiled NumPyro sampling loops (``fori_collect``'s ``_fori_collect_loop``) the run
    of ``cfg`` added to those alive in this process."""
    from jax.extend.backend import get_backend

    def loops():
        gc.collect()
        return sum(e.hlo_modules()[0].name == "jit__fori_collect_loop" for e in get_backend().live_executables())

    before = loops()
    run_mcmc(ConjugateGibbs(MODEL, fa_updates()), cfg, X)
    return loops() - before


def test_segments_compile_the_sampling_loop_once(tmp_path):
    # NumPyro compiles its sampling loop afresh on every MCMC.run (a new jit object each call),
    # and JAX's caches kept each one: NOCA's default run grew by about 50 MB a segment and chain
    # to 5.7 GB. run_mcmc keeps one loop for the warm-up and every segment, however many and of
    # whatever lengths (latentzoo.compiled_loop; without it, one more per segment, and before the
    # loop's length was traced, one for the warm-up, one for the segments and one for a shorter
    # last segment: the sweep compiled three times).
    for samples in (2, 6, 5):  # one segment; three of 2; 2 + 2 + 1
        cfg = RunConfig(K=1, chains=1, warmup=3, samples=samples, seed=3,
                        checkpoint_dir=str(tmp_path / str(samples)), checkpoint_every=2)
        assert _sampling_loops_compiled_by(cfg) == 1, samples


def test_sequential_chains_share_one_compiled_loop():
    # The same for the chains of a sequential run: each chain compiled (and kept) its own copy of
    # the loop, about 7 s and 210 MB a chain for the rank SVM's G-NL table. Without
    # one_compiled_loop three chains compile three loops.
    assert _sampling_loops_compiled_by(RunConfig(K=1, chains=3, warmup=2, samples=2, seed=5)) == 1


def test_one_compiled_loop_leaves_the_draws_unchanged():
    import numpyro.util

    from latentzoo.compiled_loop import one_compiled_loop

    def draws(shared):
        mcmc = MCMC(ConjugateGibbs(MODEL, fa_updates()), num_warmup=3, num_samples=4, num_chains=2,
                    chain_method="sequential", progress_bar=False, jit_model_args=True)
        if shared:
            with one_compiled_loop():
                mcmc.run(jax.random.PRNGKey(1), X)
        else:
            mcmc.run(jax.random.PRNGKey(1), X)
        return mcmc

    _same_draws(draws(False), draws(True))
    # and NumPyro is itself again afterwards: a patch left in place would keep every jit object
    # of every later run alive
    assert not getattr(numpyro.util.maybe_jit, "_latentzoo_memo", False)


def test_thinned_segments_keep_the_draws_of_one_thinned_run(tmp_path):
    def mcmc():
        return MCMC(ConjugateGibbs(MODEL, fa_updates()), num_warmup=10, num_samples=25,
                    num_chains=1, thinning=3, progress_bar=False, jit_model_args=True)

    key = jax.random.PRNGKey(1)
    one = mcmc()
    one.run(key, X)
    cfg = RunConfig(K=1, chains=1, warmup=10, samples=25, checkpoint_dir=str(tmp_path),
                    checkpoint_every=4)  # rounded up to whole blocks of 3 steps
    _same_draws(one, run_mcmc_segments(mcmc(), cfg, (X,), {}, rng_key=key))


def test_state_files_cannot_run_code(tmp_path):
    import pickle

    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(os.system))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        load_tree(str(path))
    save_tree(str(tmp_path / "ok.pkl"), {"a": jnp.arange(3), "b": (np.float64(2.0),)})
    assert load_tree(str(tmp_path / "ok.pkl"))["a"].tolist() == [0, 1, 2]


# --------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "x.npy"
    np.save(path, np.asarray(X))
    return str(path)


def _mcmc_args(data, out, flag="--out"):
    return ["run", "fa", "--data", data, "--K", "1", "--chains", "2", "--warmup", "20",
            "--samples", "120", "--checkpoint-every", "20", "--seed", "4", "--no-progress",
            flag, str(out)]


# The child follows the tests' JAX compilation cache setting (off unless opted in); where a cache
# is used, the conftest makes its writes atomic, so a child killed while writing an entry cannot
# leave a torn entry for other processes to load.
_SLOW_SEGMENTS = """
import os, runpy, sys, time
sys.path.insert(0, {root!r})
runpy.run_path(os.path.join({root!r}, "tests", "conftest.py"))
import latentzoo.checkpoint as ck
real = ck.save_tree

def save_tree(path, tree):  # room to kill the run between two segments
    real(path, tree)
    time.sleep(0.5)

ck.save_tree = save_tree
from latentzoo.cli import main
sys.exit(main({argv!r}))
"""


def _posterior(out):
    idata = azx.load(str(out / "posterior.nc"))
    return {k: np.asarray(v) for k, v in idata.posterior.data_vars.items()}, idata


def test_sigkill_mid_sampling_then_resume_equals_the_uninterrupted_run(data, tmp_path):
    ref = tmp_path / "ref"
    assert main(_mcmc_args(data, ref)) == 0
    out = tmp_path / "run"
    code = _SLOW_SEGMENTS.format(root=ROOT, argv=_mcmc_args(data, out))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    mark = out / ".checkpoint" / "mcmc" / "draws-0001.pkl"
    deadline = time.monotonic() + 300
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no segment was saved"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (out / "posterior.nc").exists()
    saved = sorted(os.listdir(out / ".checkpoint" / "mcmc"))
    assert 2 <= sum(n.startswith("draws-") for n in saved) < 6, saved  # killed mid-sampling

    assert main(_mcmc_args(data, out, "--resume")) == 0
    got, idata = _posterior(out)
    want, _ = _posterior(ref)
    assert idata.posterior.sizes["draw"] == 120 and idata.posterior.sizes["chain"] == 2
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert not [n for n in os.listdir(out) if n.startswith((".checkpoint", ".staging", ".tmp"))]


def test_point_fit_interrupted_then_resumed_equals_the_uninterrupted_run(data, tmp_path,
                                                                         monkeypatch, capsys):
    from latentzoo.inference.cavi import CAVI

    argv = ["run", "fa", "--method", "em", "--data", data, "--K", "1", "--sweeps", "40",
            "--checkpoint-every", "5", "--no-progress", "--out"]
    ref = tmp_path / "ref"
    assert main(argv + [str(ref)]) == 0
    real, calls = CAVI.update, []

    def update(self, state, *args, **kwargs):
        calls.append(state.step)
        if len(calls) == 13:
            raise KeyboardInterrupt
        return real(self, state, *args, **kwargs)

    monkeypatch.setattr(CAVI, "update", update)
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(argv + [str(out)]) == 130
    err = capsys.readouterr().err.strip()
    assert f"--resume {out}" in err and "\n" not in err, err
    assert os.path.exists(out / ".checkpoint" / "cavi-0-0.npz")
    monkeypatch.setattr(CAVI, "update", real)
    assert main(argv[:-1] + ["--resume", str(out)]) == 0
    got, idata = _posterior(out)
    want, ref_idata = _posterior(ref)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    np.testing.assert_array_equal(np.asarray(idata.sample_stats["objective"]),
                                  np.asarray(ref_idata.sample_stats["objective"]))


@pytest.mark.smoke
def test_resume_refusals_are_one_sentence(data, tmp_path, capsys):
    def refused(argv, phrase):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert phrase in err and "\n" not in err and "Traceback" not in err, err

    out = tmp_path / "run"
    refused(_mcmc_args(data, out, "--resume"), "no interrupted run to resume")
    assert not out.exists()
    refused(["run", "fa", "--method", "online-em", "--resume", str(out)], "cannot be resumed")
    refused(["run", "fa", "--out", str(out), "--resume", str(tmp_path / "other")],
            "name different folders")
    refused(["run", "fa"], "--out")
    # a checkpoint of a run with other arguments is not continued, and is kept
    import json

    from latentzoo.checkpoint import file_digest

    record = out / ".checkpoint" / "run.json"
    record.parent.mkdir(parents=True)
    same = {"model": "fa", "method": "gibbs", "data": "sha256:" + file_digest(data), "K": 1,
            "J": None, "seed": 4, "chains": 2, "samples": 120, "warmup": 20, "sweeps": None,
            "restarts": None, "quick": False, "standardize": False}
    argv = _mcmc_args(data, out, "--resume")
    record.write_text(json.dumps({**same, "K": 2}))
    refused(argv, "was made with --K 2, not 1")
    record.write_text(json.dumps({**same, "seed": 5}))
    refused(argv, "was made with --seed 5, not 4")
    record.write_text(json.dumps({**same, "data": "sha256:0"}))
    refused(argv, "on other data")
    assert record.exists()
