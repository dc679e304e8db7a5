"""``sparsity(masks, where=)``: the overall fraction over the leaves ``where`` picks (``report``'s total)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune


@pytest.mark.filterwarnings("ignore::fprune.select.LayerCollapseWarning")
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_overall_over_the_picked_leaves_equals_the_reports_total(seed, amount):
    g = torch.Generator().manual_seed(seed)
    params = {
        "fc1.weight": torch.randn(6, 5, generator=g),
        "fc1.bias": torch.randn(6, generator=g),
        "fc2.weight": torch.randn(3, 6, generator=g),
    }
    is_weight = lambda name, p: name.endswith("weight")
    masks = fprune.global_unstructured(params, amount, where=is_weight)
    picked = fprune.sparsity(masks, where=is_weight)
    total = fprune.report(masks, where=is_weight).total
    assert float(picked.overall) == total.pruned / total.numel
    # the amount the user pruned, not diluted by the dense biases
    weights = sum(params[k].numel() for k in params if k.endswith("weight"))
    assert float(picked.overall) == round(amount * weights) / weights
    # per_leaf still has every leaf; without where, overall counts every leaf
    everything = fprune.sparsity(masks)
    assert set(picked.per_leaf) == set(params)
    assert all(torch.equal(picked.per_leaf[k], everything.per_leaf[k]) for k in params)
    assert float(everything.overall) == fprune.report(masks).total.sparsity


def test_nothing_picked_is_zero_and_it_traces():
    masks = {"w": torch.tensor([True, False])}
    assert float(fprune.sparsity(masks, where=lambda name, m: False).overall) == 0.0
    out = torch.func.vmap(lambda m: fprune.sparsity({"w": m, "b": m}, where=lambda n, m: n == "w").overall)(
        torch.tensor([[True, False], [False, False]])
    )
    assert out.tolist() == [0.5, 1.0]
