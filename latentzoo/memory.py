"""Memory a run needs at the least, and what the machine has: sizes it cannot hold are refused
before anything is read in full or compiled, with one sentence, instead of an out-of-memory kill
minutes later.

The estimate is a floor, never a guess from above, so that a run that fits is never refused:
the JAX runtime and XLA's compiler (:data:`RUNTIME_BYTES`, 512 MB; the smallest runs of
``experiments/bench_scaling.py`` peaked at 0.7-2.5 GB) plus, per chain, the data and the sweep's arrays of the
data's size: a residual and one array per latent dimension (``8 N D (K + 2)`` bytes in float64).
Every family's sweep holds at least these (a residual or mean of X's shape, and an (N, D, K)
table: the per-row loadings, the factor contributions or the feature maps).

``LATENTZOO_MEMORY_LIMIT`` (bytes, or with a K/M/G suffix) caps what a run may plan for below
what the machine reports (a shared machine, a container without its own ``/proc/meminfo``).
"""

from __future__ import annotations

import os

__all__ = ["RUNTIME_BYTES", "available_bytes", "run_floor_bytes", "check_fits", "human_bytes"]

RUNTIME_BYTES = 512 * 2**20
_SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _limit_from_env() -> int | None:
    raw = os.environ.get("LATENTZOO_MEMORY_LIMIT", "").strip().upper().removesuffix("B")
    if not raw:
        return None
    scale = _SUFFIX.get(raw[-1], 1)
    try:
        value = float(raw[:-1] if raw[-1] in _SUFFIX else raw)
    except ValueError:
        raise ValueError(f"LATENTZOO_MEMORY_LIMIT must be a number of bytes (e.g. 8G), got "
                         f"{os.environ['LATENTZOO_MEMORY_LIMIT']!r}.") from None
    return int(value * scale)


def available_bytes() -> int | None:
    """Memory available to a new run: ``MemAvailable`` of ``/proc/meminfo`` (physical memory
    where it is missing), capped by ``LATENTZOO_MEMORY_LIMIT``; None when neither is known."""
    found = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if found is None:
        try:
            found = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            found = None
    limit = _limit_from_env()
    if limit is not None:
        found = limit if found is None else min(found, limit)
    return found


def run_floor_bytes(rows: int, values_per_row: int, K: int, chains: int = 1) -> int:
    """The least memory a fit of ``rows`` x ``values_per_row`` data with ``K`` latent dimensions
    and ``chains`` chains can run in (see the module's note)."""
    per_chain = 8 * int(rows) * int(values_per_row) * (int(K) + 2)
    return RUNTIME_BYTES + max(int(chains), 1) * per_chain


def human_bytes(n: float) -> str:
    """``1.5 GB``-style sizes for sentences."""
    for unit, scale in (("TB", 2**40), ("GB", 2**30), ("MB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.0f} KB"


def check_fits(need: int, what: str) -> None:
    """ValueError naming ``what`` and both sizes when ``need`` bytes exceed what is available."""
    have = available_bytes()
    if have is not None and need > have:
        raise ValueError(f"{what} needs at least {human_bytes(need)} of memory and "
                         f"{human_bytes(have)} is available; use fewer rows, columns, chains or "
                         "a smaller K (or a machine with more memory).")
