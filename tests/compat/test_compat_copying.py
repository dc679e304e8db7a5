"""copy.deepcopy, pickle, torch.save and state_dict round trips of models pruned by fprune.compat.

torch's own hooks leave a non-leaf tensor in ``module.<name>``, so ``copy.deepcopy`` of a
model pruned by torch fails (pytorch#37322); fprune.compat's copies carry on where the original
was: same state, same outputs, and the copy's attribute is computed from the copy's tensors.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune
from tests.compat.compat_helpers import assert_same_state, inputs, make_net, state


def _pruned_net(library=prune, seed=0):
    net = make_net(seed)
    library.random_unstructured(net.conv, "weight", amount=0.3)
    library.ln_structured(net.conv, "weight", amount=1, n=2, dim=0)
    library.l1_unstructured(net.lin, "bias", amount=2)
    library.global_unstructured(
        [(net.conv, "weight"), (net.lin, "weight")], pruning_method=library.L1Unstructured, amount=0.4
    )
    return net


def _train(net, steps=3):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = inputs()
    for _ in range(steps):
        optimizer.zero_grad()
        a, b = net(x, y)
        (a.square().mean() + b.square().mean()).backward()
        optimizer.step()
    net(x, y)  # the hooks recompute the attributes from the trained _orig


def test_torch_fails_where_compat_deepcopies():
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.deepcopy(_pruned_net(torch_prune))
    net = _pruned_net()
    assert_same_state(state(net), state(copy.deepcopy(net)))


@pytest.mark.parametrize("steps", [0, 3])
def test_deepcopy_after_training_is_an_independent_pruned_model(steps):
    net = _pruned_net()
    _train(net, steps)
    clone = copy.deepcopy(net)
    # The copy's attribute is mask_copy * orig_copy: gradients reach the copy's own tensors.
    (grad,) = torch.autograd.grad(clone.conv.weight.sum(), clone.conv.weight_orig)
    assert torch.equal(grad, clone.conv.weight_mask)
    assert_same_state(state(net), state(clone))
    assert clone.conv.weight_orig is not net.conv.weight_orig
    with torch.no_grad():
        clone.conv.weight_orig.add_(1.0)
    clone(*inputs())
    assert not torch.equal(clone.conv.weight, net.conv.weight)
    assert torch.equal(clone.conv.weight == 0, net.conv.weight == 0)  # same mask, not shared
    clone.conv.weight_mask.fill_(1.0)
    assert not torch.equal(net.conv.weight_mask, clone.conv.weight_mask)


def test_copy_of_a_copy_and_training_the_copy():
    clone = copy.deepcopy(copy.deepcopy(_pruned_net()))
    before = clone.conv.weight_mask.clone()
    _train(clone, 2)
    assert torch.equal(clone.conv.weight_mask, before)
    assert bool((clone.conv.weight[before == 0] == 0).all())
    assert clone.conv.weight_orig.grad is not None


def test_pickle_round_trip_keeps_pruning_working():
    net = _pruned_net()
    _train(net, 2)
    restored = pickle.loads(pickle.dumps(net))
    # The restored attribute is tied to the restored tensors, and pruning continues.
    (grad,) = torch.autograd.grad(restored.lin.weight.sum(), restored.lin.weight_orig)
    assert torch.equal(grad, restored.lin.weight_mask)
    assert_same_state(state(net), state(restored))
    assert prune.is_pruned(restored)
    prune.l1_unstructured(restored.lin, "weight", amount=2)
    prune.remove(restored.lin, "weight")
    assert int((restored.lin.weight == 0).sum()) == int((net.lin.weight_mask == 0).sum()) + 2


def test_torch_save_and_load_of_the_whole_model():
    net = _pruned_net()
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    assert_same_state(state(net), state(restored))


def test_state_dict_round_trip_into_a_model_pruned_the_same_way():
    net = _pruned_net()
    _train(net, 2)
    saved = io.BytesIO()
    torch.save(net.state_dict(), saved)
    saved.seek(0)
    fresh = make_net(seed=5)  # other weights, other masks
    for module, name in [(fresh.conv, "weight"), (fresh.lin, "bias"), (fresh.lin, "weight")]:
        prune.identity(module, name)
    fresh.load_state_dict(torch.load(saved))
    assert list(fresh.state_dict()) == list(net.state_dict())
    for (a, x), (b, y) in zip(net.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert a == b and torch.equal(x, y)
    with torch.no_grad():
        for out, ref in zip(fresh(*inputs()), net(*inputs()), strict=True):
            assert torch.equal(out, ref)


def test_attribute_is_still_a_plain_tensor_with_torchs_grad_fn():
    net = _pruned_net()
    weight = net.conv.weight
    assert type(weight) is torch.Tensor
    assert type(weight.grad_fn).__name__ == "MulBackward0"
    assert not isinstance(weight, torch.nn.Parameter)
    assert "weight" not in dict(net.conv.named_parameters())


def test_deepcopy_after_a_compiled_forward():
    # Compiled code sets the attribute without fprune's marks; the hook copies it instead.
    net = _pruned_net()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager", fullgraph=True)
    outputs = compiled(*inputs())
    assert all(o.requires_grad for o in outputs)
    clone = copy.deepcopy(net)
    (grad,) = torch.autograd.grad(clone.lin.weight.sum(), clone.lin.weight_orig)
    assert torch.equal(grad, clone.lin.weight_mask)
    assert_same_state(state(net), state(clone))


def test_hooks_of_the_copy_belong_to_the_copy():
    net = _pruned_net()
    clone = copy.deepcopy(net)
    for module in (clone.conv, clone.lin):
        for hook in module._forward_pre_hooks.values():
            assert hook._module_ref() is module
    restored = pickle.loads(pickle.dumps(net))
    assert all("_module_ref" not in vars(h) for h in restored.conv._forward_pre_hooks.values())
    assert_same_state(state(net), state(copy.deepcopy(restored)))
