"""apply_masks / masked_call with straight_through=True: masked values, dense gradient."""

import pytest
import torch
from torch.func import grad, vmap

import fprune


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    params = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
    masks = {n: torch.rand(p.shape, generator=g) > 0.5 for n, p in params.items() if n.endswith("weight")}
    x = torch.randn(4, 6, generator=g)
    return model, params, masks, x


def _dense_grad_reference(model, params, masks, x):
    # The straight-through gradient is the gradient of the loss at the pruned values with
    # respect to those values: differentiate through plain pruned tensors.
    pruned = {
        n: (p * masks[n]).detach().requires_grad_() if n in masks else p.detach().requires_grad_()
        for n, p in params.items()
    }
    torch.func.functional_call(model, pruned, (x,)).square().sum().backward()
    return {n: t.grad for n, t in pruned.items()}


def test_values_equal_plain_masking():
    model, params, masks, x = _setup()
    a = fprune.apply_masks(params, masks, straight_through=True)
    b = fprune.apply_masks(params, masks)
    assert all(torch.equal(a[k], b[k]) for k in params)
    assert torch.equal(
        fprune.masked_call(model, params, masks, (x,), straight_through=True),
        fprune.masked_call(model, params, masks, (x,)),
    )


def test_gradient_is_dense_and_equals_reference():
    model, params, masks, x = _setup()
    leaves = {n: p.clone().requires_grad_() for n, p in params.items()}
    fprune.masked_call(model, leaves, masks, (x,), straight_through=True).square().sum().backward()
    ref = _dense_grad_reference(model, params, masks, x)
    for n in params:
        torch.testing.assert_close(leaves[n].grad, ref[n])
    # dense: nonzero at pruned entries too (the masked gradient would be zero there)
    assert (leaves["0.weight"].grad[~masks["0.weight"]] != 0).any()
    # and the masked gradient is the dense one times the mask
    plain = {n: p.clone().requires_grad_() for n, p in params.items()}
    fprune.masked_call(model, plain, masks, (x,)).square().sum().backward()
    torch.testing.assert_close(plain["0.weight"].grad, leaves["0.weight"].grad * masks["0.weight"])


def test_under_torch_func_grad_vmap_and_compile():
    model, params, masks, x = _setup()
    ref = _dense_grad_reference(model, params, masks, x)

    def loss(p, m):
        return fprune.masked_call(model, p, m, (x,), straight_through=True).square().sum()

    g = grad(loss)(params, masks)
    for n in params:
        torch.testing.assert_close(g[n], ref[n])
    stacked = {n: torch.stack([p, p]) for n, p in params.items()}
    stacked_masks = {n: torch.stack([m, m]) for n, m in masks.items()}
    gv = vmap(grad(loss))(stacked, stacked_masks)
    for n in params:
        torch.testing.assert_close(gv[n][1], ref[n])
    torch._dynamo.reset()
    gc = torch.compile(grad(loss), fullgraph=True, backend="aot_eager")(params, masks)
    for n in params:
        torch.testing.assert_close(gc[n], ref[n])


def test_float_masks_and_bad_flag():
    _, params, masks, _ = _setup()
    w = params["0.weight"].clone().requires_grad_()
    out = fprune.apply_masks({"w": w}, {"w": masks["0.weight"].float()}, straight_through=True)
    out["w"].sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))
    with pytest.raises(TypeError, match="straight_through"):
        fprune.apply_masks(params, masks, straight_through="yes")
