"""fprune.training: torch.func gradients into .grad, buffers back into modules, masks through
optimizer steps."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fprune
from fprune import training


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )


def is_weight(name, p):
    return name.endswith("weight") and p.dim() > 1


def batches(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, 1, 8, 8, generator=g)
    y = (x.flatten(2).mean(-1) > 0).long().squeeze(-1) + (x[..., 0, 0, 0] > 1).long()
    return list(zip(x, y, strict=True))


def test_fine_tuning_with_torch_func_grad_and_sgd_keeps_masks_and_learns():
    model = small_cnn()
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.global_unstructured(params, 0.8, where=is_weight)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    handle = training.keep_masked(opt, model, masks)

    def loss_fn(p, b, x, y):
        return F.cross_entropy(fprune.masked_call(model, {**p, **b}, masks, (x,)), y)

    data = batches()
    losses = []
    for _ in range(4):
        for x, y in data:
            live = {k: v.detach() for k, v in model.named_parameters()}
            grads, loss = torch.func.grad_and_value(loss_fn)(live, buffers, x, y)
            training.set_grads(model, grads)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
    training.load_buffers(model, buffers)
    handle.remove()
    assert losses[-1] < losses[0]
    for name, mask in masks.items():
        assert (model.get_parameter(name)[~mask] == 0).all(), name
        assert (model.get_parameter(name)[mask] != 0).all(), name
    assert int(model[1].num_batches_tracked) == 4 * len(data)
    assert not torch.equal(model[1].running_mean, torch.zeros(4))
    # The module now runs pruned on its own: model(x) == masked_call with the same weights.
    model.eval()
    x = data[0][0]
    torch.testing.assert_close(
        model(x), fprune.masked_call(model, dict(model.named_parameters()), masks, (x,))
    )


def test_set_grads_equals_autograd_through_masked_call():
    model = small_cnn().eval()  # BatchNorm in eval mode: nothing to update in place
    params = dict(model.named_parameters())
    masks = fprune.global_unstructured(params, 0.5, where=is_weight)
    x, y = batches(1)[0]
    F.cross_entropy(fprune.masked_call(model, params, masks, (x,)), y).backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    detached = {k: v.detach() for k, v in params.items()}
    grads = torch.func.grad(lambda p: F.cross_entropy(fprune.masked_call(model, p, masks, (x,)), y))(detached)
    training.set_grads(model, grads)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[k])
    training.set_grads(model, grads, accumulate=True)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * want[k])
    torch.testing.assert_close(grads["0.weight"], want["0.weight"])  # accumulating did not write into grads


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.1),
    ],
)
def test_keep_masked_survives_dense_backward_momentum_and_weight_decay(make):
    model = small_cnn()
    masks = fprune.global_unstructured(dict(model.named_parameters()), 0.7, where=is_weight)
    opt = make(model.parameters())
    handle = training.keep_masked(opt, model, fprune.pack_masks(masks))
    for x, y in batches(3):
        F.cross_entropy(model(x), y).backward()  # the dense module: grads are not zero at pruned entries
        opt.step()
        opt.zero_grad()
        for name, mask in masks.items():
            assert (model.get_parameter(name)[~mask] == 0).all()
    handle.remove()
    x, y = batches(1)[0]
    F.cross_entropy(model(x), y).backward()
    opt.step()
    assert (model[0].weight[~masks["0.weight"]] != 0).any()  # the hooks are gone


def test_keep_masked_reads_the_masks_at_every_step():
    model = nn.Linear(6, 1)
    masks = {"weight": torch.ones(1, 6, dtype=torch.bool)}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    training.keep_masked(opt, model, masks)
    masks.update(fprune.l1_unstructured(dict(model.named_parameters()), 3, where=lambda n, p: n == "weight"))
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    assert int((model.weight == 0).sum()) == 3


def test_mask_grads_and_apply_masks_in_place_match_the_pure_functions():
    model = small_cnn()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    masks = fprune.global_unstructured(params, 0.6, where=is_weight)
    training.apply_masks_(model, masks)
    want = fprune.apply_masks(params, masks)
    for k, p in model.named_parameters():
        assert torch.equal(p.detach(), want[k])
    x, y = batches(1)[0]
    F.cross_entropy(model(x), y).backward()
    training.mask_grads_(model, masks)
    for name, mask in masks.items():
        assert (model.get_parameter(name).grad[~mask] == 0).all()


def test_errors_name_the_key_and_nearest_names_and_change_nothing():
    model = small_cnn()
    before = copy.deepcopy(model.state_dict())
    good = torch.zeros_like(model[0].weight, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"masks\['0.weight_orig'\] names no parameter .*nearest: '0.weight'"
    ):
        training.apply_masks_(model, {"0.weight": good, "0.weight_orig": good})
    with pytest.raises(ValueError, match=r"grads\['4.wieght'\] names no parameter .*nearest: '4.weight'"):
        training.set_grads(model, {"4.wieght": torch.zeros(3, 144)})
    with pytest.raises(
        ValueError, match=r"buffers\['1.running_man'\] names no buffer .*nearest: '1.running_mean'"
    ):
        training.load_buffers(model, {"1.running_man": torch.zeros(4)})
    with pytest.raises(
        ValueError, match=r"Expected masks\['0.weight'\] to have the shape .* \(4, 1, 3, 3\), got \(4,\)"
    ):
        training.mask_grads_(model, {"0.weight": torch.ones(4, dtype=torch.bool)})
    with pytest.raises(TypeError, match="optimizer"):
        training.keep_masked(object(), model, {})
    with pytest.raises(TypeError, match="flat dict"):
        training.set_grads(model, [torch.zeros(1)])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
