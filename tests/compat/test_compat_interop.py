"""torch.nn.utils.prune and fprune.compat work on each other's pruned modules and checkpoints."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import given
from hypothesis import strategies as st

import fprune.compat as prune
from tests.compat.compat_calls import operations, outcome, structured_on_pruned_1d
from tests.compat.compat_helpers import LIBRARIES, TARGETS, assert_same_state, inputs, make_net, state


def test_compat_prunes_further_and_removes_what_torch_pruned():
    reference, mixed = make_net(3), make_net(3)
    for net, second in ((reference, torch_prune), (mixed, prune)):
        torch.manual_seed(0)
        torch_prune.random_unstructured(net.conv, "weight", amount=0.3)
        torch_prune.l1_unstructured(net.conv, "weight", amount=5)  # a torch PruningContainer
        torch_prune.l1_unstructured(net.lin, "weight", amount=4)  # a single torch method
        second.ln_structured(net.conv, "weight", amount=2, n=1, dim=0)
        second.random_unstructured(net.lin, "weight", amount=0.5)
    assert_same_state(state(reference), state(mixed))
    (hook,) = mixed.conv._forward_pre_hooks.values()
    assert isinstance(hook, prune.PruningContainer)
    assert [type(m) for m in hook] == [
        torch_prune.RandomUnstructured,
        torch_prune.L1Unstructured,
        prune.LnStructured,
    ]
    for net, library in ((reference, torch_prune), (mixed, prune)):
        library.remove(net.conv, "weight")
        library.remove(net.lin, "weight")
    assert_same_state(state(reference), state(mixed))
    assert not prune.is_pruned(mixed)


def test_torch_prunes_further_recognizes_and_removes_what_compat_pruned():
    reference, mixed = make_net(4), make_net(4)
    for net, first in ((reference, torch_prune), (mixed, prune)):
        torch.manual_seed(1)
        first.random_structured(net.conv, "weight", amount=2, dim=1)
        first.l1_unstructured(net.conv, "weight", amount=0.2)  # an fprune.compat container
        first.custom_from_mask(net.lin, "bias", mask=torch.tensor([1, 0, 1, 1, 0]))
        assert torch_prune.is_pruned(net)
        torch_prune.random_unstructured(net.conv, "weight", amount=3)
        torch_prune.l1_unstructured(net.lin, "bias", amount=1)
        torch_prune.global_unstructured(
            [(net.conv, "weight"), (net.lin, "bias")], pruning_method=torch_prune.L1Unstructured, amount=0.3
        )
    assert_same_state(state(reference), state(mixed))
    torch_prune.remove(mixed.conv, "weight")
    torch_prune.remove(mixed.lin, "bias")
    torch_prune.remove(reference.conv, "weight")
    torch_prune.remove(reference.lin, "bias")
    assert_same_state(state(reference), state(mixed))


@given(
    st.integers(0, 100),
    st.lists(st.tuples(operations(), st.sampled_from(["torch", "compat"])), min_size=1, max_size=6),
)
def test_any_interleaving_of_the_two_libraries_matches_torch_alone(model_seed, calls):
    reference, mixed = make_net(model_seed), make_net(model_seed)
    for op, library in calls:
        if structured_on_pruned_1d(mixed, op):
            return  # torch's known bug there (see test_compat_differential)
        expected = outcome("torch", reference, op)
        actual = outcome(library, mixed, op)
        if expected is not None or actual is not None:
            assert expected is not None and actual is not None
            assert isinstance(actual, type(expected))
            return
        assert_same_state(state(reference), state(mixed))


def _checkpoint(net) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def _prune_all(library, net):
    library.l1_unstructured(net.conv, "weight", amount=0.5)
    library.ln_structured(net.conv, "weight", amount=1, n=2, dim=0)
    library.global_unstructured(
        [(net.lin, "weight"), (net.lin, "bias")], pruning_method=library.RandomUnstructured, amount=0.3
    )


def test_checkpoints_cross_over_both_ways():
    for source, target in ((torch_prune, prune), (prune, torch_prune)):
        torch.manual_seed(0)
        saved = make_net(7)
        _prune_all(source, saved)
        loaded = make_net(8)
        torch.manual_seed(1)
        _prune_all(target, loaded)  # same structure, other weights and masks
        loaded.load_state_dict(torch.load(_checkpoint(saved)))
        with torch.no_grad():
            for out, ref in zip(loaded(*inputs()), saved(*inputs()), strict=True):
                assert torch.equal(out, ref)
        assert list(loaded.state_dict()) == list(saved.state_dict())


def test_torch_is_pruned_and_remove_see_compat_hooks():
    net = make_net()
    assert not torch_prune.is_pruned(net)
    prune.identity(net.lin, "weight")
    assert torch_prune.is_pruned(net) and prune.is_pruned(net)
    assert all(isinstance(h, torch_prune.BasePruningMethod) for h in net.lin._forward_pre_hooks.values())
    torch_prune.remove(net.lin, "weight")
    assert not torch_prune.is_pruned(net)
    assert [n for n, _ in net.lin.named_parameters()] == ["bias", "weight"]


def test_names_of_targets_are_the_ones_the_calls_use():
    # The differential strategies prune these four tensors; all exist in the test model.
    net = make_net()
    for module, name in TARGETS:
        assert isinstance(getattr(getattr(net, module), name), torch.nn.Parameter)
    assert set(LIBRARIES) == {"torch", "compat"}


def test_global_pruning_accepts_the_other_librarys_method_classes():
    results = []
    for function_library, method_library in (
        (torch_prune, torch_prune),
        (torch_prune, prune),
        (prune, torch_prune),
    ):
        for method in ("L1Unstructured", "RandomUnstructured"):
            net = make_net(2)
            torch.manual_seed(5)
            function_library.global_unstructured(
                [(net.conv, "weight"), (net.lin, "weight")], getattr(method_library, method), amount=0.3
            )
            results.append((method, net.conv.weight_mask, net.lin.weight_mask))
    reference = {method: (a, b) for method, a, b in results[:2]}
    for method, a, b in results[2:]:
        assert torch.equal(a, reference[method][0]) and torch.equal(b, reference[method][1])


def test_two_hooks_on_one_tensor_are_refused_by_both():
    for library in (torch_prune, prune):
        net = make_net()
        prune.identity(net.lin, "weight")
        extra = prune.Identity()
        extra._tensor_name = "weight"
        net.lin.register_forward_pre_hook(extra)
        with pytest.raises(AssertionError):
            library.l1_unstructured(net.lin, "weight", amount=1)
