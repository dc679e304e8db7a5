"""Random methods consume torch's global generator exactly as torch.nn.utils.prune does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune
from tests.compat.compat_helpers import make_net

CALLS = {
    "random_unstructured float": lambda P, net: P.random_unstructured(net.conv, "weight", amount=0.3),
    "random_unstructured int": lambda P, net: P.random_unstructured(net.lin, "weight", amount=4),
    "random_unstructured zero": lambda P, net: P.random_unstructured(
        net.lin, "weight", amount=0.01
    ),  # rounds to 0
    "random_structured": lambda P, net: P.random_structured(net.conv, "weight", amount=1, dim=1),
    "random_structured zero": lambda P, net: P.random_structured(net.conv, "weight", amount=0, dim=0),
    "global random": lambda P, net: P.global_unstructured(
        [(net.conv, "weight"), (net.lin, "bias")], pruning_method=P.RandomUnstructured, amount=0.4
    ),
    "global random zero": lambda P, net: P.global_unstructured(
        [(net.lin, "bias")], pruning_method=P.RandomUnstructured, amount=0
    ),
    "l1 (no draws)": lambda P, net: P.l1_unstructured(net.lin, "weight", amount=3),
}


@pytest.mark.parametrize("second", sorted(CALLS))
@pytest.mark.parametrize("first", sorted(CALLS))
def test_generator_state_and_masks_after_two_calls(first, second):
    after = {}
    for library in (torch_prune, prune):
        net = make_net()
        torch.manual_seed(11)
        CALLS[first](library, net)
        CALLS[second](library, net)  # the second call prunes inside a container
        after[library.__name__] = (torch.rand(4), [b.clone() for b in net.buffers()])
    (draw_t, masks_t), (draw_c, masks_c) = after.values()
    assert torch.equal(draw_t, draw_c)  # the same number of draws was taken
    assert len(masks_t) == len(masks_c)
    assert all(torch.equal(a, b) for a, b in zip(masks_t, masks_c, strict=True))


def test_explicit_generators_of_the_core_are_not_touched():
    net = make_net()
    torch.manual_seed(0)
    state = torch.get_rng_state()
    prune.l1_unstructured(net.lin, "weight", amount=3)
    prune.ln_structured(net.conv, "weight", amount=2, n=2, dim=0)
    assert torch.equal(torch.get_rng_state(), state)
