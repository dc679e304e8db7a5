"""The re-parametrization contract: same Parameter, mask buffers in the parameter's dtype, hooks
that read the buffer (and hold no mask of their own, pytorch#34257)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune
from tests.compat.compat_helpers import make_net


def _tensors_held_by(hook):
    methods = list(hook) if isinstance(hook, torch_prune.PruningContainer) else [hook]
    return [value for m in [hook, *methods] for value in vars(m).values() if isinstance(value, torch.Tensor)]


def _prune_everything(library, net):
    library.custom_from_mask(net.lin, "bias", mask=torch.tensor([1, 0, 1, 1, 0]))
    library.l1_unstructured(net.conv, "weight", amount=0.3)
    library.random_structured(net.conv, "weight", amount=1, dim=0)
    library.global_unstructured(
        [(net.conv, "weight"), (net.lin, "weight"), (net.conv, "bias")],
        pruning_method=library.L1Unstructured,
        amount=0.3,
    )


def test_hooks_hold_no_mask_where_torchs_do():
    ours, theirs = make_net(), make_net()
    _prune_everything(prune, ours)
    _prune_everything(torch_prune, theirs)
    for module in (ours.conv, ours.lin):
        for hook in module._forward_pre_hooks.values():
            assert _tensors_held_by(hook) == []
    held = [
        t
        for m in (theirs.conv, theirs.lin)
        for h in m._forward_pre_hooks.values()
        for t in _tensors_held_by(h)
    ]
    assert held, "torch's CustomFromMask hooks keep their masks"
    total = sum(p.numel() for p in (theirs.conv.weight, theirs.lin.weight, theirs.conv.bias))
    assert any(t._base is not None and t._base.numel() == total for t in held)  # views of the concatenation


def test_the_buffer_is_the_single_source_of_truth():
    net = make_net()
    prune.global_unstructured([(net.lin, "weight")], pruning_method=prune.RandomUnstructured, amount=0.5)
    x = torch.randn(3, 7)
    with torch.no_grad():
        net.lin.weight_mask.fill_(1.0)  # edit the buffer in place
    assert torch.equal(net.lin(x), torch.nn.functional.linear(x, net.lin.weight_orig, net.lin.bias))
    net.lin.weight_mask = torch.zeros(5, 7)  # or replace it (setattr on a buffer name)
    assert torch.equal(net.lin(x), net.lin.bias.expand(3, 5))


@pytest.mark.parametrize(
    "method",
    [
        "l1_unstructured",
        "random_unstructured",
        "ln_structured",
        "random_structured",
        "identity",
        "custom_from_mask",
    ],
)
def test_parameter_identity_optimizer_and_gradient(method):
    net = make_net()
    weight = net.conv.weight
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    kwargs = {
        "l1_unstructured": dict(amount=0.5),
        "random_unstructured": dict(amount=0.5),
        "ln_structured": dict(amount=2, n=2, dim=0),
        "random_structured": dict(amount=2, dim=1),
        "identity": {},
        "custom_from_mask": dict(mask=torch.rand(weight.shape) > 0.5),
    }[method]
    getattr(prune, method)(net.conv, "weight", **kwargs)
    assert net.conv.weight_orig is weight
    out, _ = net(torch.randn(2, 3, 5, 5), torch.randn(2, 7))
    out.sum().backward()
    # As in torch: the gradient reaches _orig, masked (zero where pruned).
    assert torch.equal(weight.grad == 0, (net.conv.weight_mask == 0) | (weight.grad == 0))
    before = weight.detach().clone()
    optimizer.step()
    assert not torch.equal(before, weight.detach())  # the optimizer built before pruning trains it
    prune.remove(net.conv, "weight")
    assert net.conv.weight is weight


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "method", ["l1_unstructured", "random_unstructured", "ln_structured", "random_structured"]
)
def test_mask_buffers_are_in_the_parameters_dtype_and_match_torch(dtype, method):
    kwargs = {
        "l1_unstructured": dict(amount=0.5),
        "random_unstructured": dict(amount=7),
        "ln_structured": dict(amount=2, n=1, dim=0),
        "random_structured": dict(amount=0.5, dim=-1),
    }[method]
    masks = {}
    for library in (prune, torch_prune):
        net = make_net().to(dtype)
        torch.manual_seed(0)
        getattr(library, method)(net.lin, "weight", **kwargs)
        getattr(library, method)(net.lin, "weight", **kwargs)  # and once more, in a container
        masks[library.__name__] = net.lin.weight_mask
    ours, theirs = masks["fprune.compat"], masks["torch.nn.utils.prune"]
    assert ours.dtype == dtype == theirs.dtype
    assert torch.equal(ours, theirs)


def test_hook_is_called_before_every_forward_and_reads_trained_weights():
    net = make_net()
    prune.l1_unstructured(net.lin, "weight", amount=10)
    with torch.no_grad():
        net.lin.weight_orig.mul_(2)
    assert not torch.equal(net.lin.weight, net.lin.weight_orig * net.lin.weight_mask)  # stale, as in torch
    net.lin(torch.randn(1, 7))
    assert torch.equal(net.lin.weight, net.lin.weight_orig * net.lin.weight_mask)


@pytest.mark.parametrize(
    "method, kwargs",
    [
        ("l1_unstructured", dict(amount=0.3)),
        ("ln_structured", dict(amount=2, n=2, dim=0)),
    ],
)
def test_channels_last_weights_prune_like_contiguous_ones(method, kwargs):
    # torch raises here (``.view(-1)`` of a channels_last tensor); fprune.compat ranks the values.
    conv = torch.nn.Conv2d(3, 4, 3)
    reference = torch.nn.Conv2d(3, 4, 3)
    reference.load_state_dict(conv.state_dict())
    conv = conv.to(memory_format=torch.channels_last)
    getattr(prune, method)(conv, "weight", **kwargs)
    getattr(torch_prune, method)(reference, "weight", **kwargs)
    assert torch.equal(conv.weight_mask, reference.weight_mask)
    x = torch.randn(1, 3, 6, 6)
    assert torch.allclose(conv(x), reference(x), atol=1e-6)
