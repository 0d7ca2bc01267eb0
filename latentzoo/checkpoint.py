"""Checkpoints of long runs, so that ``latentzoo run ... --resume DIR`` continues after a kill.

A run into ``DIR`` keeps its checkpoint in ``DIR/.checkpoint`` (removed when the run finishes):

- ``run.json``: the run's arguments (model, method, a SHA-256 of the data file, K, seed, sizes);
  ``--resume`` refuses, in one sentence, to continue with different ones;
- ``mcmc/``: an MCMC run (:func:`run_mcmc_segments`, used by :func:`latentzoo.runs.run_mcmc` for
  every family) runs its warm-up, saves the post-warm-up state, then draws in segments through
  NumPyro's ``mcmc.post_warmup_state = mcmc.last_state; mcmc.run(...)``, saving each segment's
  draws and the state after it;
- ``cavi-<call>-<restart>.npz``: a point fit's parameters and objective trace, saved by the CAVI
  driver every so many sweeps (:func:`latentzoo.inference.cavi.checkpointing`).

Every file is written to a temporary name and renamed, so a kill leaves the last complete
checkpoint. MCMC states are NumPyro/latentzoo named tuples of arrays; they are pickled, and read
back by an unpickler that accepts nothing but arrays, plain containers and the state classes of
``numpyro`` and ``latentzoo`` (a checkpoint file cannot run code).

**Why a resumed chain equals an uninterrupted one.** NumPyro's kernels keep everything a step
needs, the PRNG key included, in their state; ``MCMC.run`` continues from ``post_warmup_state``
with the key stored there. So warm-up then draws in segments is the same chain as one ``run``, and
the draws are identical to the bit (tested for the Gibbs builder and NUTS).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import time

import jax
import numpy as np

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_SECONDS",
    "file_digest",
    "save_tree",
    "load_tree",
    "run_mcmc_segments",
]

CHECKPOINT = ".checkpoint"
# Target wall time between two MCMC checkpoints when the draws per segment are not given: each
# segment is one more (cached) compilation of NumPyro's sampling loop per chain.
CHECKPOINT_SECONDS = 120.0


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------- state files
_NUMPY_NAMES = {"_reconstruct", "scalar", "ndarray", "dtype", "_frombuffer", "frombuffer"}
_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "slice", "complex", "bytearray"}


class _StateUnpickler(pickle.Unpickler):
    """Arrays, plain containers and the named-tuple states of numpyro / latentzoo; nothing else."""

    def find_class(self, module, name):
        root = module.split(".")[0]
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        if root == "numpy" and (name in _NUMPY_NAMES or name.endswith("DType")):
            return super().find_class(module, name)
        if root in ("numpyro", "latentzoo"):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and issubclass(obj, tuple):
                return obj
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint")


def _to_numpy(tree):
    return jax.tree.map(lambda x: np.asarray(x) if hasattr(x, "shape") else x, jax.device_get(tree))


def save_tree(path: str, tree) -> None:
    """Pickle a pytree of arrays (as NumPy) atomically."""
    from latentzoo.results import atomic_write

    def write(tmp):
        with open(tmp, "wb") as fh:
            pickle.dump(_to_numpy(tree), fh, protocol=pickle.HIGHEST_PROTOCOL)

    atomic_write(path, write)


def load_tree(path: str):
    """Read a pytree written by :func:`save_tree` (restricted unpickler)."""
    with open(path, "rb") as fh:
        return _StateUnpickler(io.BytesIO(fh.read())).load()


def _write_json(path: str, obj) -> None:
    from latentzoo.results import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- MCMC
def _segments_on_disk(folder: str) -> list[str]:
    """The contiguous draws-0000.pkl, draws-0001.pkl, ... present."""
    out = []
    while os.path.exists(os.path.join(folder, f"draws-{len(out):04d}.pkl")):
        out.append(os.path.join(folder, f"draws-{len(out):04d}.pkl"))
    return out


def _concat(parts):
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *parts)


def run_mcmc_segments(mcmc, cfg, model_args, model_kwargs, *, rng_key, extra_fields=(),
                      init_params=None):
    """Run a configured ``numpyro.infer.MCMC`` (``num_warmup`` / ``num_chains`` of the run)
    with checkpoints in ``cfg.checkpoint_dir/mcmc``; resume from them when ``cfg.resume``.

    Warm-up first (``mcmc.warmup``), its final state saved; then the ``cfg.samples`` draws per
    chain in segments of ``cfg.checkpoint_every`` draws (default: about one segment per
    :data:`CHECKPOINT_SECONDS`, from the warm-up's speed), each continuing from the last state
    and saved with it. Returns ``mcmc`` holding all the draws, as after one ``mcmc.run``.
    """
    folder = os.path.join(cfg.checkpoint_dir, "mcmc")
    os.makedirs(folder, exist_ok=True)
    meta_path = os.path.join(folder, "meta.json")
    thin = int(getattr(mcmc, "thinning", 1) or 1)
    meta = {
        "kernel": type(mcmc.sampler).__name__,
        "chains": int(cfg.chains),
        "warmup": int(cfg.warmup),
        "samples": int(cfg.samples),
        "extra_fields": list(extra_fields),
        "thinning": thin,
    }
    parts, state, size, done = [], None, cfg.checkpoint_every, 0
    if cfg.resume and os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as fh:
            saved = json.load(fh)
        differs = [k for k in meta if saved.get(k) != meta[k]]
        if differs:
            raise ValueError(
                f"The MCMC checkpoint in {folder} was made with {differs[0]} = {saved.get(differs[0])!r}, "
                f"not {meta[differs[0]]!r}; run afresh without --resume."
            )
        size = size or saved.get("segment")
        files = _segments_on_disk(folder)
        if files:
            saved_parts = [load_tree(f) for f in files]
            parts = [p["draws"] for p in saved_parts]
            done = sum(int(p["steps"]) for p in saved_parts)
            state = saved_parts[-1]["state"]
        elif os.path.exists(os.path.join(folder, "warmup.pkl")):
            state = load_tree(os.path.join(folder, "warmup.pkl"))
    else:
        for name in os.listdir(folder):  # a fresh run: nothing of an earlier one is reused
            os.remove(os.path.join(folder, name))
    if state is None:
        t0 = time.perf_counter()
        mcmc.warmup(rng_key, *model_args, extra_fields=tuple(extra_fields),
                    init_params=init_params, **model_kwargs)
        seconds = time.perf_counter() - t0
        if size is None:  # compilation included: errs towards checkpointing more often
            per_step = seconds / max(cfg.warmup, 1)
            size = int(CHECKPOINT_SECONDS / per_step) if cfg.warmup else max(1, cfg.samples // 10)
        state = mcmc.post_warmup_state
        save_tree(os.path.join(folder, "warmup.pkl"), state)
    size = int(min(max(size or 1, 1), cfg.samples))
    n_seg = -(-cfg.samples // size)
    size = -(-cfg.samples // n_seg)  # equal segments (one compiled loop), the last one shorter
    # With thinning t NumPyro keeps the last draw of every t steps, counting back from the end
    # (the first samples % t steps are dropped): the first segment takes those steps and the
    # rest are whole blocks of t, so the segments keep the draws of one run.
    size = -(-size // thin) * thin
    skipped = cfg.samples % thin
    _write_json(meta_path, {**meta, "segment": size})
    mcmc.post_warmup_state = state
    while done < cfg.samples:
        n = min(size + (skipped if done == 0 else 0), cfg.samples - done)
        if n < thin:  # fewer steps than one block: a single run keeps no draw either
            break
        mcmc.num_samples = n
        mcmc.run(mcmc.post_warmup_state.rng_key, *model_args, extra_fields=tuple(extra_fields),
                 **model_kwargs)
        draws = _to_numpy(mcmc._states)  # noqa: SLF001 (NumPyro keeps the collected fields there)
        save_tree(os.path.join(folder, f"draws-{len(parts):04d}.pkl"),
                  {"draws": draws, "state": mcmc.last_state, "steps": n})
        parts.append(draws)
        done += n
        mcmc.post_warmup_state = mcmc.last_state
    # One MCMC holding every draw, as an uninterrupted `run` leaves it (get_samples, ArviZ); a
    # resume that found every segment saved has not run at all, so give it the run's arguments.
    mcmc.num_samples = cfg.samples
    mcmc._args, mcmc._kwargs = tuple(model_args), dict(model_kwargs)  # noqa: SLF001
    mcmc._last_state = mcmc.post_warmup_state  # noqa: SLF001
    mcmc._states = _concat(parts)  # noqa: SLF001
    mcmc._states_flat = None  # noqa: SLF001
    return mcmc
