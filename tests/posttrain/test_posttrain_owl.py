"""fprune.distributions.owl against OWL's formula written out, and as per-leaf amounts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from fprune.distributions import owl


def reference(params, norms, sparsity, blocks, m=5.0, lam=0.08):
    """luuyin/OWL prune_wanda_outlier, step by step: per block, concatenate |W| * sqrt(norm^2)
    of its layers, the percentage above M * mean, min-max scaled times 2 * Lamda, then
    1 - (scaled - mean(scaled) + (1 - sparsity))."""
    ratios = []
    for names in blocks:
        metric = torch.cat([(params[n].abs() * norms[n]).flatten() for n in names]).double()
        ratios.append(100.0 * float((metric > metric.mean() * m).sum()) / metric.numel())
    low, high = min(ratios), max(ratios)
    scaled = [(r - low) * (1 / (high - low) * lam * 2) for r in ratios]
    mean = sum(scaled) / len(scaled)
    return [1 - (s - mean + (1 - sparsity)) for s in scaled]


def model_params(seed, n_blocks=4):
    g = torch.Generator().manual_seed(seed)
    params, norms = {}, {}
    for b in range(n_blocks):
        for layer, shape in (("attn.q", (8, 16)), ("mlp.up", (32, 16))):
            name = f"layers.{b}.{layer}.weight"
            params[name] = torch.randn(shape, generator=g)
            spread = torch.rand(1, shape[1], generator=g) * (1 + 30 * b * torch.rand(1, generator=g))
            norms[name] = torch.rand(1, shape[1], generator=g) + spread
        params[f"layers.{b}.norm.weight"] = torch.ones(16)
    params["embed.weight"] = torch.randn(50, 16, generator=g)
    return params, norms


@given(
    seed=st.integers(0, 10_000),
    sparsity=st.sampled_from([0.3, 0.5, 0.7]),
    lam=st.sampled_from([0.02, 0.08, 0.1]),
    m=st.sampled_from([2.0, 3.0, 5.0]),
)
def test_equals_the_reference_formula(seed, sparsity, lam, m):
    params, norms = model_params(seed)
    got = owl(params, norms, sparsity, m=m, lam=lam)
    blocks = [[f"layers.{b}.attn.q.weight", f"layers.{b}.mlp.up.weight"] for b in range(4)]
    try:
        want = reference(params, norms, sparsity, blocks, m=m, lam=lam)
    except ZeroDivisionError:  # every block has the same ratio: the reference divides by 0
        want = [sparsity] * 4
    for b, names in enumerate(blocks):
        for name in names:
            assert got[name] == pytest.approx(want[b], abs=1e-9)
    assert got["embed.weight"] is None and got["layers.0.norm.weight"] is None
    values = [got[names[0]] for names in blocks]
    assert sum(values) / 4 == pytest.approx(sparsity, abs=1e-9)
    assert max(values) - min(values) <= 2 * lam + 1e-9


def test_blocks_where_and_per_leaf_amounts_everywhere():
    params, norms = model_params(0)
    amounts = owl(params, norms, 0.6)
    # usable wherever fprune takes per-leaf amounts
    masks = fprune.l1_unstructured(params, amounts)
    for name, amount in amounts.items():
        if amount is None:
            assert masks[name].all()
        else:
            assert int((~masks[name]).sum()) == round(amount * params[name].numel())
    rows = fprune.rowwise_unstructured(params, amounts)
    assert rows["embed.weight"].all()
    # blocks as a mapping: attention and MLP layers as two blocks
    mapping = {n: ("attn" if ".attn." in n else "mlp") for n in norms}
    two = owl(params, norms, 0.6, blocks=mapping)
    assert sorted({two[n] for n in norms}) == pytest.approx([0.6 - 0.08, 0.6 + 0.08])
    # where: only the MLP weights; the others get None
    only_mlp = owl(params, norms, 0.6, where=lambda n, p: ".mlp." in n)
    assert all((only_mlp[n] is None) == (".mlp." not in n) for n in params)


def test_equal_ratios_give_the_target_and_clipping_warns():
    params = {f"h.{b}.w": torch.ones(2, 8) for b in range(3)}
    norms = {n: torch.ones(1, 8) for n in params}
    assert set(owl(params, norms, 0.5).values()) == {0.5}
    norms["h.0.w"] = torch.tensor([[1.0] * 7 + [100.0]])
    with pytest.warns(UserWarning, match="clipped"):
        got = owl(params, norms, 0.02)
    assert min(got.values()) == 0.0


def test_bad_input():
    params, norms = model_params(0)
    with pytest.raises(ValueError, match="has no norms"):
        owl(params, norms, 0.5, where=lambda n, p: p.dim() == 2)
    with pytest.raises(ValueError, match="belongs to no block"):
        owl(
            params,
            {**norms, "embed.weight": torch.ones(1, 16)},
            0.5,
            where=lambda n, p: p.dim() == 2 and "norm" not in n,
        )
    with pytest.raises(ValueError, match="name no leaf"):
        owl(params, {"nope": torch.ones(1)}, 0.5)
    with pytest.raises(ValueError, match=r"norms\['layers.0.attn.q.weight'\] of shape \(1, 16\) or \(8, 1\)"):
        owl(params, {**norms, "layers.0.attn.q.weight": torch.ones(1, 3)}, 0.5)
    with pytest.raises(TypeError, match="norms to be a dict"):
        owl(params, [1], 0.5)
    with pytest.raises(ValueError, match="sparsity"):
        owl(params, norms, 1.5)
    with pytest.raises(TypeError, match="blocks"):
        owl(params, norms, 0.5, blocks=3)
    with pytest.raises(ValueError, match="lam"):
        owl(params, norms, 0.5, lam=-1.0)
