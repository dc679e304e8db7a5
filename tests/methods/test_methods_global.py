"""Global unstructured masks: one ranking across leaves, tie-break by leaf order, normalization."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils import prune as torch_prune

import fprune
from tests import reference
from tests.strategies import amounts, prior_masks, tensors


@given(st.data())
def test_global_matches_reference_across_leaves_in_sorted_key_order(data):
    # Inserted as "b", "a": optree (and so the tie-break) goes by sorted keys, "a" first.
    b, a = data.draw(tensors()), data.draw(tensors())
    params = {"b": b, "a": a}
    with_prior = data.draw(st.booleans())
    prior = (
        {"b": data.draw(prior_masks(b.shape)), "a": data.draw(prior_masks(a.shape))} if with_prior else None
    )
    alive = a.numel() + b.numel() if prior is None else int(prior["a"].sum() + prior["b"].sum())
    amount = data.draw(amounts(alive))
    got = fprune.global_unstructured(params, amount, masks=prior)
    want_a, want_b = reference.lowest(
        [a.abs(), b.abs()], amount, None if prior is None else [prior["a"], prior["b"]]
    )
    assert list(got) == ["b", "a"], "the result keeps the caller's dict"
    assert torch.equal(got["a"], want_a) and torch.equal(got["b"], want_b)


@given(st.data())
def test_global_over_one_leaf_equals_local(data):
    w = data.draw(tensors())
    prior = data.draw(prior_masks(w.shape))
    amount = data.draw(amounts(int(prior.sum())))
    assert torch.equal(
        fprune.global_unstructured(w, amount, masks=prior), fprune.l1_unstructured(w, amount, masks=prior)
    )


@given(st.data())
def test_global_masks_nest_as_amount_grows(data):
    params = [data.draw(tensors()), data.draw(tensors())]
    lo, hi = sorted([data.draw(st.floats(0, 1)), data.draw(st.floats(0, 1))])
    small, large = fprune.global_unstructured(params, lo), fprune.global_unstructured(params, hi)
    for s, big in zip(small, large, strict=True):
        assert not (big & ~s).any()


@given(st.data(), st.sampled_from(["l1", "l2"]), st.integers(-6, 6))
def test_normalized_ranking_ignores_a_leaf_scale(data, norm, exponent):
    a, b = data.draw(tensors(ties=1000)), data.draw(tensors(ties=1000))
    amount = data.draw(st.floats(0, 1))
    scale = 2.0**exponent  # a power of two scales exactly, so only the ranking could change
    plain = fprune.global_unstructured({"a": a, "b": b}, amount, normalize=norm)
    scaled = fprune.global_unstructured({"a": a * scale, "b": b}, amount, normalize=norm)
    assert torch.equal(plain["a"], scaled["a"]) and torch.equal(plain["b"], scaled["b"])


def test_normalization_protects_a_small_scale_layer():
    params = {"big": torch.linspace(1, 2, 100), "small": torch.linspace(1, 2, 100) * 1e-3}
    plain = fprune.global_unstructured(params, 0.5)
    assert not plain["small"].any(), "torch's ranking wipes out the small layer"
    for norm in ("l1", "l2", True):
        balanced = fprune.sparsity(fprune.global_unstructured(params, 0.5, normalize=norm)).per_leaf
        assert float(balanced["small"]) == pytest.approx(0.5, abs=0.01)


def test_global_importance_scores_and_where():
    params = {"w1": torch.randn(3, 3), "w2": torch.randn(4), "skip": torch.randn(5)}
    scores = {
        "w1": torch.arange(9.0).reshape(3, 3),
        "w2": torch.tensor([0.5, 9.0, 9.0, 9.0]),
        "skip": torch.zeros(5),
    }
    masks = fprune.global_unstructured(params, 3, importance_scores=scores, where=lambda n, p: n != "skip")
    assert masks["skip"].all()
    assert torch.equal(masks["w2"], torch.tensor([False, True, True, True]))
    assert torch.equal(masks["w1"].view(-1)[:3], torch.tensor([False, False, True]))


def test_where_selecting_nothing_returns_prior_or_all_true():
    params = {"w": torch.randn(3)}
    assert fprune.global_unstructured(params, 0.5, where=lambda n, p: False)["w"].all()


@pytest.mark.parametrize("amount", [0.0, 0.2, 0.5, 0.9, 1.0, 13, 0])
def test_global_unstructured_matches_torch(amount):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch_prune.global_unstructured(
        [(model[0], "weight"), (model[2], "weight"), (model[2], "bias")],
        pruning_method=torch_prune.L1Unstructured,
        amount=amount,
    )
    masks = fprune.global_unstructured(params, amount, where=lambda n, p: n != "0.bias")
    assert torch.equal(masks["0.weight"], model[0].weight_mask.bool())
    assert torch.equal(masks["2.weight"], model[2].weight_mask.bool())
    assert torch.equal(masks["2.bias"], model[2].bias_mask.bool())
    assert masks["0.bias"].all()


def test_iterative_global_matches_torch():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Linear(8, 3))
    params = {name: p.detach().clone() for name, p in model.named_parameters() if name.endswith("weight")}
    pairs = [(model[0], "weight"), (model[1], "weight")]
    masks = None
    for amount in (0.3, 0.5, 7):
        torch_prune.global_unstructured(pairs, pruning_method=torch_prune.L1Unstructured, amount=amount)
        masks = fprune.global_unstructured(params, amount, masks=masks)
        assert torch.equal(masks["0.weight"], model[0].weight_mask.bool())
        assert torch.equal(masks["1.weight"], model[1].weight_mask.bool())


@pytest.mark.parametrize(
    "prune",
    [
        lambda p: fprune.global_unstructured(p, 5),
        lambda p: fprune.l1_unstructured(p, 0.5),
        lambda p: fprune.random_unstructured(p, 0.5),
        lambda p: fprune.select.select(p, 5, scope=fprune.select.Global()),
    ],
)
def test_the_same_tensor_under_two_keys_raises_naming_both(prune):
    # One tensor under two keys would be ranked twice (the count doubled) and a tie could split
    # between the copies, giving one tensor two masks: it raises, naming both keys.
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 0.5, 0.5, 6.0, 7.0])
    with pytest.raises(
        ValueError, match=r"same tensor appears as (params|scores)\['a'\] and (params|scores)\['c'\]"
    ):
        prune({"a": w, "b": torch.ones(3), "c": w})
    # equal values in two tensors are fine: identity, not equality
    masks = fprune.global_unstructured({"a": w, "c": w.clone()}, 5)
    assert int(masks["a"].sum() + masks["c"].sum()) == 15
