"""The public selection layer (fprune.select): every scope against a plain reference written here,
signed and magnitude ranking, traced == eager, bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import vmap

import fprune
from fprune import _select
from fprune.select import EACH, NM, Channels, Global, Rows, select
from tests import reference
from tests.strategies import matrix_shapes, prior_masks, tensors


def _same(x, y):
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _groups_reference(scores, prior, counts_of):
    """Keep-masks of a (groups, size) problem: in row g prune ``counts_of(alive)`` alive entries.

    A Python sort per row by (NaN, value, position); prior-pruned entries stay pruned.
    """
    keep = []
    for g in range(scores.shape[0]):
        values = [float(v) for v in scores[g].tolist()]
        alive = [True] * len(values) if prior is None else [bool(x) for x in prior[g].tolist()]
        candidates = sorted(
            (j for j in range(len(values)) if alive[j]),
            key=lambda j: (math.isnan(values[j]), 0.0 if math.isnan(values[j]) else values[j] + 0.0, j),
        )
        row = list(alive)
        for j in candidates[: counts_of(len(candidates))]:
            row[j] = False
        keep.append(row)
    return torch.tensor(keep, dtype=torch.bool).reshape(scores.shape)


# ---------------------------------------------------------------------------------------------
# Each and Global: the reference of tests/reference.py, signed or by magnitude


@given(st.data(), st.sampled_from(["value", "magnitude"]), st.booleans())
def test_each_and_global_match_the_reference(data, rank, is_global):
    a, b = data.draw(tensors()), data.draw(tensors())
    prior = {"a": data.draw(prior_masks(a.shape)), "b": data.draw(prior_masks(b.shape))} if data.draw(st.booleans()) else None
    ranked = (lambda t: t) if rank == "value" else torch.abs
    if is_global:
        alive = a.numel() + b.numel() if prior is None else int(prior["a"].sum() + prior["b"].sum())
        amount = data.draw(st.one_of(st.floats(0, 1), st.integers(0, alive)))
        got = select({"a": a, "b": b}, amount, scope=Global(), rank=rank, masks=prior)
        want = reference.lowest([ranked(a), ranked(b)], amount, None if prior is None else [prior["a"], prior["b"]])
        assert torch.equal(got["a"], want[0]) and torch.equal(got["b"], want[1])
    else:
        amount = data.draw(st.floats(0, 1))
        got = select({"a": a, "b": b}, amount, rank=rank, masks=prior)
        for key, t in (("a", a), ("b", b)):
            (want,) = reference.lowest([ranked(t)], amount, None if prior is None else [prior[key]])
            assert torch.equal(got[key], want)


def test_signed_ranking_prunes_the_most_negative_first():
    w = {"w": torch.tensor([3.0, -1.0, 2.0, -5.0, 0.0])}
    assert fprune.l1_unstructured(w, 2)["w"].tolist() == [True, False, True, True, False]
    assert fprune.l1_unstructured(w, 2, signed=True)["w"].tolist() == [True, False, True, False, True]
    assert fprune.global_unstructured(w, 2, signed=True)["w"].tolist() == [True, False, True, False, True]
    scores = {"w": -torch.tensor([3.0, -1.0, 2.0, -5.0, 0.0])}  # descending: negate, exactly
    assert fprune.l1_unstructured(w, 2, importance_scores=scores, signed=True)["w"].tolist() == [
        False, True, False, True, True
    ]


def test_magnitude_is_a_named_source_with_the_fast_path():
    x = torch.randn(10)
    assert _select.keys(x, None, torch.int32, _select.MAGNITUDE).magnitude32
    assert not _select.keys(x, None, torch.int32, torch.abs).magnitude32  # no identity test
    assert repr(_select.MAGNITUDE) == "MAGNITUDE"


# ---------------------------------------------------------------------------------------------
# Channels


@given(st.data(), st.sampled_from([1, 2, math.inf]))
def test_channels_scope_reduces_entries_to_channel_scores(data, order):
    shape = data.draw(matrix_shapes)
    w = data.draw(tensors(st.just(shape)))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    amount = data.draw(st.floats(0, 1))
    got = select({"w": w}, amount, scope=Channels(dim, reduce=order))["w"]
    others = [x for x in range(w.dim()) if x != dim % w.dim()]
    keep = reference.channel_lowest(torch.norm(w, p=order, dim=others), amount, None)
    shape1 = [1] * w.dim()
    shape1[dim] = -1
    assert torch.equal(got, keep.view(shape1).expand(w.shape))
    assert torch.equal(got, fprune.ln_structured({"w": w}, amount, order, dim)["w"])


def test_channels_scope_with_a_callable_reduction_and_per_channel_scores():
    w = torch.tensor([[1.0, 1.0], [0.1, 0.1], [2.0, -3.0]])
    by_min = select({"w": w}, 1, scope=Channels(0, reduce=lambda s, dims: s.amin(dim=dims)))["w"]
    assert by_min.all(dim=1).tolist() == [True, True, False]
    # A method's score function may give one score per channel (random_structured does).
    inputs = fprune._inputs.gather({"w": w}, 1, None, None, None)
    direct = fprune.select.select_inputs(inputs, lambda i: torch.tensor([5.0, 4.0, 6.0]), 1, Channels(0, reduce=None))
    assert direct["w"].all(dim=1).tolist() == [True, False, True]


# ---------------------------------------------------------------------------------------------
# Rows (rowwise_unstructured)


@st.composite
def row_problems(draw):
    shape = draw(matrix_shapes)
    w = draw(tensors(st.just(shape)))
    prior = draw(prior_masks(shape)) if draw(st.booleans()) else None
    dim = draw(st.integers(0, len(shape) - 1))
    rank = draw(st.sampled_from(["value", "magnitude"]))
    size = w.numel() // shape[dim]
    if prior is None and draw(st.booleans()):
        amount = draw(st.integers(0, size))
    else:
        amount = draw(st.floats(0, 1))
    return w, prior, dim, rank, amount


@given(row_problems())
def test_rowwise_matches_a_per_slice_reference(problem):
    w, prior, dim, rank, amount = problem
    got = fprune.rowwise_unstructured({"w": w}, amount, dim=dim, masks=None if prior is None else {"w": prior}, signed=rank == "value")["w"]
    scores = w if rank == "value" else w.abs()
    rows = scores.movedim(dim, 0).reshape(w.shape[dim], -1)
    live = None if prior is None else prior.movedim(dim, 0).reshape(rows.shape)
    want = _groups_reference(rows, live, lambda alive: reference.count(amount, alive))
    assert torch.equal(got, want.reshape(w.movedim(dim, 0).shape).movedim(0, dim))


@settings(max_examples=15)
@given(row_problems())
def test_rowwise_eager_equals_vmap_equals_compiled(problem):
    w, prior, dim, rank, amount = problem
    signed = rank == "value"
    fn = lambda p, m: fprune.rowwise_unstructured(p, amount, dim=dim, masks=m, signed=signed)
    masks = None if prior is None else {"w": prior}
    eager = fn({"w": w}, masks)
    stacked = {"w": torch.stack([w, w.flip(0)])}
    batched = vmap(lambda p: fn(p, masks))(stacked)
    assert torch.equal(batched["w"][0], eager["w"])
    assert torch.equal(batched["w"][1], fn({"w": w.flip(0)}, masks)["w"])
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    assert _same(compiled({"w": w}, masks), eager)


def test_rowwise_tensor_amount_under_vmap():
    w = torch.randn(4, 10)
    levels = torch.tensor([0.0, 0.3, 0.5, 1.0], dtype=torch.float64)
    per_level = vmap(lambda a: fprune.rowwise_unstructured({"w": w}, a)["w"])(levels)
    for level, masks in zip(levels.tolist(), per_level):
        assert torch.equal(masks, fprune.rowwise_unstructured({"w": w}, level)["w"])
        assert ((~masks).sum(dim=1) == round(level * 10)).all()


def test_rowwise_int_amount_above_a_row_raises():
    prior = torch.ones(3, 4, dtype=torch.bool)
    prior[1, :3] = False
    with pytest.raises(ValueError, match=r"amount=2 .* prune=1 in a slice of params\['w'\] along dim 0"):
        fprune.rowwise_unstructured({"w": torch.randn(3, 4)}, 2, masks={"w": prior})
    with pytest.raises(IndexError, match=r"Invalid index 2 .*params\['w'\]"):
        fprune.rowwise_unstructured({"w": torch.randn(3, 4)}, 0.5, dim=2)


# ---------------------------------------------------------------------------------------------
# The layer's own argument checks


def test_bad_scope_rank_and_signed():
    w = {"w": torch.randn(4, 4)}
    with pytest.raises(TypeError, match="scope"):
        select(w, 0.5, scope="global")
    with pytest.raises(ValueError, match="rank.*'size'"):
        select(w, 0.5, rank="size")
    with pytest.raises(TypeError, match="signed"):
        fprune.l1_unstructured(w, 0.5, signed="yes")
    with pytest.raises(ValueError, match="normalize"):
        Global(normalize="l3")
    with pytest.raises(ValueError, match="reduce"):
        Channels(0, reduce="max")
    with pytest.raises(ValueError, match="amount=None"):
        select(w, 0.5, scope=NM(2, 4))
    with pytest.raises(ValueError, match=r"scores\['w'\]"):
        select(w, 17)


def test_select_names_the_scores_tree_and_keeps_structure():
    scores = {"b": torch.tensor([1.0, 2.0]), "a": [torch.tensor([3.0, -4.0])]}
    got = select(scores, 1, scope=EACH, where=lambda name, t: name != "b")
    assert list(got) == ["b", "a"] and got["b"].all() and got["a"][0].tolist() == [True, False]
    with pytest.raises(TypeError, match=r"scores\['a'\]\[0\]"):
        select({"a": [1.0]}, 1)
