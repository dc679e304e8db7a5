"""The public selection layer (fprune.select): every scope against a plain reference written here,
signed and magnitude ranking, traced == eager, bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import vmap
from torch.nn.utils import prune as torch_prune

import fprune
from fprune.select import EACH, NM, Channels, Global, _engine, select
from tests import reference
from tests.helpers import eager_and_aot_eager, same
from tests.strategies import matrix_shapes, prior_masks, tensors


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
    prior = (
        {"a": data.draw(prior_masks(a.shape)), "b": data.draw(prior_masks(b.shape))}
        if data.draw(st.booleans())
        else None
    )
    ranked = (lambda t: t) if rank == "value" else torch.abs
    if is_global:
        alive = a.numel() + b.numel() if prior is None else int(prior["a"].sum() + prior["b"].sum())
        amount = data.draw(st.one_of(st.floats(0, 1), st.integers(0, alive)))
        got = select({"a": a, "b": b}, amount, scope=Global(), rank=rank, masks=prior)
        want = reference.lowest(
            [ranked(a), ranked(b)], amount, None if prior is None else [prior["a"], prior["b"]]
        )
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
        False,
        True,
        False,
        True,
        True,
    ]


def test_magnitude_is_a_named_source_with_the_fast_path():
    x = torch.randn(10)
    assert _engine.keys(x, None, torch.int32, _engine.MAGNITUDE).magnitude32
    assert not _engine.keys(x, None, torch.int32, torch.abs).magnitude32  # no identity test
    assert repr(_engine.MAGNITUDE) == "MAGNITUDE"


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
    inputs = fprune.select._inputs.gather({"w": w}, 1, None, None, None)
    direct = fprune.select.select_inputs(
        inputs, lambda i: torch.tensor([5.0, 4.0, 6.0]), 1, Channels(0, reduce=None)
    )
    assert direct["w"].all(dim=1).tolist() == [True, False, True]


@pytest.mark.parametrize(
    "reduce, exc, words",
    [
        (lambda s, dims: s.sum(), ValueError, r"returned shape \(\) .*shape \(6,\)"),  # s.sum(dims) meant
        (lambda s, dims: s.sum(0), ValueError, r"returned shape \(4,\) .*shape \(6,\)"),
        (lambda s, dims: s.sum(dims) > 0, TypeError, "torch.bool"),
        (lambda s, dims: 3.0, TypeError, "float"),
    ],
)
def test_channels_reduce_of_the_wrong_shape_raises(reduce, exc, words):
    # A reduce result that is not one real score per channel raises, naming its shape or type
    # (broadcast, a 0-dim result would tie every channel).
    w = torch.randn(6, 4)
    with pytest.raises(exc, match=words):
        select({"w": w}, 0.5, scope=Channels(0, reduce=reduce))
    # a metadata-only check: still traceable
    good = Channels(0, reduce=lambda s, dims: s.sum(dims))
    assert torch.equal(
        torch.vmap(lambda x: select({"w": x}, 0.5, scope=good)["w"])(w[None])[0],
        select({"w": w}, 0.5, scope=good)["w"],
    )


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
    got = fprune.rowwise_unstructured(
        {"w": w}, amount, dim=dim, masks=None if prior is None else {"w": prior}, signed=rank == "value"
    )["w"]
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
    assert same(compiled({"w": w}, masks), eager)


def test_rowwise_tensor_amount_under_vmap():
    w = torch.randn(4, 10)
    levels = torch.tensor([0.0, 0.3, 0.5, 1.0], dtype=torch.float64)
    per_level = vmap(lambda a: fprune.rowwise_unstructured({"w": w}, a)["w"])(levels)
    for level, masks in zip(levels.tolist(), per_level, strict=True):
        assert torch.equal(masks, fprune.rowwise_unstructured({"w": w}, level)["w"])
        assert ((~masks).sum(dim=1) == round(level * 10)).all()


def test_rowwise_int_amount_above_a_row_raises():
    prior = torch.ones(3, 4, dtype=torch.bool)
    prior[1, :3] = False
    with pytest.raises(
        ValueError,
        match=r"amount=2 is more than the 1 parameters left to prune in a slice of params\['w'\] along dim 0",
    ):
        fprune.rowwise_unstructured({"w": torch.randn(3, 4)}, 2, masks={"w": prior})
    with pytest.raises(IndexError, match=r"Invalid index 2 .*params\['w'\]"):
        fprune.rowwise_unstructured({"w": torch.randn(3, 4)}, 0.5, dim=2)


# ---------------------------------------------------------------------------------------------
# The layer's own argument checks


def test_bad_scope_rank_and_signed():
    w = {"w": torch.randn(4, 4)}
    with pytest.raises(TypeError, match="scope"):
        select(w, 0.5, scope="global")
    with pytest.raises(ValueError, match=r"rank.*'size'"):
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


# ---------------------------------------------------------------------------------------------
# NM (n_m)


@st.composite
def nm_problems(draw):
    m = draw(st.integers(1, 5))
    n = draw(st.integers(0, m))
    rank_ = draw(st.integers(1, 3))
    dim = draw(st.integers(-rank_, rank_ - 1))
    shape = [draw(st.integers(1, 3)) for _ in range(rank_)]
    shape[dim] = m * draw(st.integers(1, 3))
    w = draw(tensors(st.just(tuple(shape))))
    prior = draw(prior_masks(tuple(shape))) if draw(st.booleans()) else None
    signed = draw(st.booleans())
    return w, n, m, dim, prior, signed


def _nm_reference(w, n, m, dim, prior, signed):
    scores = w if signed else w.abs()
    moved = scores.movedim(dim, -1)
    groups = moved.reshape(-1, m)
    live = None if prior is None else prior.movedim(dim, -1).reshape(-1, m)
    keep = _groups_reference(groups, live, lambda alive: alive - min(n, alive))
    return keep.reshape(moved.shape).movedim(-1, dim)


@given(nm_problems())
def test_n_m_matches_a_per_group_reference_and_is_valid(problem):
    w, n, m, dim, prior, signed = problem
    masks = None if prior is None else {"w": prior}
    got = fprune.n_m({"w": w}, n, m, dim=dim, masks=masks, signed=signed)["w"]
    assert torch.equal(got, _nm_reference(w, n, m, dim, prior, signed))
    groups = got.movedim(dim, -1).reshape(-1, m)
    alive = (
        torch.full((groups.shape[0],), m) if prior is None else prior.movedim(dim, -1).reshape(-1, m).sum(-1)
    )
    assert torch.equal(groups.sum(-1), torch.clamp(alive, max=n))  # every group keeps min(n, alive)
    if prior is not None:
        assert not (got & ~prior).any()


@settings(max_examples=15)
@given(nm_problems())
def test_n_m_eager_equals_vmap_equals_compiled(problem):
    w, n, m, dim, prior, signed = problem
    masks = None if prior is None else {"w": prior}
    fn = lambda p: fprune.n_m(p, n, m, dim=dim, masks=masks, signed=signed)
    eager = fn({"w": w})
    batched = vmap(fn)({"w": torch.stack([w, -w.flip(0)])})
    assert torch.equal(batched["w"][0], eager["w"])
    assert torch.equal(batched["w"][1], fn({"w": -w.flip(0)})["w"])
    torch._dynamo.reset()
    assert same(torch.compile(fn, fullgraph=True, backend=eager_and_aot_eager)({"w": w}), eager)


def test_n_m_ties_keep_the_last_n_of_a_group():
    masks = fprune.n_m({"w": torch.ones(2, 8)}, 2, 4)["w"]
    assert masks.tolist() == [[False, False, True, True] * 2] * 2
    conv = torch.randn(4, 8, 3, 3)
    masks = fprune.n_m({"w": conv}, 2, 4, dim=1)["w"]  # input channels of a conv weight
    assert (masks.reshape(4, 2, 4, 3, 3).sum(2) == 2).all()


def test_n_m_with_importance_scores_and_where():
    params = {"w": torch.randn(3, 4), "b": torch.randn(3)}
    scores = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)}
    masks = fprune.n_m(params, 1, 4, importance_scores=scores, where=lambda name, p: p.dim() > 1)
    assert masks["b"].all() and masks["w"].tolist() == [[False, False, False, True]] * 3


def test_n_m_bad_input():
    w = {"w": torch.randn(3, 6)}
    with pytest.raises(ValueError, match=r"params\['w'\] along dim -1, 6, to be a multiple of m=4"):
        fprune.n_m(w, 2, 4)
    with pytest.raises(ValueError, match="n=5, m=4"):
        fprune.n_m(w, 5, 4)
    with pytest.raises(ValueError, match="n=-1"):
        fprune.n_m(w, -1, 4)
    with pytest.raises(ValueError, match="m=0"):
        fprune.n_m(w, 0, 0)
    with pytest.raises(TypeError, match=r"Expected m to be an int, got 4\.0"):
        fprune.n_m(w, 2, 4.0)
    with pytest.raises(IndexError, match="Invalid index 2"):
        fprune.n_m(w, 1, 3, dim=2)


# ---------------------------------------------------------------------------------------------
# What compat needs: per-channel scores selected directly, descending order by exact negation


@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from([(4, 3), (5, 2, 3), (6, 1)]),
    st.integers(-2, 1),
    st.floats(0, 1),
)
def test_per_channel_scores_reproduce_torch_random_structured(seed, shape, dim, amount):
    t = torch.randn(shape)
    torch.manual_seed(seed)
    want = torch_prune.RandomStructured(amount, dim).compute_mask(t, torch.ones_like(t))
    torch.manual_seed(seed)
    draws = torch.rand(t.shape[dim])  # torch's one call
    got = select({"t": draws}, amount, scope=Channels(dim, reduce=None), params={"t": t})["t"]
    assert torch.equal(got, want.bool())


@given(st.integers(0, 2**31 - 1), st.sampled_from([(7,), (3, 4)]), st.floats(0, 1))
def test_descending_by_negation_reproduces_torch_random_unstructured(seed, shape, amount):
    t = torch.randn(shape)
    torch.manual_seed(seed)
    want = torch_prune.RandomUnstructured(amount).compute_mask(t, torch.ones_like(t))
    torch.manual_seed(seed)
    draws = torch.rand_like(t)  # torch prunes the LARGEST draws: rank -draws by value
    got = fprune.l1_unstructured({"t": t}, amount, importance_scores={"t": -draws}, signed=True)["t"]
    assert torch.equal(got, want.bool())
    assert torch.equal(got, select({"t": -draws}, amount)["t"])


def test_select_with_params_checks_the_scores_tree():
    params = {"w": torch.randn(3, 4), "b": torch.randn(3)}
    weights = lambda name, p: p.dim() > 1
    got = select({"w": torch.tensor([1.0, 0.0, 2.0])}, 1, scope=Channels(0), params=params, where=weights)
    assert got["b"].all() and got["w"].all(dim=1).tolist() == [True, False, True]
    with pytest.raises(ValueError, match=r"scores has no entry for params\['b'\]"):
        select({"w": torch.randn(3, 4)}, 1, params=params)
    with pytest.raises(ValueError, match=r"scores\['c'\] has no matching entry"):
        select({"c": torch.randn(3)}, 1, params=params)
    with pytest.raises(
        ValueError, match=r"Expected scores\['w'\] to have the shape of params\['w'\], \(3, 4\), got \(3,\)"
    ):
        select({"w": torch.randn(3)}, 1, params=params, where=weights)
    with pytest.raises(ValueError, match=r"one score per channel \(4,\), got \(3,\)"):
        select({"w": torch.randn(3)}, 1, scope=Channels(1), params=params, where=weights)
    with pytest.raises(TypeError, match="real tensor"):
        select({"w": torch.randn(3, 4, dtype=torch.complex64)}, 1, params=params, where=weights)


# ---------------------------------------------------------------------------------------------
# Per-leaf amounts

LOCAL = {
    "l1": lambda p, a, **kw: fprune.l1_unstructured(p, a, **kw),
    "random": lambda p, a, **kw: fprune.random_unstructured(p, a, generator=7, **kw),
    "ln": lambda p, a, **kw: fprune.ln_structured(p, a, 2, 0, **kw),
    "random_structured": lambda p, a, **kw: fprune.random_structured(p, a, 0, generator=7, **kw),
    "rowwise": lambda p, a, **kw: fprune.rowwise_unstructured(p, a, **kw),
}


@pytest.mark.parametrize("name", sorted(LOCAL))
@given(data=st.data())
def test_per_leaf_amounts_equal_one_call_per_leaf(name, data):
    fn = LOCAL[name]
    params = {
        "a.weight": data.draw(tensors(matrix_shapes)),
        "b.weight": data.draw(tensors(matrix_shapes)),
        "c": data.draw(tensors(matrix_shapes)),
    }
    prior = (
        {k: data.draw(prior_masks(v.shape)) for k, v in params.items()} if data.draw(st.booleans()) else None
    )
    counts = [0, 0.25, 1.0] if prior is not None else [0, 1, 0.25]  # an int count may exceed a prior
    amounts = {"a.weight": data.draw(st.floats(0, 1)), "c": data.draw(st.sampled_from(counts))}
    if data.draw(st.booleans()):
        amounts["b.weight"] = None  # None: skip, as a missing key
    got = fn(params, amounts, masks=prior)
    for key, _p in params.items():
        one = amounts[key] if amounts.get(key) is not None else 0
        alone = fn(params, one, masks=prior, where=lambda n, t, *, key=key: n == key)  # the same leaf numbers
        assert torch.equal(got[key], alone[key]), key


def test_per_leaf_amounts_as_a_tree_shaped_like_params_and_under_vmap():
    params = {"fc": {"weight": torch.randn(4, 6), "bias": torch.randn(4)}, "out": [torch.randn(3, 4)]}
    tree = {"fc": {"weight": 0.5, "bias": None}, "out": [2]}
    got = fprune.l1_unstructured(params, tree)
    assert got["fc"]["bias"].all()
    assert int((~got["fc"]["weight"]).sum()) == 12 and int((~got["out"][0]).sum()) == 2
    assert torch.equal(
        got["fc"]["weight"], fprune.l1_unstructured(params, {"fc.weight": 0.5})["fc"]["weight"]
    )
    levels = torch.tensor([0.25, 0.75])
    batched = vmap(lambda a: fprune.l1_unstructured(params, {"fc.weight": a, "out.0": 0.5}))(levels)
    for i, level in enumerate(levels.tolist()):
        assert torch.equal(
            batched["fc"]["weight"][i], fprune.l1_unstructured(params, {"fc.weight": level})["fc"]["weight"]
        )
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda p: fprune.rowwise_unstructured(p, {"fc.weight": 0.5}), fullgraph=True, backend="eager"
    )
    assert torch.equal(
        compiled(params)["fc"]["weight"],
        fprune.rowwise_unstructured(params, {"fc.weight": 0.5})["fc"]["weight"],
    )


def test_per_leaf_amount_errors_name_the_key():
    params = {"fc.weight": torch.randn(4, 4), "fc.bias": torch.randn(4)}
    with pytest.raises(
        ValueError, match=r"amount\['fc.weigth'\] matches no leaf of params.*Did you mean 'fc.weight'"
    ):
        fprune.l1_unstructured(params, {"fc.weigth": 0.5})
    with pytest.raises(ValueError, match=r"amount\['fc.bias'\]: amount=1.5"):
        fprune.l1_unstructured(params, {"fc.bias": 1.5})
    with pytest.raises(TypeError, match=r"amount\['fc.bias'\]: .*'half'"):
        fprune.random_unstructured(params, {"fc.bias": "half"})
    with pytest.raises(ValueError, match=r"more than the 4 parameters left to prune in params\['fc.bias'\]"):
        fprune.l1_unstructured(params, {"fc.bias": 5})
    with pytest.raises(TypeError, match="one amount for the Global scope"):
        fprune.global_unstructured(params, {"fc.bias": 0.5})
    assert all(m.all() for m in fprune.l1_unstructured(params, {}).values())


# ---------------------------------------------------------------------------------------------
# Layer-collapse protection (min_keep) and its warning


def _greedy_with_floors(scores, prior, amount, min_keep):
    """Walk the global order (prior-pruned first, then value, NaN last, then leaf, position) and
    prune entries, skipping those of a leaf that is down to its floor, until the count is met."""
    entries = []
    for leaf, (s, keep) in enumerate(zip(scores, prior, strict=True)):
        for pos, (v, alive) in enumerate(zip(s.reshape(-1).tolist(), keep.reshape(-1).tolist(), strict=True)):
            if alive:
                nan = math.isnan(v)
                entries.append(((nan, 0.0 if nan else v + 0.0), leaf, pos))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    alive = [int(k.sum()) for k in prior]
    floors = [
        min(a, min_keep if isinstance(min_keep, int) else round(min_keep * s.numel()))
        for a, s in zip(alive, scores, strict=True)
    ]
    target = reference.count(amount, sum(alive))
    keep = [k.reshape(-1).clone() for k in prior]
    left = list(alive)
    for _, leaf, pos in entries:
        if target == 0:
            break
        if left[leaf] > floors[leaf]:
            keep[leaf][pos] = False
            left[leaf] -= 1
            target -= 1
    return [k.reshape(s.shape) for k, s in zip(keep, scores, strict=True)]


@st.composite
def floor_problems(draw):
    leaves = {key: draw(tensors()) for key in ("a", "b", "c")}
    prior = {k: draw(prior_masks(v.shape)) for k, v in leaves.items()}
    if not draw(st.booleans()):  # sometimes no prior at all: every entry alive
        prior = None
    min_keep = draw(st.one_of(st.integers(0, 4), st.floats(0, 1)))
    alive = [int(prior[k].sum()) if prior else leaves[k].numel() for k in sorted(leaves)]
    floors = [
        min(a, min_keep if isinstance(min_keep, int) else round(min_keep * leaves[k].numel()))
        for a, k in zip(alive, sorted(leaves), strict=True)
    ]
    room = sum(alive) - sum(floors)
    amount = draw(
        st.one_of(st.integers(0, room), st.floats(0, 1).filter(lambda f: round(f * sum(alive)) <= room))
    )
    return leaves, prior, min_keep, amount


@given(floor_problems(), st.booleans())
def test_min_keep_is_a_greedy_walk_of_the_global_order(problem, signed):
    leaves, prior, min_keep, amount = problem
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = fprune.global_unstructured(leaves, amount, masks=prior, min_keep=min_keep, signed=signed)
    keys = sorted(leaves)
    scores = [leaves[k] if signed else leaves[k].abs() for k in keys]
    keeps = [prior[k] if prior else torch.ones_like(leaves[k], dtype=torch.bool) for k in keys]
    want = _greedy_with_floors(scores, keeps, amount, min_keep)
    for k, w in zip(keys, want, strict=True):
        assert torch.equal(got[k], w), k


@settings(max_examples=15)
@given(floor_problems())
def test_min_keep_eager_equals_vmap_equals_compiled(problem):
    leaves, prior, min_keep, amount = problem
    fn = lambda p: fprune.global_unstructured(p, amount, masks=prior, min_keep=min_keep)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = fn(leaves)
    batched = vmap(fn)({k: torch.stack([v, v]) for k, v in leaves.items()})
    assert all(torch.equal(batched[k][1], eager[k]) for k in leaves)
    torch._dynamo.reset()
    assert same(torch.compile(fn, fullgraph=True, backend="aot_eager")(leaves), eager)


def test_min_keep_keeps_a_small_layer_alive_and_the_count():
    params = {"big": torch.randn(1000), "small": torch.randn(10) * 1e-3}
    with pytest.warns(UserWarning, match=r"every remaining entry of params\['small'\].*min_keep"):
        plain = fprune.global_unstructured(params, 0.9)
    assert not plain["small"].any()
    for amount, floor, kept in ((0.9, 3, 3), (0.7, 0.25, 2)):  # 0.25: round(2.5) = 2 of 10
        masks = fprune.global_unstructured(params, amount, min_keep=floor)
        assert int(masks["small"].sum()) == kept
        assert int((~masks["big"]).sum() + (~masks["small"]).sum()) == round(amount * 1010)
    # Under a transform the count is capped at what the floors allow; eagerly, it raises.
    capped = vmap(lambda a: fprune.global_unstructured(params, a, min_keep=3))(torch.tensor([1.0]))
    assert int(capped["small"].sum()) == 3 and int(capped["big"].sum()) == 3
    with pytest.raises(ValueError, match="min_keep=3 lets at most 1004 of the remaining 1010"):
        fprune.global_unstructured(params, 1.0, min_keep=3)


def test_no_collapse_warning_when_nothing_is_emptied_or_under_vmap(recwarn):
    params = {"a": torch.randn(5000), "b": torch.randn(7)}
    fprune.global_unstructured(params, 0.5)
    vmap(lambda p: fprune.global_unstructured(p, 1.0))({k: v[None] for k, v in params.items()})
    fprune.global_unstructured(params, 0.5, masks={"b": torch.zeros(7, dtype=torch.bool)})  # emptied before
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize(
    "value, error",
    [(-1, ValueError), (1.5, ValueError), (math.nan, ValueError), ("1", TypeError), (True, TypeError)],
)
def test_bad_min_keep(value, error):
    with pytest.raises(error, match="min_keep"):
        fprune.global_unstructured({"w": torch.randn(4)}, 0.5, min_keep=value)


# ---------------------------------------------------------------------------------------------
# Empty inputs: one rule for no leaf and for empty leaves


@pytest.mark.parametrize(
    "params", [{}, [], {"w": torch.empty(0)}, {"w": torch.empty(0), "v": torch.empty(3, 0)}]
)
def test_empty_inputs_follow_one_rule(params):
    """A fraction of nothing is nothing; a count above what remains raises, whether the global
    ranking has no leaf or only empty ones. Per-leaf functions check each leaf: with no leaf
    there is nothing to check."""
    for amount in (0.0, 0.5, 1.0, 0):
        for fn in (fprune.global_unstructured, fprune.l1_unstructured, fprune.rowwise_unstructured):
            masks = fn(params, amount)
            assert type(masks) is type(params) and len(masks) == len(params)
            assert all(
                m.dtype == torch.bool and m.numel() == 0
                for m in (masks.values() if isinstance(masks, dict) else masks)
            )
    with pytest.raises(ValueError, match="amount=3 is more than the 0 parameters left to prune"):
        fprune.global_unstructured(params, 3)
    if params:
        with pytest.raises(ValueError, match=r"the 0 parameters left to prune in params\['"):
            fprune.l1_unstructured(params, 3)
    else:
        assert fprune.l1_unstructured(params, 3) == params


def test_scores_batched_while_params_are_not():
    """A score function may make batched scores from unbatched params (a batched seed under vmap,
    scores vmapped with params=): the traced path is taken for them."""
    params = {"w": torch.randn(4, 6), "v": torch.randn(5)}
    seeds = torch.tensor([1, 2, 3])
    for fn in (
        lambda s: fprune.random_unstructured(params, 0.5, generator=s),
        lambda s: fprune.random_structured(params, 0.5, 0, generator=s, where=lambda n, p: p.dim() > 1),
    ):
        batched = vmap(fn, randomness="different")(seeds)
        for i, seed in enumerate(seeds):
            assert same({k: v[i] for k, v in batched.items()}, fn(seed))
    scores = torch.randn(3, 4, 6)
    batched = vmap(lambda s: select({"w": s}, 0.5, params={"w": params["w"]}))(scores)
    for i in range(3):
        assert torch.equal(batched["w"][i], select({"w": scores[i]}, 0.5)["w"])
    batched = vmap(
        lambda s: fprune.global_unstructured(params, 0.5, importance_scores={"w": s, "v": params["v"]})
    )(scores)
    for i in range(3):
        want = fprune.global_unstructured(params, 0.5, importance_scores={"w": scores[i], "v": params["v"]})
        assert same({k: v[i] for k, v in batched.items()}, want)
