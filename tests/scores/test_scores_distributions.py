"""fprune.distributions: uniform and ERK per-leaf fractions, against references written here."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from fprune.distributions import erk, uniform


def _erk_by_bisection(shapes, sparsity, power_scale=1.0):
    """Water-filling: densities min(1, eps * raw_i) with eps found by bisection (a reference
    independent of RigL's 'make the densest layer dense and solve again' loop)."""
    sizes = [math.prod(s) for s in shapes]
    raw = [(sum(s) / n) ** power_scale for s, n in zip(shapes, sizes, strict=True)]
    target = (1 - sparsity) * sum(sizes)

    def kept(eps):
        return sum(min(1.0, eps * r) * n for r, n in zip(raw, sizes, strict=True))

    lo, hi = 0.0, 1.0
    while kept(hi) < target and hi < 1e30:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) < target else (lo, mid)
    return [1.0 - min(1.0, hi * r) for r in raw]


def _erk_rigl(shapes, sparsity, power_scale=1.0):
    """The RigL paper's procedure as its code states it (counts of zeros floored per layer)."""
    dense = set()
    while True:
        divisor, rhs, raw = 0.0, 0.0, {}
        for i, s in enumerate(shapes):
            n = math.prod(s)
            zeros = math.floor(sparsity * n)
            if i in dense:
                rhs -= zeros
            else:
                rhs += n - zeros
                raw[i] = (sum(s) / n) ** power_scale
                divisor += raw[i] * n
        eps = rhs / divisor
        top = max(raw.values())
        if top * eps > 1:
            dense |= {i for i, r in raw.items() if r == top}
        else:
            break
    return [0.0 if i in dense else 1.0 - eps * raw[i] for i in range(len(shapes))]


def test_erk_known_two_layer_model():
    # A (2, 2) has raw density 1, B (10, 10) 0.2. At 50%: eps = 52 / 24 makes A's density 2.17,
    # so A is dense and B keeps 48 of 100.
    params = {"a": torch.zeros(2, 2), "b": torch.zeros(10, 10)}
    amounts = erk(params, 0.5)
    assert amounts["a"] == 0.0
    assert amounts["b"] == pytest.approx(0.52, abs=1e-12)


def test_erk_lenet_like_model_matches_rigl_and_bisection():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5),
        torch.nn.Conv2d(6, 16, 5),
        torch.nn.Linear(256, 120),
        torch.nn.Linear(120, 84),
        torch.nn.Linear(84, 10),
    )
    params = dict(model.named_parameters())
    weights = lambda name, p: p.dim() > 1
    names = [n for n, p in params.items() if p.dim() > 1]
    shapes = [tuple(params[n].shape) for n in names]
    for sparsity in (0.5, 0.8, 0.9, 0.95, 0.99):
        amounts = erk(params, sparsity, where=weights)
        got = [amounts[n] for n in names]
        assert got == pytest.approx(_erk_by_bisection(shapes, sparsity), abs=1e-9)
        # RigL floors each layer's zero count: within one entry per layer of ours.
        for g, r, s in zip(got, _erk_rigl(shapes, sparsity), shapes, strict=True):
            assert abs(g - r) * math.prod(s) <= len(shapes) + 1e-6
        pruned = sum(a * params[n].numel() for n, a in amounts.items() if a is not None)
        total = sum(params[n].numel() for n in names)
        assert pruned == pytest.approx(sparsity * total, rel=1e-12)
        assert all(amounts[n] is None for n in params if n.endswith("bias"))  # not pruned


@given(
    shapes=st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=4).map(tuple), min_size=1, max_size=6),
    sparsity=st.floats(0.0, 1.0),
    power_scale=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
)
def test_erk_sums_and_matches_water_filling(shapes, sparsity, power_scale):
    params = [torch.zeros(s) for s in shapes]
    amounts = erk(params, sparsity, power_scale=power_scale)
    sizes = [math.prod(s) for s in shapes]
    assert all(0.0 <= a <= 1.0 for a in amounts)
    assert sum(a * n for a, n in zip(amounts, sizes, strict=True)) == pytest.approx(
        sparsity * sum(sizes), rel=1e-9, abs=1e-9
    )
    assert amounts == pytest.approx(_erk_by_bisection(shapes, sparsity, power_scale), abs=1e-7)
    # Rounded per-leaf counts stay within half an entry per leaf of the target.
    counts = sum(round(a * n) for a, n in zip(amounts, sizes, strict=True))
    assert abs(counts - sparsity * sum(sizes)) <= 0.5 * len(shapes) + 1e-6


def test_erk_power_scale_zero_is_uniform():
    params = {"a": torch.zeros(3, 5), "b": torch.zeros(7, 2, 2)}
    assert erk(params, 0.7, power_scale=0.0) == pytest.approx(uniform(params, 0.7))


def test_where_and_edge_cases():
    params = {"w": torch.zeros(4, 3), "b": torch.zeros(4), "s": torch.zeros(()), "e": torch.zeros(0, 3)}
    assert uniform(params, 0.3) == {"b": 0.3, "e": 0.3, "s": 0.3, "w": 0.3}
    assert uniform(params, 0.3, where=lambda n, p: p.dim() > 1) == {"b": None, "e": 0.3, "s": None, "w": 0.3}
    amounts = erk(params, 0.5)
    assert amounts["e"] == 0.0  # empty leaves take no part
    assert amounts["w"] * 12 + amounts["b"] * 4 + amounts["s"] == pytest.approx(0.5 * 17)
    assert erk(params, 0.0) == {"b": 0.0, "e": 0.0, "s": 0.0, "w": 0.0}
    assert erk(params, 1.0, where=lambda n, p: n == "w") == {"b": None, "e": None, "s": None, "w": 1.0}
    assert erk(params, 0.5, where=lambda n, p: False) == {"b": None, "e": None, "s": None, "w": None}
    nested = {"layer": [torch.zeros(8, 8), torch.zeros(8)]}
    assert optree_structure(erk(nested, 0.5)) == optree_structure(nested)


def optree_structure(tree):
    import optree

    return optree.tree_structure(tree)


@pytest.mark.parametrize("fn", [uniform, erk])
@pytest.mark.parametrize(
    "sparsity, error",
    [
        (1.5, ValueError),
        (-0.1, ValueError),
        (math.nan, ValueError),
        ("x", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_sparsity(fn, sparsity, error):
    with pytest.raises(error, match="sparsity"):
        fn({"w": torch.zeros(2, 2)}, sparsity)


def test_bad_power_scale_and_leaves():
    with pytest.raises(ValueError, match="power_scale"):
        erk({"w": torch.zeros(2, 2)}, 0.5, power_scale=-1.0)
    with pytest.raises(TypeError, match="power_scale"):
        erk({"w": torch.zeros(2, 2)}, 0.5, power_scale="1")
    with pytest.raises(TypeError, match=r"params\['w'\]"):
        erk({"w": [1.0, 2.0]}, 0.5)
    with pytest.raises(TypeError, match="where"):
        uniform({"w": torch.zeros(2)}, 0.5, where=3)


def test_exported():
    assert fprune.distributions.erk is erk and "distributions" in fprune.__all__


def test_erk_amounts_drive_l1_unstructured():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3), torch.nn.Conv2d(16, 32, 3), torch.nn.Linear(512, 10)
    )
    params = {k: v.detach() for k, v in model.named_parameters()}
    weights = lambda name, p: p.dim() > 1
    amounts = erk(params, 0.9, where=weights)
    try:
        masks = fprune.l1_unstructured(params, amounts)
    except TypeError:
        pytest.skip("per-leaf amounts (the selection layer's) are not in this tree yet")
    pruned = {k: int((~masks[k]).sum()) for k in params}
    assert all(pruned[k] == round((amounts[k] or 0.0) * params[k].numel()) for k in params)
    total = sum(params[k].numel() for k in params if weights(k, params[k]))
    assert abs(sum(pruned.values()) - 0.9 * total) <= 0.5 * 3


@pytest.mark.parametrize("spread", [erk, uniform])
def test_unselected_leaves_are_not_pruned_end_to_end(spread):
    """A distribution's unselected leaves (biases here) are skipped by every local mask function:
    ``ln_structured`` does not check their dims, and their masks are all True."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    params = {k: v.detach() for k, v in net.named_parameters()}
    amounts = spread(params, 0.5, where=lambda name, p: p.dim() > 1)
    assert amounts["0.bias"] is None and amounts["2.bias"] is None
    for masks in (
        fprune.ln_structured(params, amounts, 2, 0),
        fprune.l1_unstructured(params, amounts),
        fprune.random_structured(params, amounts, 1, generator=0),
        fprune.random_unstructured(params, amounts, generator=0),
    ):
        assert masks["0.bias"].all() and masks["2.bias"].all()
        assert not masks["0.weight"].all() and not masks["2.weight"].all()
    # as before, a 0.0 amount still means "prune nothing" on a selected leaf (dims checked)
    with pytest.raises(ValueError, match=r"multidimensional.*0\.bias"):
        fprune.ln_structured(params, {**amounts, "0.bias": 0.0}, 2, 0)
