"""Inputs taken from a model, refused with a message that names the leaf and the fix: buffers in
params (gradient scores, SynFlow), BatchNorm in training mode, masks on another device than their
params, both names of a tied weight, and a mask dict that leaves out members of a group."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import fprune


def _bn_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).eval()
    params = {k: v.detach() for k, v in net.named_parameters()}
    return net, params, {**params, **dict(net.named_buffers())}


@pytest.mark.parametrize("score", ["snip", "fisher", "obd", "grasp"])
def test_gradient_scores_name_an_integer_leaf(score):
    # The {**params, **buffers} dict that masked_call takes holds num_batches_tracked, an integer.
    net, params, with_buffers = _bn_net()
    batch = (torch.randn(3, 3, 6, 6), torch.tensor([0, 1, 0]))

    def loss_fn(p, b):
        return nn.functional.cross_entropy(torch.func.functional_call(net, p, (b[0],)), b[1])

    fn = getattr(fprune.scores, score)
    with pytest.raises(TypeError, match=r"params\['1.num_batches_tracked'\].*Leave buffers out"):
        fn(loss_fn, with_buffers, [batch])
    assert fn(loss_fn, params, [batch]).keys() == params.keys()


def test_synflow_names_a_buffer_in_params():
    net, params, with_buffers = _bn_net()
    with pytest.raises(ValueError, match=r"params\['1.running_mean'\] is a buffer"):
        fprune.scores.synflow(net, with_buffers, torch.randn(1, 3, 6, 6))
    with pytest.raises(ValueError, match=r"params\['nope'\] is not a parameter"):
        fprune.scores.synflow(net, {"nope": torch.ones(1)}, torch.randn(1, 3, 6, 6))
    assert fprune.scores.synflow(net, params, torch.randn(1, 3, 6, 6)).keys() == params.keys()


@pytest.mark.parametrize("score", ["snip", "fisher", "grasp"])
def test_gradient_scores_explain_batchnorm_in_training_mode(score):
    # BatchNorm in training mode updates its running statistics in place, which torch.func
    # refuses: the error says so and points to model.eval().
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    params = {k: v.detach() for k, v in net.named_parameters()}
    batch = (torch.randn(3, 3, 6, 6), torch.tensor([0, 1, 0]))

    def loss_fn(p, b):
        return nn.functional.cross_entropy(torch.func.functional_call(net, p, (b[0],)), b[1])

    with pytest.raises(RuntimeError, match=rf"^{score}: loss_fn updates a tensor .* model\.eval\(\)"):
        getattr(fprune.scores, score)(loss_fn, params, [batch])
    net.eval()
    assert getattr(fprune.scores, score)(loss_fn, params, [batch]).keys() == params.keys()


def test_apply_masks_names_a_mask_on_another_device():
    params = {"w": torch.randn(3), "b": torch.randn(2)}
    masks = {"w": torch.ones(3, dtype=torch.bool, device="meta")}
    with pytest.raises(ValueError, match=r"masks\['w'\] on the device of params\['w'\], cpu, got meta"):
        fprune.apply_masks(params, masks)
    with pytest.raises(ValueError, match=r"masks\['w'\] on the device"):
        fprune.apply_masks({"w": params["w"].to("meta")}, {"w": torch.ones(3, dtype=torch.bool)})
    lin = nn.Linear(3, 2)
    meta_masks = {"weight": torch.ones(2, 3, device="meta")}
    with pytest.raises(ValueError, match=r"masks\['weight'\] on the device"):
        fprune.masked_call(lin, dict(lin.named_parameters()), meta_masks, (torch.ones(1, 3),))
    # A CPU 0-dim mask is a scalar operand: accepted as torch accepts it.
    scalar = {"t": torch.tensor(2.0, device="meta")}
    assert fprune.apply_masks(scalar, {"t": torch.tensor(True)})["t"].device.type == "meta"


def test_compact_refuses_a_partial_mask_dict_that_it_would_not_match():
    # Masks for a conv weight without its bias: compacting them would keep the bias of a removed
    # channel feeding conv 2, unlike masked_call. compact names the member left out.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(1, 3, 8, 8)
    s = fprune.structure.groups(net, (x,))
    params = {k: v.detach() for k, v in net.named_parameters()}
    weight_only = {"0.weight": fprune.ln_structured({"w": params["0.weight"]}, 0.5, 2, 0)["w"]}
    with pytest.raises(ValueError, match=r"no mask for its member '0\.bias'"):
        fprune.compact(net, params, weight_only, s, (x,))
    with pytest.raises(ValueError, match=r"'0\.bias'.*which params leaves out"):
        fprune.compact(net, {"0.weight": params["0.weight"]}, weight_only, s, (x,))
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact(net, params, masks, s, (x,))
    assert torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-6)


def test_masked_call_names_two_keys_of_one_tied_weight():
    # Two masked entries for one tied weight would untie it (each use its own mask): masked_call
    # names both keys and asks to keep one.
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    torch.manual_seed(0)
    net, x = Tied(), torch.randn(2, 4)
    both = {k: v.detach() for k, v in net.named_parameters(remove_duplicate=False)}
    masks = fprune.global_unstructured(both, 0.5)
    with pytest.raises(ValueError, match=r"both 'a\.weight' and 'b\.weight'.*keep one"):
        fprune.masked_call(net, both, masks, (x,))
    same = dict(net.named_parameters(remove_duplicate=False))  # one tensor object, unmasked: fine
    assert fprune.masked_call(net, same, {}, (x,)).shape == (2, 4)
    one = {k: v.detach() for k, v in net.named_parameters()}
    m1 = fprune.global_unstructured(one, 0.5, where=lambda name, p: p.dim() > 1)
    w = one["a.weight"] * m1["a.weight"]
    want = nn.functional.linear(nn.functional.linear(x, w, one["a.bias"]), w, one["b.bias"])
    assert torch.allclose(fprune.masked_call(net, one, m1, (x,)), want, atol=1e-6)
