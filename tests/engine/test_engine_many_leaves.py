"""Many small leaves select exactly as the same weights in a few large leaves (eager and traced),
and the "many leaves" benchmark section runs (no timings asserted)."""

import pytest
import torch
from torch.func import vmap

import fprune
from tests.engine.engine_helpers import owner


def split_leaves(whole, parts):
    return {f"p{i:04d}": chunk.reshape(-1) for i, chunk in enumerate(whole.chunk(parts))}


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_many_small_leaves_equal_a_few_large_ones(monkeypatch, traced):
    monkeypatch.setattr(owner("CHUNK"), "CHUNK", 1 << 12)  # packed chunks, own chunks and many of both
    monkeypatch.setattr(owner("PACK"), "PACK", 1 << 10)
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(40_000, generator=g)
    whole[::7] = 0.5  # ties across leaves
    prior = torch.rand(40_000, generator=g) > 0.25
    many, few = split_leaves(whole, 500), split_leaves(whole, 4)
    many_prior, few_prior = split_leaves(prior, 500), split_leaves(prior, 4)
    for amount in (0.0, 0.3, 0.5, 0.97, 1.0):
        if traced:
            a = torch.tensor([amount])
            run = lambda p, m, *, a=a: vmap(lambda x: fprune.global_unstructured(p, x, masks=m))(a)
            flat = lambda masks: torch.cat([masks[k][0] for k in sorted(masks)])
        else:
            run = lambda p, m, *, amount=amount: fprune.global_unstructured(p, amount, masks=m)
            flat = lambda masks: torch.cat([masks[k] for k in sorted(masks)])
        assert torch.equal(flat(run(many, many_prior)), flat(run(few, few_prior)))
        assert torch.equal(flat(run(many, None)), flat(run(few, None)))


def test_per_leaf_selection_of_many_leaves_equals_one_leaf_at_a_time(monkeypatch):
    monkeypatch.setattr(owner("EACH_SMALL"), "EACH_SMALL", 64)
    monkeypatch.setattr(owner("CHUNK"), "CHUNK", 1000)
    g = torch.Generator().manual_seed(1)
    params = {
        f"p{i:03d}": torch.randn(int(torch.randint(1, 200, (1,), generator=g)), generator=g)
        for i in range(300)
    }
    for p in list(params.values())[::4]:
        p[::3] = -1.0
    masks = fprune.l1_unstructured(params, 0.4)
    for name, p in params.items():
        assert torch.equal(masks[name], fprune.l1_unstructured({"x": p}, 0.4)["x"])


def test_many_leaves_benchmark_quick_tables():
    from benchmarks import many_leaves

    report = many_leaves.run(quick=True)
    text = many_leaves.markdown(report)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 * 2  # header + 3 calls for 200x1000 and gpt2-2
    assert "Fixed cost per leaf" in text
    for result in report["models"].values():
        assert all(entry["median_s"] > 0 for entry in result["calls"].values())


def test_device_benchmark_runs_on_the_cpu():
    """benchmarks/gpu.py (python -m benchmarks --device cuda) is device-generic: a tiny CPU run."""
    from benchmarks import gpu

    report = gpu.run("cpu", ["tiny"], quick=True)
    text = gpu.markdown(report)
    assert "| tiny | 0.5 |" in text and "| tiny | 0.9 |" in text and "Training step" in text
    assert report["global"]["tiny"]["fprune_0.5"]["median_s"] > 0
