"""global_unstructured: torch's results, through the core's streaming selection (no concatenation)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune
import fprune.compat as prune
from tests.compat.compat_helpers import assert_same_state, custom_methods, make_net, state


def _pairs(net):
    return [(net.conv, "weight"), (net.lin, "weight"), (net.lin, "bias")]


@pytest.mark.parametrize("method", ["L1Unstructured", "RandomUnstructured"])
def test_builtin_methods_never_concatenate(method, monkeypatch):
    reference, net = make_net(), make_net()
    torch.manual_seed(0)
    torch_prune.global_unstructured(_pairs(reference), getattr(torch_prune, method), amount=0.4)

    def refuse(*args, **kwargs):
        raise AssertionError("global_unstructured concatenated the parameters")

    monkeypatch.setattr(torch.nn.utils, "parameters_to_vector", refuse)
    calls = []
    real = fprune.global_unstructured
    monkeypatch.setattr(fprune, "global_unstructured", lambda *a, **k: calls.append(a) or real(*a, **k))
    torch.manual_seed(0)
    prune.global_unstructured(_pairs(net), getattr(prune, method), amount=0.4)
    assert len(calls) == 1 and len(calls[0][0]) == 3  # one call to the core, one leaf per tensor
    assert_same_state(state(reference), state(net))


def test_custom_methods_see_the_concatenated_vector_as_in_torch():
    seen = {}
    for name, library in (("torch", torch_prune), ("compat", prune)):
        base = custom_methods(name)["EveryOther"]

        class Recording(base):
            def compute_mask(self, t, default_mask):
                seen[name] = t.shape  # noqa: B023 (called by global_unstructured in this iteration)
                return super().compute_mask(t, default_mask)

        net = make_net()
        library.global_unstructured(_pairs(net), Recording)
        seen[name + " masks"] = [
            m.weight_mask if hasattr(m, "weight_mask") else None for m in (net.conv, net.lin)
        ]
    total = sum(p.numel() for p in _pairs_tensors())
    assert seen["torch"] == seen["compat"] == (total,)
    for ours, theirs in zip(seen["compat masks"], seen["torch masks"], strict=True):
        assert torch.equal(ours, theirs)


def _pairs_tensors():
    net = make_net()
    return [getattr(m, n) for m, n in _pairs(net)]


def test_parameters_may_be_a_generator():
    reference, net = make_net(), make_net()
    prune.global_unstructured(_pairs(reference), prune.L1Unstructured, amount=6)
    prune.global_unstructured((pair for pair in _pairs(net)), prune.L1Unstructured, amount=6)
    assert_same_state(state(reference), state(net))
    with pytest.raises(ValueError):  # torch iterates twice: the second pass is empty
        torch_prune.global_unstructured(
            (pair for pair in _pairs(make_net())), torch_prune.L1Unstructured, amount=6
        )


def test_importance_scores_read_flat_like_torch():
    nets = {"torch": make_net(), "compat": make_net()}
    for name, library in (("torch", torch_prune), ("compat", prune)):
        net = nets[name]
        g = torch.Generator().manual_seed(0)
        scores = {(net.lin, "weight"): torch.randn(35, generator=g)}  # flat, as torch concatenates it
        library.global_unstructured(_pairs(net), library.L1Unstructured, importance_scores=scores, amount=0.5)
    assert_same_state(state(nets["torch"]), state(nets["compat"]))


def test_mixed_dtypes_and_repeated_global_pruning_match_torch():
    nets = {}
    for name, library in (("torch", torch_prune), ("compat", prune)):
        net = make_net()
        net.lin.double()
        torch.manual_seed(3)
        for amount in (0.2, 5, 0.5):
            library.global_unstructured(_pairs(net), library.RandomUnstructured, amount=amount)
            library.global_unstructured(_pairs(net), library.L1Unstructured, amount=amount)
        nets[name] = net
    assert nets["compat"].lin.weight_mask.dtype == torch.float64
    expected, actual = nets["torch"].state_dict(), nets["compat"].state_dict()
    assert list(expected) == list(actual)
    for key in expected:
        assert expected[key].dtype == actual[key].dtype and torch.equal(expected[key], actual[key]), key


def test_duplicated_tensors_follow_torch():
    nets = {}
    for name, library in (("torch", torch_prune), ("compat", prune)):
        net = make_net()
        library.global_unstructured(
            [(net.lin, "weight"), (net.lin, "weight")], library.L1Unstructured, amount=20
        )
        nets[name] = net
    assert_same_state(state(nets["torch"]), state(nets["compat"]))


def test_tensors_on_different_devices_are_refused():
    net = make_net()
    scores = {(net.lin, "weight"): torch.ones(5, 7, device="meta")}
    with pytest.raises((TypeError, RuntimeError), match="different devices"):
        prune.global_unstructured(_pairs(net), prune.L1Unstructured, importance_scores=scores, amount=1)
    with pytest.raises(RuntimeError):  # torch's own check passes CPU + meta; torch.cat then fails
        torch_prune.global_unstructured(
            _pairs(net), torch_prune.L1Unstructured, importance_scores=scores, amount=1
        )
    assert not prune.is_pruned(net)


def test_only_the_per_tensor_buffers_are_added():
    net = make_net()
    prune.global_unstructured(_pairs(net), prune.L1Unstructured, amount=0.5)
    buffers = dict(net.named_buffers())
    assert sorted(buffers) == ["conv.weight_mask", "lin.bias_mask", "lin.weight_mask"]
    assert all(b.dtype == torch.float32 for b in buffers.values())
    assert sum(int((b == 0).sum()) for b in buffers.values()) == round(
        0.5 * sum(b.numel() for b in buffers.values())
    )


def test_no_parameters_is_an_error_in_both():
    for library in (torch_prune, prune):
        with pytest.raises(ValueError):
            library.global_unstructured([], library.L1Unstructured, amount=0.5)


def test_layer_collapse_stays_silent_as_in_torch():
    # The core warns when a global call empties a leaf; torch does not, so the drop-in does not.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 2))
    with torch.no_grad():
        model[1].weight.mul_(1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prune.global_unstructured(
            [(model[0], "weight"), (model[1], "weight")], pruning_method=prune.L1Unstructured, amount=0.5
        )
    assert bool((model[1].weight == 0).all())


def test_global_unstructured_leaves_the_garbage_collector_as_it_found_it():
    import gc

    from fprune import compat

    nets = [torch.nn.Linear(3, 2) for _ in range(4)]
    pairs = [(m, "weight") for m in nets]
    assert gc.isenabled()
    compat.global_unstructured(pairs, pruning_method=compat.L1Unstructured, amount=0.5)
    assert gc.isenabled()
    with pytest.raises(ValueError):
        compat.global_unstructured(pairs, pruning_method=compat.L1Unstructured, amount=1.5)
    assert gc.isenabled()
    gc.disable()
    try:
        compat.global_unstructured(pairs, pruning_method=compat.L1Unstructured, amount=0.5)
        assert not gc.isenabled()
    finally:
        gc.enable()
