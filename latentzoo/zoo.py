"""The zoo: which models exist, from which paper, with which inference methods."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ZooEntry", "ZOO", "zoo_table"]


class ZooEntry(NamedTuple):
    name: str
    title: str
    paper: str
    methods: tuple[str, ...]  # runnable from the CLI
    api_only: tuple[str, ...] = ()  # available from Python
    default_K: int = 3
    binary: bool = False


ZOO: dict[str, ZooEntry] = {
    "fa": ZooEntry(
        "fa",
        "Bayesian factor analysis",
        "Brownlie, MSc thesis (2021) ch. 2-4",
        ("gibbs", "nuts", "vb", "em", "online-em", "online-sga"),
    ),
    "mfa": ZooEntry(
        "mfa",
        "Mixture of factor analyzers",
        "Ghahramani & Hinton (1996); baseline of Tang et al., Tensor Analyzers",
        (),
        api_only=("gibbs",),
    ),
    "cvq": ZooEntry(
        "cvq",
        "Cooperative vector quantizer",
        "Hauskrecht lecture after Lu, Hauskrecht & Day (2002)",
        ("vem", "em", "gibbs"),
        default_K=8,
    ),
    "noca": ZooEntry(
        "noca",
        "Noisy-OR component analyzer",
        "Singliar & Hauskrecht, JMLR (2006)",
        ("vem", "em", "gibbs"),
        default_K=8,
        binary=True,
    ),
}


def zoo_table() -> str:
    rows = [("model", "name", "paper", "inference (CLI)", "Python API only")]
    for e in ZOO.values():
        rows.append((e.name, e.title, e.paper, ", ".join(e.methods) or "-", ", ".join(e.api_only) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
