"""Runs of alike small leaves (fprune.select._LeafRuns): per-leaf and structured selections batched
over stacked scores give the masks of the leaf-by-leaf engine, with the same tie-break, and
the reference's; mixed runs, prior masks, per-leaf amounts, where=, transforms."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import vmap

import fprune
from fprune.select import _local
from tests import reference

pytestmark = pytest.mark.filterwarnings("ignore::fprune.select.LayerCollapseWarning")


@pytest.fixture
def leaf_by_leaf(monkeypatch):
    """Run a call with the runs switched off (every leaf to the engine on its own)."""

    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(_local, "RUN_MAX", 0)
            return fn()

    return run


def mixed_params(seed=0, ties=True):
    """Runs of several shapes interleaved, a leaf above RUN_MAX, ties within and across leaves."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 6), (3, 5), (4, 6), (7,), (4, 6), (3, 5), (2, 3, 4), (4, 6), (40, 50), (7,)]
    params = {}
    for j in range(60):
        shape = shapes[(j // 3 + j % 2 * (j // 9)) % len(shapes)]  # runs of consecutive alike leaves
        p = torch.randn(shape, generator=g)
        if ties and j % 3 == 0:
            p.view(-1)[::2] = 0.25  # ties inside a leaf and across the leaves of a run
        if ties and j % 5 == 0:
            p.fill_(-1.0)  # a leaf of equal scores: the first entries go
        params[f"l{j:02d}"] = p
    return params


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == torch.bool and a[name].shape == b[name].shape
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("amount", [0.0, 0.3, 0.5, 0.97, 1.0, 0, 3, 6])
@pytest.mark.parametrize("signed", [False, True])
def test_l1_in_runs_equals_leaf_by_leaf_and_the_reference(monkeypatch, leaf_by_leaf, amount, signed):
    monkeypatch.setattr(_local, "RUN_MAX", 1000)
    monkeypatch.setattr(_local, "RUN_ENTRIES", 50)  # many batches per run
    params = mixed_params()
    got = fprune.l1_unstructured(params, amount, signed=signed)
    assert_same(got, leaf_by_leaf(lambda: fprune.l1_unstructured(params, amount, signed=signed)))
    for name, p in params.items():
        scores = p if signed else p.abs()
        assert torch.equal(got[name], reference.lowest([scores], amount)[0]), name


def test_l1_in_runs_with_prior_masks_per_leaf_amounts_where_and_scores(monkeypatch, leaf_by_leaf):
    monkeypatch.setattr(_local, "RUN_ENTRIES", 40)
    params = mixed_params(1)
    g = torch.Generator().manual_seed(2)
    masks = {
        name: torch.rand(p.shape, generator=g) > 0.3
        for j, (name, p) in enumerate(params.items())
        if j % 4 == 0
    }
    masks = {name: masks.get(name, torch.ones_like(p, dtype=torch.bool)) for name, p in params.items()}
    scores = {name: torch.randn(p.shape, generator=g).to(torch.float64) for name, p in params.items()}
    amounts = {name: (0.5 if j % 3 else 2) for j, name in enumerate(params) if j % 7}
    where = lambda name, p: not name.endswith("3")
    calls = [
        lambda: fprune.l1_unstructured(params, 0.4, masks=masks),
        lambda: fprune.l1_unstructured(params, amounts),
        lambda: fprune.l1_unstructured(params, 0.6, where=where, masks=masks),
        lambda: fprune.l1_unstructured(params, 0.5, importance_scores=scores),
        lambda: fprune.l1_unstructured({k: v.half() for k, v in params.items()}, 0.5),
        lambda: fprune.random_unstructured(params, 0.5, generator=3),
        lambda: fprune.random_unstructured(params, 0.5, generator=torch.Generator().manual_seed(4)),
    ]
    for call in calls:
        assert_same(call(), leaf_by_leaf(call))


def test_runs_equal_a_loop_of_single_leaf_calls_with_nan_and_inf():
    g = torch.Generator().manual_seed(5)
    params = {f"w{j}": torch.randn(5, 8, generator=g) for j in range(30)}
    params["w3"][0, :3] = float("nan")
    params["w4"][1, :] = float("inf")
    params["w5"][:] = float("nan")
    masks = fprune.l1_unstructured(params, 0.5)
    for name, p in params.items():
        assert torch.equal(masks[name], fprune.l1_unstructured({"x": p}, 0.5)["x"])
        assert torch.equal(masks[name], reference.lowest([p.abs()], 0.5)[0])


@pytest.mark.parametrize("n", [1, 2, 3, math.inf, -math.inf, 0.5])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_ln_structured_in_runs_equals_leaf_by_leaf(monkeypatch, leaf_by_leaf, n, dim):
    monkeypatch.setattr(_local, "RUN_ENTRIES", 100)
    params = {k: v for k, v in mixed_params(6).items() if v.dim() > 1}
    for p in list(params.values())[::4]:
        p.select(dim, 0).zero_()  # zero channels: ties within and across leaves
        p.select(dim, -1).zero_()
    for amount in (0.0, 0.5, 1, 1.0):
        call = lambda *, amount=amount: fprune.ln_structured(params, amount, n, dim)
        got = call()
        assert_same(got, leaf_by_leaf(call))
        for name, p in params.items():
            d = dim % p.dim()
            others = [x for x in range(p.dim()) if x != d]
            keep = reference.channel_lowest(torch.norm(p, p=n, dim=others), amount, None)
            shape = [1] * p.dim()
            shape[d] = -1
            assert torch.equal(got[name], keep.view(shape).expand(p.shape)), name


def test_structured_runs_with_prior_masks_scores_and_random(leaf_by_leaf):
    params = {k: v for k, v in mixed_params(7).items() if v.dim() > 1}
    g = torch.Generator().manual_seed(8)
    masks = {
        name: torch.rand(p.shape, generator=g) > 0.2 if j % 3 == 0 else torch.ones_like(p, dtype=torch.bool)
        for j, (name, p) in enumerate(params.items())
    }
    scores = {name: torch.randn(p.shape, generator=g) for name, p in params.items()}
    calls = [
        lambda: fprune.ln_structured(params, 0.5, 2, 0, masks=masks),
        lambda: fprune.ln_structured(params, 0.5, 1, 1, importance_scores=scores),
        lambda: fprune.ln_structured(params, dict.fromkeys(list(params)[::2], 1), 2, 0),
        lambda: fprune.ln_structured(params, 0.5, "fro", 0),
        lambda: fprune.random_structured(params, 0.5, 0, generator=9),
        lambda: fprune.random_structured(params, 0.5, 1, generator=torch.Generator().manual_seed(9)),
        lambda: fprune.select.select(
            {k: v.norm(dim=1) for k, v in params.items() if v.dim() == 2},
            2,
            scope=fprune.select.Channels(0),
            params={k: v for k, v in params.items() if v.dim() == 2},
        ),
    ]
    for call in calls:
        assert_same(call(), leaf_by_leaf(call))


def test_traced_paths_equal_the_runs():
    params = mixed_params(10)
    eager = fprune.l1_unstructured(params, 0.5)
    traced = vmap(lambda a: fprune.l1_unstructured(params, a))(torch.tensor([0.5, 0.5]))
    for name in params:
        assert torch.equal(traced[name][1], eager[name])
    # A batched seed makes batched scores from unbatched params: those leaves take the traced path.
    seeds = torch.tensor([3, 4])
    batched = vmap(lambda s: fprune.random_unstructured(params, 0.5, generator=s))(seeds)
    for j, seed in enumerate((3, 4)):
        eager = fprune.random_unstructured(params, 0.5, generator=torch.tensor(seed))
        for name in params:
            assert torch.equal(batched[name][j], eager[name]), name
    matrices = {k: v for k, v in params.items() if v.dim() > 1}
    eager = fprune.ln_structured(matrices, 0.5, 2, 0)
    traced = vmap(lambda a: fprune.ln_structured(matrices, a, 2, 0))(torch.tensor([0.5]))
    for name in matrices:
        assert torch.equal(traced[name][0], eager[name])


def test_the_first_leaf_whose_count_is_wrong_is_named():
    params = {"a": torch.randn(10), "b": torch.randn(3), "c": torch.randn(2, 2), "d": torch.randn(3)}
    with pytest.raises(ValueError, match=r"params\['b'\]"):
        fprune.l1_unstructured(params, 4)
    with pytest.raises(ValueError, match=r"params\['a'\] along dim 0"):
        fprune.ln_structured({"a": torch.randn(2, 2), "c": torch.randn(5, 2)}, 3, 2, 0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([(3,), (2, 2), (4,), (1,)]), min_size=1, max_size=12),
    st.lists(st.integers(-2, 2), min_size=48, max_size=48),
    st.one_of(st.floats(0.0, 1.0), st.integers(0, 1)),
)
def test_runs_of_small_integer_scores_match_the_reference(shapes, values, amount):
    params, at = {}, 0
    for j, shape in enumerate(shapes):
        n = math.prod(shape)
        params[f"p{j:02d}"] = torch.tensor(values[at : at + n], dtype=torch.float32).reshape(shape)
        at += n
    masks = fprune.l1_unstructured(params, amount)
    for name, p in params.items():
        assert torch.equal(masks[name], reference.lowest([p.abs()], amount)[0])


def test_runs_of_channels_last_and_strided_leaves(leaf_by_leaf):
    g = torch.Generator().manual_seed(11)
    params = {
        f"c{j}": torch.randn(3, 4, 2, 2, generator=g).to(memory_format=torch.channels_last) for j in range(6)
    }
    params.update({f"t{j}": torch.randn(5, 3, generator=g).t() for j in range(6)})
    for call in (
        lambda: fprune.l1_unstructured(params, 0.5),
        lambda: fprune.ln_structured(params, 0.5, 2, 1),
    ):
        got = call()
        assert_same(got, leaf_by_leaf(call))
        assert all(m.is_contiguous() for m in got.values())
    masks = fprune.l1_unstructured(params, 0.5)
    for name, p in params.items():
        assert torch.equal(masks[name], reference.lowest([p.abs()], 0.5)[0])


@pytest.mark.parametrize("amount", [0.0, 0.3, 0.5, 0.9, 1.0, 7])
def test_global_over_stacked_runs_equals_leaf_by_leaf_and_the_reference(leaf_by_leaf, amount):
    params = mixed_params(12)
    got = fprune.global_unstructured(params, amount)
    assert_same(got, leaf_by_leaf(lambda: fprune.global_unstructured(params, amount)))
    names = list(params)  # a dict flattens in sorted key order: l00, l01, ...
    want = reference.lowest([params[n].abs() for n in names], amount)
    for name, keep in zip(names, want, strict=True):
        assert torch.equal(got[name], keep), name


def test_global_stacked_runs_with_prior_masks_where_signed_scores_and_options(leaf_by_leaf):
    params = mixed_params(13)
    g = torch.Generator().manual_seed(14)
    masks = {
        name: torch.rand(p.shape, generator=g) > 0.3 if j % 5 == 2 else torch.ones_like(p, dtype=torch.bool)
        for j, (name, p) in enumerate(params.items())
    }
    scores = {name: torch.randn(p.shape, generator=g) for name, p in params.items()}
    where = lambda name, p: name[-1] not in "37"
    calls = [
        lambda: fprune.global_unstructured(params, 0.5, masks=masks),
        lambda: fprune.global_unstructured(params, 0.4, where=where),
        lambda: fprune.global_unstructured(params, 0.5, importance_scores=scores, signed=True),
        lambda: fprune.global_unstructured(params, 0.5, normalize="l1"),
        lambda: fprune.global_unstructured(params, 0.8, min_keep=2),
        lambda: fprune.global_unstructured({k: v.double() for k, v in params.items()}, 0.5),
        lambda: fprune.global_unstructured([params, {k: v.half() for k, v in params.items()}], 0.5),
    ]
    for call in calls:
        got, want = call(), leaf_by_leaf(call)
        for a, b in zip(
            torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want), strict=True
        ):
            assert torch.equal(a, b)


def test_global_stacked_runs_warn_about_the_leaves_they_empty():
    params = {f"w{j}": torch.full((3, 4), 10.0) for j in range(8)}
    params["w2"] = torch.full((3, 4), 0.1)
    params["w5"] = torch.full((3, 4), 0.2)
    with pytest.warns(fprune.select.LayerCollapseWarning, match=r"params\['w2'\], params\['w5'\] \(layer"):
        masks = fprune.global_unstructured(params, 24)
    assert not masks["w2"].any() and not masks["w5"].any() and masks["w0"].all()


def test_global_traced_equals_stacked_runs():
    params = mixed_params(15)
    eager = fprune.global_unstructured(params, 0.5)
    traced = vmap(lambda a: fprune.global_unstructured(params, a))(torch.tensor([0.5]))
    for name in params:
        assert torch.equal(traced[name][0], eager[name])


def test_a_collapse_of_many_leaves_names_the_first_eight_and_counts_the_rest():
    params = {f"w{j:02d}": torch.full((2,), 0.1 if j < 20 else 10.0) for j in range(30)}
    with pytest.warns(fprune.select.LayerCollapseWarning) as caught:
        masks = fprune.global_unstructured(params, 40)
    message = str(caught[0].message)
    assert "params['w00'], params['w01']" in message and "params['w07'] and 12 more (layer" in message
    assert "params['w08']" not in message
    assert sum(not m.any() for m in masks.values()) == 20
