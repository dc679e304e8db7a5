"""apply_masks and masked_call: partial mask dicts, float masks, exact zeros, buffers, sparsity."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from tests.strategies import prior_masks, tensors


@given(st.data())
def test_apply_masks_zeroes_exactly_the_pruned_entries(data):
    w = data.draw(tensors())
    m = data.draw(prior_masks(w.shape))
    out = fprune.apply_masks({"w": w}, {"w": m})["w"]
    finite = w.isfinite()
    assert (out[~m & finite] == 0).all()
    assert torch.equal(out[m].nan_to_num(), w[m].nan_to_num()) and torch.equal(out[m].isnan(), w[m].isnan())


def test_apply_masks_computes_what_torch_hooks_compute():
    # torch's hook: weight = weight_orig * weight_mask (a pruned inf or NaN gives NaN).
    w = torch.tensor([float("inf"), float("nan"), -2.0, 1.0])
    bool_mask = torch.tensor([False, False, False, True])
    want = w * bool_mask.float()
    for mask in (bool_mask, bool_mask.float(), bool_mask.double(), bool_mask.to(torch.int8)):
        torch.testing.assert_close(fprune.apply_masks(w, mask), want, equal_nan=True, rtol=0, atol=0)


def test_missing_keys_mean_unpruned_and_float_masks_work():
    params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
    out = fprune.apply_masks(params, {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]])})
    assert torch.equal(out["w"], torch.eye(2)) and out["b"] is params["b"]
    assert list(out) == ["w", "b"]


def test_nested_partial_masks():
    params = {"enc": {"w": torch.ones(2), "b": torch.ones(1)}, "head": [torch.ones(3)]}
    out = fprune.apply_masks(params, {"enc": {"w": torch.tensor([True, False])}})
    assert torch.equal(out["enc"]["w"], torch.tensor([1.0, 0.0])) and out["head"][0] is params["head"][0]


def test_apply_masks_keeps_dtype_and_device():
    w = torch.ones(3, dtype=torch.float16)
    assert fprune.apply_masks(w, torch.tensor([True, False, True])).dtype == torch.float16


def test_masked_call_uses_buffers_and_unlisted_params_as_they_are():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3)
    )
    model.eval()
    model[1].running_mean.uniform_()
    x = torch.randn(2, 2, 6, 6)
    params = {"0.weight": model[0].weight.detach()}
    masks = fprune.l1_unstructured(params, 0.5)
    out = fprune.masked_call(model, params, masks, (x,))
    with torch.no_grad():
        model[0].weight.mul_(masks["0.weight"])
        expected = model(x)
    assert torch.allclose(out, expected)


def test_masked_call_passes_kwargs():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

        def forward(self, x, *, factor=1.0):
            return self.w * x * factor

    model = Scale()
    out = fprune.masked_call(
        model,
        dict(model.named_parameters()),
        {"w": torch.tensor([False, True])},
        (torch.ones(2),),
        {"factor": 3.0},
    )
    assert torch.equal(out, torch.tensor([0.0, 6.0]))


@given(st.data())
def test_sparsity_counts_pruned_entries(data):
    masks = {"a": data.draw(prior_masks((3, 4))), "b": data.draw(prior_masks((5,)))}
    s = fprune.sparsity(masks)
    pruned = {k: int((~v).sum()) for k, v in masks.items()}
    assert float(s.per_leaf["a"]) == pruned["a"] / 12 and float(s.per_leaf["b"]) == pruned["b"] / 5
    assert float(s.overall) == (pruned["a"] + pruned["b"]) / 17


def test_sparsity_of_float_masks_empty_leaves_and_empty_trees():
    s = fprune.sparsity({"a": torch.tensor([1.0, 0.0]), "e": torch.ones(0, dtype=torch.bool)})
    assert float(s.per_leaf["a"]) == 0.5 and float(s.per_leaf["e"]) == 0.0 and float(s.overall) == 0.5
    assert float(fprune.sparsity({}).overall) == 0.0


def test_sparsity_under_vmap_and_compile():
    masks = torch.rand(4, 10) < 0.5
    batched = torch.func.vmap(lambda m: fprune.sparsity({"m": m}).overall)(masks)
    assert torch.allclose(batched, (~masks).double().mean(dim=1))
    compiled = torch.compile(lambda m: fprune.sparsity({"m": m}).overall, fullgraph=True, backend="eager")
    assert float(compiled(masks[0])) == float((~masks[0]).double().mean())


# ---- keys that match nothing in the module are errors, not silently dense ----------------------

import pytest  # noqa: E402


def _pruned_lenet():
    import torch.nn.utils.prune as torch_prune

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    torch_prune.l1_unstructured(model[0], "weight", amount=0.5)
    return model


def test_masked_call_rejects_hook_names_that_would_run_the_dense_weight():
    hooked = _pruned_lenet()
    params = {k: v.detach() for k, v in hooked.named_parameters()}  # "0.weight_orig", ...
    masks = {k: torch.zeros(v.shape, dtype=torch.bool) for k, v in params.items()}  # prune 100%
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"params\['0.weight_orig'\] names no parameter or buffer") as info:
        fprune.masked_call(plain, params, masks, (torch.randn(1, 4),))
    message = str(info.value)
    assert "nearest: '0.weight'" in message and "hooks_to_functional" in message


def test_masked_call_names_the_nearest_real_names_for_a_prefix_mistake():
    model = torch.nn.Linear(3, 2)
    params = {"model.weight": torch.ones(2, 3), "bias": torch.ones(2)}
    with pytest.raises(
        ValueError, match=r"params\['model.weight'\] .*nearest: 'weight'.*unknown keys: 'model.weight'"
    ):
        fprune.masked_call(model, params, {}, (torch.ones(1, 3),))


def test_masked_call_rejects_mask_keys_missing_from_params_with_nearest_names():
    model = torch.nn.Linear(3, 2)
    params = dict(model.named_parameters())
    with pytest.raises(
        ValueError,
        match=r"masks\['weigth'\] has no matching entry in params \(nearest in params: params\['weight'\]\)",
    ):
        fprune.masked_call(model, params, {"weigth": torch.ones(2, 3, dtype=torch.bool)}, (torch.ones(1, 3),))


def test_masked_call_accepts_buffers_and_tied_aliases():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    model[0].register_parameter("alias", model[0].weight)  # a tied second name
    names = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    out = fprune.masked_call(model.eval(), names, {}, (torch.ones(2, 3),))
    assert out.shape == (2, 3)


def test_tree_mismatch_messages_are_short_and_name_the_keys():
    params = {f"layer{i}.{kind}": torch.ones(2) for i in range(40) for kind in ("weight", "bias")}
    masks = {"layer1.wieght": torch.ones(2, dtype=torch.bool), "extra": torch.ones(2, dtype=torch.bool)}
    with pytest.raises(ValueError) as info:
        fprune.apply_masks(params, masks)
    message = str(info.value)
    assert len(message) < 400 and "PyTreeSpec" not in message
    assert "params['layer1.weight']" in message and "masks['extra']" in message
    scores = {k: v for k, v in params.items() if k.startswith("layer1")}
    with pytest.raises(ValueError, match=r"Missing: params\['layer0.bias'\], .* and 53 more") as info:
        fprune.l1_unstructured(params, 1, importance_scores=scores)
    assert len(str(info.value)) < 400 and "PyTreeSpec" not in str(info.value)


def test_masked_call_refuses_params_that_a_prune_hook_would_overwrite():
    hooked = _pruned_lenet()
    params = {"0.weight": torch.zeros(3, 4)}
    with pytest.raises(
        ValueError, match=r"params\['0.weight'\] is recomputed by a torch.nn.utils.prune hook.*strip_pruning"
    ):
        fprune.masked_call(hooked, params, {}, (torch.randn(1, 4),))


def test_masked_call_still_replaces_plain_tensor_attributes():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.tensor(2.0)  # neither a parameter nor a buffer

        def forward(self, x):
            return x * self.scale

    out = fprune.masked_call(Scaled(), {"scale": torch.tensor(3.0)}, {}, (torch.ones(2),))
    assert out.tolist() == [3.0, 3.0]
