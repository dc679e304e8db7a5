"""Bridges between hook-pruned modules and fprune's functional masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune
import fprune.compat as prune
from tests.compat.compat_helpers import inputs, make_net


def _pruned(library=prune):
    net = make_net(2)
    torch.manual_seed(0)
    library.l1_unstructured(net.conv, "weight", amount=0.4)
    library.random_structured(net.conv, "weight", amount=1, dim=0)
    library.l1_unstructured(net.lin, "bias", amount=2)
    return net


@pytest.mark.parametrize("library", [prune, torch_prune], ids=["compat", "torch"])
def test_hooks_to_functional_runs_an_unpruned_model_like_the_hooks(library):
    net = _pruned(library)
    params, masks = prune.hooks_to_functional(net)
    plain = make_net(9)
    assert sorted(params) == sorted(name for name, _ in plain.named_parameters())
    assert sorted(masks) == ["conv.weight", "lin.bias"]
    assert params["conv.weight"] is net.conv.weight_orig and params["lin.weight"] is net.lin.weight
    assert all(m.dtype == torch.bool for m in masks.values())
    assert torch.equal(masks["conv.weight"], net.conv.weight_mask != 0)
    with torch.no_grad():
        for out, ref in zip(fprune.masked_call(plain, params, masks, inputs()), net(*inputs()), strict=True):
            assert torch.equal(out, ref)
    assert prune.is_pruned(net)  # nothing changed


def test_functional_masks_continue_pruning_in_the_core():
    net = _pruned()
    params, masks = prune.hooks_to_functional(net)
    more = fprune.l1_unstructured(params, 0.5, masks=masks, where=lambda name, p: name == "conv.weight")
    reference = _pruned()
    prune.l1_unstructured(reference.conv, "weight", amount=0.5)
    assert torch.equal(more["conv.weight"].float(), reference.conv.weight_mask)


@pytest.mark.parametrize("bake", [False, True])
def test_strip_pruning_gives_a_plain_model_and_its_masks(bake):
    net = _pruned()
    orig = net.conv.weight_orig
    with torch.no_grad():
        expected = net(*inputs())
    masks = prune.strip_pruning(net, bake=bake)
    assert not prune.is_pruned(net) and not list(net.buffers())
    assert net.conv.weight is orig and isinstance(net.conv.weight, torch.nn.Parameter)
    assert sorted(masks) == ["conv.weight", "lin.bias"]
    with torch.no_grad():
        for out, ref in zip(
            fprune.masked_call(net, dict(net.named_parameters()), masks, inputs()), expected, strict=True
        ):
            assert torch.equal(out, ref)
        plain_out = net(*inputs())
    same = all(torch.equal(a, b) for a, b in zip(plain_out, expected, strict=True))
    assert same == bake  # baked weights are pruned; unbaked ones are the originals


def test_functional_to_hooks_installs_core_masks():
    net = make_net(1)
    params = dict(net.named_parameters())
    masks = fprune.global_unstructured(params, 0.5, where=lambda name, p: p.dim() > 1)
    with torch.no_grad():
        expected = fprune.masked_call(net, params, masks, inputs())
    prune.functional_to_hooks(net, {k: v for k, v in masks.items() if k.endswith("weight")})
    assert sorted(name for name, _ in net.named_buffers()) == ["conv.weight_mask", "lin.weight_mask"]
    assert torch.equal(net.lin.weight_mask, masks["lin.weight"].float())
    with torch.no_grad():
        for out, ref in zip(net(*inputs()), expected, strict=True):
            assert torch.equal(out, ref)
    # Round trip: stripping gives the masks back.
    back = prune.strip_pruning(net)
    assert all(torch.equal(back[k], masks[k]) for k in back)


def test_functional_to_hooks_combines_with_pruning_and_rejects_unknown_names():
    net = _pruned()
    old = net.conv.weight_mask.clone()
    extra = torch.rand(old.shape) > 0.5
    prune.functional_to_hooks(net, {"conv.weight": extra})
    assert torch.equal(net.conv.weight_mask, old * extra)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(KeyError, match=r"conv\.kernel"):
        prune.functional_to_hooks(net, {"lin.weight": torch.ones(5, 7), "conv.kernel": torch.ones(1)})
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert not hasattr(net.lin, "weight_mask")


@pytest.mark.parametrize("library", [prune, torch_prune], ids=["compat", "torch"])
def test_load_pruned_checkpoint_into_an_unpruned_model_baked(library):
    source = _pruned(library)
    plain = make_net(5)
    result = prune.load_pruned_state_dict(plain, source.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    assert not prune.is_pruned(plain)
    with torch.no_grad():
        for out, ref in zip(plain(*inputs()), source(*inputs()), strict=True):
            assert torch.equal(out, ref)


def test_load_pruned_checkpoint_installing_hooks_keeps_training_masked():
    source = _pruned()
    plain = make_net(5)
    prune.load_pruned_state_dict(plain, source.state_dict(), install_hooks=True)
    assert prune.is_pruned(plain) and torch_prune.is_pruned(plain)
    for key, value in source.state_dict().items():
        assert torch.equal(plain.state_dict()[key], value), key
    assert torch.equal(plain.conv.weight, source.conv.weight)  # recomputed at load
    optimizer = torch.optim.SGD(plain.parameters(), lr=1.0)
    plain(*inputs())[0].sum().backward()
    optimizer.step()
    plain(*inputs())
    assert bool((plain.conv.weight[source.conv.weight_mask == 0] == 0).all())


def test_load_pruned_checkpoint_strictness():
    source = _pruned()
    state = dict(source.state_dict())
    state["head.weight_orig"] = torch.ones(2)
    state["head.weight_mask"] = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"head\.weight"):
        prune.load_pruned_state_dict(make_net(), state)
    result = prune.load_pruned_state_dict(make_net(), state, strict=False)
    assert result.unexpected_keys == ["head.weight"]
    with pytest.raises(KeyError, match=r"head\.weight"):
        prune.load_pruned_state_dict(make_net(), state, install_hooks=True)
    net = make_net()
    prune.load_pruned_state_dict(net, state, install_hooks=True, strict=False)
    assert sorted(name for name, _ in net.named_buffers()) == ["conv.weight_mask", "lin.bias_mask"]
