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
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))
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
    out = fprune.masked_call(model, dict(model.named_parameters()), {"w": torch.tensor([False, True])}, (torch.ones(2),), {"factor": 3.0})
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
