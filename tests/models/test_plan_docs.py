"""Each Gibbs family's docs page lists the updates and moves its kernel runs as ``kernel.plan()``
says (generated, kept in step here): FA's page once said a prior swap drops the scale move when
the plan drops the shear move."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from latentzoo.inference.gibbs import ConjugateGibbs
from latentzoo.registry import families

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
GIBBS = [f for f in families().values() if f.checks is not None and f.checks.gibbs_table is not None]


def plan_block(family, label="default priors", **overrides) -> str:
    kwargs = {**family.checks.model_kwargs, **overrides}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = ConjugateGibbs(family.model, family.checks.gibbs_table()).plan(**kwargs)
    sites = family.checks.data_sites
    sites = (sites,) if isinstance(sites, str) else tuple(sites)
    label = f"{family.name}, {label}"
    return (f"<!-- plan ({label}): generated from kernel.plan(); tests/models/test_plan_docs.py "
            f"keeps it in step -->\n{plan.markdown(sites)}\n<!-- end plan -->")


def _cases():
    import numpyro.distributions as dist

    for family in GIBBS:
        yield family, "default priors", {}
        if family.name == "fa":  # the swap the page describes
            yield family, "W with a Laplace prior", {"priors": {"W": dist.Laplace(0.0, 1.0)}}


CASES = list(_cases())


@pytest.mark.parametrize("family,label,overrides", CASES,
                         ids=[f"{f.name}-{label}" for f, label, _ in CASES])
def test_the_docs_page_lists_the_plan(family, label, overrides):
    page = open(os.path.join(DOCS, family.docs), encoding="utf-8").read()
    want = plan_block(family, label, **overrides)
    tag = re.escape(f"{family.name}, {label}")
    found = re.findall(rf"<!-- plan \({tag}\):.*?<!-- end plan -->", page, re.S)
    assert found == [want], \
        f"docs/{family.docs} should hold this block (regenerate it):\n{want}"
