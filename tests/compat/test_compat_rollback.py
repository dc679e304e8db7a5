"""A failing call leaves every module exactly as it was (torch leaves some half-pruned)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune
from tests.compat.compat_helpers import assert_same_state, custom_methods, make_net, state


def fingerprint(net: torch.nn.Module, with_state: bool = True):
    """Object identities of everything apply/remove/global touch, and all values."""
    out = []
    for name, sub in net.named_modules():
        hooks = [
            (
                key,
                id(hook),
                tuple(id(m) for m in hook) if isinstance(hook, torch_prune.PruningContainer) else (),
            )
            for key, hook in sub._forward_pre_hooks.items()
        ]
        out.append(
            (
                name,
                # The hooks' attributes are recomputed by every forward (state() runs one):
                # their values are compared through state(), their presence here.
                sorted(
                    (k, "recomputed" if type(v) is torch.Tensor else id(v)) for k, v in sub.__dict__.items()
                ),
                [(k, id(v)) for k, v in sub._parameters.items()],
                [(k, id(v)) for k, v in sub._buffers.items()],
                hooks,
            )
        )
    values = state(net) if with_state else [(k, v.clone()) for k, v in net.state_dict().items()]
    return out, values


def assert_unchanged(before, net, with_state=True):
    ids, values = fingerprint(net, with_state)
    assert ids == before[0]
    if with_state:
        assert_same_state(before[1], values)
    else:
        assert [k for k, _ in values] == [k for k, _ in before[1]]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(values, before[1], strict=True))


def _fresh():
    return make_net(0)


def _pruned():
    net = make_net(0)
    prune.l1_unstructured(net.conv, "weight", amount=0.3)
    prune.random_unstructured(net.conv, "weight", amount=2)  # a container
    prune.l1_unstructured(net.lin, "weight", amount=3)  # a single method
    return net


FAILURES = {
    "amount out of range": (lambda net: prune.l1_unstructured(net.conv, "weight", amount=1.5), ValueError),
    "amount of the wrong type": (
        lambda net: prune.random_unstructured(net.lin, "weight", amount="0.2"),
        TypeError,
    ),
    "int amount above the size": (
        lambda net: prune.l1_unstructured(net.lin, "weight", amount=99),
        ValueError,
    ),
    "importance scores of the wrong shape": (
        lambda net: prune.l1_unstructured(net.conv, "weight", amount=0.2, importance_scores=torch.ones(3)),
        AssertionError,
    ),
    "structured pruning of a 1-d tensor": (
        lambda net: prune.ln_structured(net.lin, "bias", 1, n=2, dim=0),
        ValueError,
    ),
    "dim out of range": (lambda net: prune.random_structured(net.conv, "weight", 1, dim=4), IndexError),
    "unknown norm": (lambda net: prune.ln_structured(net.conv, "weight", 1, n="max", dim=0), RuntimeError),
    "custom method that raises": (
        lambda net: custom_methods("compat")["Failing"].apply(net.lin, "weight"),
        ZeroDivisionError,
    ),
    "custom mask of the wrong shape": (
        lambda net: prune.custom_from_mask(net.conv, "weight", torch.ones(2, 2)),
        AssertionError,
    ),
    "no such parameter": (lambda net: prune.l1_unstructured(net.lin, "kernel", amount=1), AttributeError),
    "remove of an unpruned tensor": (lambda net: prune.remove(net.conv, "bias"), ValueError),
}


@pytest.mark.parametrize("make", [_fresh, _pruned], ids=["unpruned", "pruned"])
@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failing_call_leaves_the_model_as_it_was(case, make):
    call, error = FAILURES[case]
    net = make()
    before = fingerprint(net)
    with pytest.raises(error):
        call(net)
    assert_unchanged(before, net)


def test_torch_loses_the_hook_where_compat_keeps_it():
    nets = {"torch": make_net(0), "compat": make_net(0)}
    torch_prune.l1_unstructured(nets["torch"].lin, "weight", amount=3)
    prune.l1_unstructured(nets["compat"].lin, "weight", amount=3)
    for library, net in ((torch_prune, nets["torch"]), (prune, nets["compat"])):
        with pytest.raises(ValueError):
            library.l1_unstructured(net.lin, "weight", amount=-1)
    assert not torch_prune.is_pruned(nets["torch"])  # torch dropped the hook before failing
    assert prune.is_pruned(nets["compat"])


def test_failing_global_pruning_restores_every_module():
    net = _pruned()
    extra = torch.nn.BatchNorm1d(4)
    before, before_extra = fingerprint(net), fingerprint(extra, with_state=False)
    # The last tensor is a buffer: installing it fails after the others were already pruned.
    parameters = [(net.conv, "weight"), (net.lin, "bias"), (extra, "running_mean")]
    with pytest.raises(TypeError):
        prune.global_unstructured(parameters, pruning_method=prune.L1Unstructured, amount=0.5)
    assert_unchanged(before, net)
    assert_unchanged(before_extra, extra, with_state=False)
    # torch prunes the first two, then fails.
    reference = _pruned()
    with pytest.raises(TypeError):
        torch_prune.global_unstructured(
            [(reference.conv, "weight"), (reference.lin, "bias"), (torch.nn.BatchNorm1d(4), "running_mean")],
            pruning_method=torch_prune.L1Unstructured,
            amount=0.5,
        )
    assert hasattr(reference.lin, "bias_orig")


def test_global_pruning_failures_before_any_change():
    net = _pruned()
    before = fingerprint(net)
    pairs = [(net.conv, "weight"), (net.lin, "weight")]
    for call, error in [
        (lambda: prune.global_unstructured(pairs, prune.L1Unstructured, amount=10_000), ValueError),
        (lambda: prune.global_unstructured(pairs, prune.LnStructured, amount=1, n=2, dim=0), TypeError),
        (
            lambda: prune.global_unstructured(pairs, prune.L1Unstructured, importance_scores=[1], amount=1),
            TypeError,
        ),
        (
            lambda: prune.global_unstructured(
                pairs, prune.L1Unstructured, importance_scores={pairs[0]: torch.ones(5)}, amount=1
            ),
            AssertionError,
        ),
        (lambda: prune.global_unstructured(pairs, custom_methods("compat")["Failing"]), ZeroDivisionError),
        (lambda: prune.global_unstructured(42, prune.L1Unstructured, amount=1), TypeError),
    ]:
        with pytest.raises(error):
            call()
        assert_unchanged(before, net)
