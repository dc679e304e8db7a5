"""fprune._torch: the torch internals fprune uses, and their fallbacks when a torch lacks them.

Each probe is removed in turn (as if torch had moved it): masks must stay exactly the same, since
the fallback answers "traced" and the traced path (a stable sort) computes the same selection.
"""

from __future__ import annotations

import copy

import pytest
import torch

import fprune
import fprune.compat as prune
from fprune import _torch
from fprune.select import _engine

PROBES = ["_IS_COMPILING", "_DISPATCH_MODE", "_IS_FUNCTORCH_WRAPPED"]


def _params():
    g = torch.Generator().manual_seed(0)
    # Rounded values: many ties, so the tie-break is exercised too.
    return {
        "a": torch.randn(40, 30, generator=g).round(decimals=1),
        "b": torch.randn(500, generator=g).round(decimals=1),
        "c": torch.randn(6, 5, 4, generator=g).round(decimals=1),
    }


def _all_masks(params):
    prior = fprune.l1_unstructured(params, 0.3)
    return [
        fprune.global_unstructured(params, 0.5),
        fprune.global_unstructured(params, 0.5, masks=prior),
        fprune.l1_unstructured(params, 17),
        fprune.l1_unstructured(params, 0.4, masks=prior),
        fprune.ln_structured({"a": params["a"], "c": params["c"]}, 0.5, 2, 0),
    ]


def _compat_masks():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 10))
    prune.l1_unstructured(net[0], "weight", amount=0.3)
    prune.ln_structured(net[0], "weight", amount=0.5, n=1, dim=0)
    prune.global_unstructured(
        [(net[0], "weight"), (net[1], "weight"), (net[1], "bias")],
        pruning_method=prune.L1Unstructured,
        amount=0.4,
    )
    return net, [b.clone() for b in net.buffers()]


def test_probes_exist_in_the_tested_torch():
    for probe in PROBES:
        assert getattr(_torch, probe) is not None, probe
    assert not _torch.is_traced([torch.ones(2)])
    assert _engine.is_traced is _torch.is_traced


@pytest.mark.parametrize("probe", PROBES)
def test_a_missing_probe_means_traced_and_the_same_masks(monkeypatch, probe):
    params = _params()
    expected = _all_masks(params)
    _, expected_compat = _compat_masks()
    monkeypatch.setattr(_torch, probe, None)
    assert _torch.is_traced([torch.ones(2)])
    for want, got in zip(expected, _all_masks(params), strict=True):
        for key in want:
            assert torch.equal(want[key], got[key]), key
    net, got_compat = _compat_masks()
    assert all(torch.equal(a, b) for a, b in zip(expected_compat, got_compat, strict=True))
    # The pruned attributes are plain products then (torch's behaviour); the module still runs.
    x = torch.randn(3, 30)
    assert torch.equal(
        net(x),
        torch.nn.functional.linear(
            torch.nn.functional.linear(x, net[0].weight_orig * net[0].weight_mask, net[0].bias),
            net[1].weight_orig * net[1].weight_mask,
            net[1].bias_orig * net[1].bias_mask,
        ),
    )


def test_deepcopy_keeps_working_with_every_probe_present():
    net, _ = _compat_masks()
    net(torch.randn(1, 30))
    twin = copy.deepcopy(net)
    assert torch.equal(twin[0].weight, twin[0].weight_orig * twin[0].weight_mask)


def _change_and_restore(module, change):
    before = {k: (v.copy() if isinstance(v, (dict, set)) else v) for k, v in module.__dict__.items()}
    snapshot = _torch.ModuleSnapshot(module)
    change(module)
    snapshot.restore()
    assert module.__dict__.keys() == before.keys()
    for key, value in before.items():
        assert module.__dict__[key] == value, key


def _what_pruning_changes(module):
    module.register_forward_pre_hook(lambda m, args, kwargs: None, with_kwargs=True)
    module.register_buffer("extra", torch.ones(1), persistent=False)
    module.new_attribute = 1
    del module._parameters["bias"]


def test_module_snapshot_restores_what_pruning_changes():
    module = torch.nn.Linear(3, 2)
    module.register_forward_pre_hook(lambda m, args: None)
    _change_and_restore(module, _what_pruning_changes)


def test_module_snapshot_falls_back_to_every_container(monkeypatch):
    monkeypatch.setattr(_torch, "MODULE_CONTAINERS", ("_parameters", "_renamed_by_a_later_torch"))

    def change(module):
        _what_pruning_changes(module)
        module.register_forward_hook(lambda m, i, o: o)  # a container not named above

    _change_and_restore(torch.nn.Linear(3, 2), change)


def test_compat_pruning_writes_only_to_the_named_containers():
    # If a later torch's register_* or __setattr__ wrote elsewhere, the snapshot would miss it.
    module = torch.nn.Linear(4, 3)
    others = {
        k: v.copy()
        for k, v in module.__dict__.items()
        if isinstance(v, (dict, set)) and k not in _torch.MODULE_CONTAINERS
    }
    prune.l1_unstructured(module, "weight", amount=2)
    prune.ln_structured(module, "weight", amount=1, n=2, dim=0)
    prune.global_unstructured([(module, "weight"), (module, "bias")], prune.RandomUnstructured, amount=0.5)
    module(torch.ones(1, 4))
    prune.remove(module, "bias")
    prune.strip_pruning(module)
    for key, value in others.items():
        assert module.__dict__[key] == value, key


def test_shard_layout_fallback_equals_torchs_private_function():
    """The fallback layout (no private torch API) is torch's, uneven and empty shards included."""
    import itertools
    import random

    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    rng = random.Random(0)
    checked = 0
    for _ in range(300):
        ndim = rng.randint(1, 3)
        shape = tuple(rng.randint(0, 9) for _ in range(ndim))
        mesh = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 2)))
        placements = tuple(Shard(rng.randrange(ndim)) if rng.random() < 0.7 else Replicate() for _ in mesh)
        for coordinate in itertools.product(*(range(n) for n in mesh)):
            want = _compute_local_shape_and_global_offset(shape, mesh, list(coordinate), placements)
            got = _torch._shard_layout(shape, mesh, coordinate, placements)
            assert got == (tuple(want[0]), tuple(want[1])), (shape, mesh, placements, coordinate)
            assert _torch.shard_layout(shape, mesh, coordinate, placements) == got
            checked += 1
    assert checked > 300


def test_dtensor_probes_fall_back_when_torch_lacks_them(monkeypatch):
    from torch.distributed.tensor import Shard

    monkeypatch.setattr(_torch, "_dtensor_private", lambda module, name: None)
    assert _torch.shard_layout((7, 3), (2,), (1,), (Shard(0),)) == ((3, 3), (4, 0))
    assert _torch.strided_shard_type() == ()
    assert not isinstance(Shard(0), _torch.strided_shard_type())
