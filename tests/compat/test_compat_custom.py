"""Methods written the tutorial's way (subclass BasePruningMethod, set PRUNING_TYPE, write
compute_mask) behave as in torch: alone, in containers and in global_unstructured."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune
from tests.compat.compat_helpers import LIBRARIES, assert_same_state, custom_methods, make_net, state


def _both(steps):
    """Run ``steps(library_name, prune_module, net)`` on two identical nets; return their states."""
    out = {}
    for name, library in LIBRARIES.items():
        net = make_net(4)
        torch.manual_seed(0)
        steps(name, library, net)
        out[name] = state(net)
    return out["torch"], out["compat"]


def test_alone_and_on_top_of_builtin_methods():
    def steps(name, library, net):
        EveryOther, FirstChannel = custom_methods(name)["EveryOther"], custom_methods(name)["FirstChannel"]
        EveryOther.apply(net.lin, "bias")
        library.l1_unstructured(net.conv, "weight", amount=0.3)
        EveryOther.apply(net.conv, "weight")  # sees the remaining entries only
        FirstChannel.apply(net.conv, "weight", dim=1)  # sees the remaining channels only
        library.random_structured(net.conv, "weight", amount=1, dim=0)

    assert_same_state(*_both(steps))


def test_in_global_pruning():
    def steps(name, library, net):
        library.l1_unstructured(net.lin, "weight", amount=10)
        library.global_unstructured(
            [(net.lin, "weight"), (net.conv, "weight")], pruning_method=custom_methods(name)["EveryOther"]
        )

    assert_same_state(*_both(steps))


@pytest.mark.parametrize("library_name", ["torch", "compat"])
def test_unsupported_or_incomplete_methods_fail_alike(library_name):
    base = LIBRARIES[library_name].BasePruningMethod

    class NoDim(base):
        PRUNING_TYPE = "structured"

        def compute_mask(self, t, default_mask):
            return default_mask

    class Odd(base):
        PRUNING_TYPE = "diagonal"

        def compute_mask(self, t, default_mask):
            return default_mask

    for method, error, match in ((NoDim, AttributeError, "dim"), (Odd, ValueError, "PRUNING_TYPE")):
        net = make_net()  # torch loses the hook when this fails: a fresh model each time
        LIBRARIES[library_name].identity(net.lin, "weight")
        with pytest.raises(error, match=match):
            method.apply(net.lin, "weight")


def test_masks_are_kept_as_the_method_returns_them():
    class BoolMask(prune.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask):
            return (default_mask != 0) & (t.abs() > 0.1)

    net = make_net()
    BoolMask.apply(net.lin, "weight")
    assert net.lin.weight_mask.dtype == torch.bool  # as torch registers it
    net(*[torch.randn(1, 3, 5, 5), torch.randn(1, 7)])
    assert torch.equal(net.lin.weight, net.lin.weight_orig * net.lin.weight_mask)


def test_a_subclass_overriding_compute_mask_of_a_builtin_runs_its_own():
    calls = []

    class Logged(prune.L1Unstructured):
        def compute_mask(self, t, default_mask):
            calls.append(t.shape)
            return super().compute_mask(t, default_mask)

    net = make_net()
    Logged.apply(net.lin, "weight", amount=5)
    Logged.apply(net.lin, "weight", amount=5)  # in a container: torch's slice of what remains
    assert calls == [torch.Size([5, 7]), torch.Size([30])]
    assert int((net.lin.weight_mask == 0).sum()) == 10
    reference = make_net()
    torch_prune.l1_unstructured(reference.lin, "weight", amount=5)
    torch_prune.l1_unstructured(reference.lin, "weight", amount=5)
    assert torch.equal(reference.lin.weight_mask, net.lin.weight_mask)
