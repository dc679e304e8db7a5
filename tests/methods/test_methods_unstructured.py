"""Local unstructured masks: exact counts, the tie-break rule, prior masks, nesting, purity."""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from tests import reference
from tests.strategies import amounts, prior_masks, tensors


@given(st.data())
def test_l1_unstructured_matches_reference(data):
    w = data.draw(tensors())
    amount = data.draw(amounts(w.numel()))
    got = fprune.l1_unstructured({"w": w}, amount)["w"]
    (want,) = reference.lowest([w.abs()], amount)
    assert got.dtype == torch.bool and got.shape == w.shape
    assert torch.equal(got, want)


@given(st.data())
def test_l1_unstructured_with_prior_masks_prunes_amount_of_the_remaining(data):
    w = data.draw(tensors())
    prior = data.draw(prior_masks(w.shape))
    alive = int(prior.sum())
    amount = data.draw(amounts(alive))
    got = fprune.l1_unstructured({"w": w}, amount, masks={"w": prior})["w"]
    (want,) = reference.lowest([w.abs()], amount, [prior])
    assert torch.equal(got, want)
    assert not (got & ~prior).any(), "a pruned entry came back"
    assert int((~got).sum()) == (w.numel() - alive) + reference.count(amount, alive)


@given(st.data())
def test_importance_scores_replace_magnitudes(data):
    # Ranked by |importance_scores|, as torch's L1Unstructured does.
    w = data.draw(tensors())
    scores = data.draw(tensors(st.just(w.shape)))
    amount = data.draw(amounts(w.numel()))
    got = fprune.l1_unstructured({"w": w}, amount, importance_scores={"w": scores})["w"]
    (want,) = reference.lowest([scores.abs()], amount)
    assert torch.equal(got, want)


@given(st.data())
def test_masks_are_nested_as_amount_grows(data):
    w = data.draw(tensors())
    a, b = sorted([data.draw(st.floats(0, 1)), data.draw(st.floats(0, 1))])
    small = fprune.l1_unstructured({"w": w}, a)["w"]
    large = fprune.l1_unstructured({"w": w}, b)["w"]
    assert not (large & ~small).any(), "an entry pruned at the lower amount is kept at the higher one"


def test_ties_prune_earlier_positions_first():
    w = torch.tensor([[1.0, 1.0, 1.0], [0.5, 1.0, 1.0]])
    got = fprune.l1_unstructured(w, 3)
    assert torch.equal(got, torch.tensor([[False, False, True], [False, True, True]]))


def test_nan_is_pruned_last_and_negative_zero_ties_with_zero():
    w = torch.tensor([float("nan"), -0.0, 0.0, 2.0, -1.0])
    assert torch.equal(fprune.l1_unstructured(w, 4), torch.tensor([True, False, False, False, False]))
    assert torch.equal(fprune.l1_unstructured(w, 1), torch.tensor([True, False, True, True, True]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64])
def test_dtypes_of_params(dtype):
    w = (torch.arange(12) - 6).to(dtype).reshape(3, 4)
    got = fprune.l1_unstructured({"w": w}, 0.25)["w"]
    (want,) = reference.lowest([w.abs().double()], 0.25)
    assert torch.equal(got, want)


@given(st.data())
def test_random_unstructured_counts_and_prior(data):
    w = data.draw(tensors())
    prior = data.draw(prior_masks(w.shape))
    alive = int(prior.sum())
    amount = data.draw(amounts(alive))
    seed = data.draw(st.integers(0, 2**40))
    got = fprune.random_unstructured({"w": w}, amount, masks={"w": prior}, generator=seed)["w"]
    assert not (got & ~prior).any()
    assert int((~got).sum()) == (w.numel() - alive) + reference.count(amount, alive)
    again = fprune.random_unstructured({"w": w}, amount, masks={"w": prior}, generator=seed)["w"]
    assert torch.equal(got, again)


def test_random_unstructured_sources_of_randomness():
    w = torch.zeros(64, 64)
    by_seed = [fprune.random_unstructured(w, 0.5, generator=s) for s in (0, 1)]
    assert not torch.equal(by_seed[0], by_seed[1])
    assert torch.equal(by_seed[0], fprune.random_unstructured(w, 0.5, generator=torch.tensor(0)))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(
        fprune.random_unstructured(w, 0.5, generator=g1), fprune.random_unstructured(w, 0.5, generator=g2)
    )
    torch.manual_seed(3)
    a = fprune.random_unstructured(w, 0.5)
    torch.manual_seed(3)
    assert torch.equal(a, fprune.random_unstructured(w, 0.5))


def test_random_unstructured_leaves_get_independent_draws():
    params = {"a": torch.zeros(32, 32), "b": torch.zeros(32, 32)}
    masks = fprune.random_unstructured(params, 0.5, generator=5)
    assert not torch.equal(masks["a"], masks["b"])


def test_random_unstructured_is_roughly_uniform():
    hits = torch.zeros(10)
    for seed in range(400):
        hits += (~fprune.random_unstructured(torch.zeros(10), 3, generator=seed)).float()
    # Each entry is pruned with probability 0.3: 120 of 400 expected, sd ~9.
    assert hits.min() > 80 and hits.max() < 160


def test_identity_keeps_everything_and_keeps_structure():
    params = {"b": [torch.randn(2), (torch.randn(3, 1),)], "a": torch.randn(())}
    masks = fprune.identity(params)
    assert masks.keys() == params.keys() and isinstance(masks["b"][1], tuple)
    assert all(m.all() and m.dtype == torch.bool for m in [masks["a"], masks["b"][0], masks["b"][1][0]])


def test_nested_containers_and_a_bare_tensor():
    params = {"block": [torch.tensor([3.0, 1.0]), {"w": torch.tensor([2.0, 0.5])}]}
    masks = fprune.l1_unstructured(params, 1)
    assert torch.equal(masks["block"][0], torch.tensor([True, False]))
    assert torch.equal(masks["block"][1]["w"], torch.tensor([True, False]))
    assert torch.equal(fprune.l1_unstructured(torch.tensor([3.0, 1.0]), 1), torch.tensor([True, False]))


def test_where_selects_leaves_and_others_keep_their_prior_mask():
    params = {"fc.weight": torch.randn(4, 4), "fc.bias": torch.randn(4)}
    prior = {
        "fc.weight": torch.ones(4, 4, dtype=torch.bool),
        "fc.bias": torch.tensor([True, False, True, True]),
    }
    masks = fprune.l1_unstructured(params, 0.5, masks=prior, where=lambda name, p: name.endswith("weight"))
    assert int((~masks["fc.weight"]).sum()) == 8
    assert torch.equal(masks["fc.bias"], prior["fc.bias"])
    fresh = fprune.l1_unstructured(params, 0.5, where=lambda name, p: p.dim() > 1)
    assert fresh["fc.bias"].all()


def test_where_sees_dotted_paths_of_nested_trees():
    seen = []
    fprune.l1_unstructured(
        {"a": [torch.ones(1)], "b": {"c": torch.ones(1)}}, 0, where=lambda n, p: seen.append(n)
    )
    assert seen == ["a.0", "b.c"]


@given(st.data())
def test_inputs_are_never_modified(data):
    w = data.draw(tensors())
    prior = data.draw(prior_masks(w.shape))
    scores = data.draw(tensors(st.just(w.shape)))
    originals = copy.deepcopy((w, prior, scores))
    fprune.l1_unstructured({"w": w}, 0.5, masks={"w": prior}, importance_scores={"w": scores})
    fprune.random_unstructured({"w": w}, 0.5, masks={"w": prior}, generator=1)
    fprune.global_unstructured({"w": w}, 0.5, masks={"w": prior}, normalize="l1")
    for before, after in zip(originals, (w, prior, scores), strict=True):
        assert torch.equal(before.isnan(), after.isnan())
        assert torch.equal(before.nan_to_num(), after.nan_to_num())


def test_float_prior_masks_like_torch_buffers_are_accepted():
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    prior = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert torch.equal(fprune.l1_unstructured(w, 1, masks=prior), torch.tensor([False, False, True, True]))
