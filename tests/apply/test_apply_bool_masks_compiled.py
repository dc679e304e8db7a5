"""masked_call with the bool masks fprune returns: eager and compiled give torch's values and
gradients; when compiling, the bool masks reach the graph as uint8 (inductor reads bool slowly)."""

import pytest
import torch
import torch.nn.functional as F

import fprune
from fprune import _torch


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.5, where=lambda name, p: p.dim() > 1)
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    return model, params, masks, x, y


def _loss(model, params, masks, x, y):
    return F.cross_entropy(fprune.masked_call(model, params, masks, (x,)), y)


def _reference(model, params, masks, x, y):
    # torch's hook arithmetic: weight * mask in the weight's dtype
    pruned = {k: p * masks[k].to(p.dtype) for k, p in params.items()}
    return F.cross_entropy(torch.func.functional_call(model, pruned, (x,)), y)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_bool_masks_give_torchs_values_and_gradients(backend):
    model, params, masks, x, y = _setup()
    expected = _reference(model, params, masks, x, y)
    (expected_grads,) = [torch.autograd.grad(expected, list(params.values()))]
    compiled = torch.compile(_loss, backend=backend, fullgraph=True)
    got = compiled(model, params, masks, x, y)
    grads = torch.autograd.grad(got, list(params.values()))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_eager_bool_masks_equal_float_masks_exactly():
    model, params, masks, x, y = _setup(1)
    as_float = {k: m.float() for k, m in masks.items()}
    a, b = _loss(model, params, masks, x, y), _loss(model, params, as_float, x, y)
    assert torch.equal(a, b)
    ga, gb = (torch.autograd.grad(v, list(params.values())) for v in (a, b))
    assert all(torch.equal(p, q) for p, q in zip(ga, gb, strict=True))


def test_the_graph_reads_the_masks_as_uint8():
    model, params, masks, x, y = _setup()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm

    torch.compile(_loss, backend=backend, fullgraph=True)(model, params, masks, x, y)
    assert any("mask_as_uint8" in target for target in seen)


def test_vmap_of_masked_call_with_bool_masks_compiles():
    model, params, masks, x, _ = _setup()
    stacked = {k: torch.stack([p.detach(), p.detach() * 2]) for k, p in params.items()}
    stacked_masks = {k: torch.stack([m, ~m]) for k, m in masks.items()}

    def forward(p, m):
        return fprune.masked_call(model, p, m, (x,))

    eager = torch.func.vmap(forward)(stacked, stacked_masks)
    compiled = torch.compile(torch.func.vmap(forward), backend="aot_eager", fullgraph=True)(
        stacked, stacked_masks
    )
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_tensor_version_fallback_checks_every_time(monkeypatch):
    params = {"w": torch.randn(3)}
    masks = {"w": torch.tensor([1.0, 0.0, 1.0])}
    fprune.apply_masks(params, masks)
    monkeypatch.setattr(_torch, "tensor_version", lambda tensor: None)  # a torch without it
    masks["w"].data = torch.tensor([1.0, 0.5, 1.0])  # .data swaps the values without a version bump
    with pytest.raises(ValueError, match="to hold only 0 and 1"):
        fprune.apply_masks(params, masks)
    with torch.inference_mode():
        frozen = torch.tensor([1.0, 0.0, 1.0])  # inference tensors have no version counter
    assert _torch.tensor_version(frozen) is None
    fprune.apply_masks(params, {"w": frozen})


def test_allow_loading_fallback(monkeypatch):
    monkeypatch.setattr(_torch, "_ADD_SAFE_GLOBALS", None)
    assert _torch.allow_loading(fprune.PackedMask) is False
