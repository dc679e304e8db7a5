"""groups and compact_graph reuse a module's last torch.export while nothing the graph depends on
changed, export again when something did, and always take values from the module as it is now.

The differential property: after any sequence of changes to a module, the structure and the
compacted graph from the reused export equal those from a fresh export (the kept export dropped
first), and the compacted graph's output equals ``masked_call`` on the module as it is.
"""

from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fprune
from fprune.structure import _exports


class Net(torch.nn.Module):
    """Conv, BatchNorm, a flag that picks the activation, an optional gate, a config-like object."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Conv2d(8, 4, 1)
        self.use_tanh = False
        self.config = types.SimpleNamespace(double=False)

    def forward(self, x):
        h = self.bn(self.conv(x))
        h = torch.tanh(h) if self.use_tanh else torch.relu(h)
        if self.config.double:
            h = h * 2
        return self.head(h)


def _counting(monkeypatch) -> list:
    calls: list = []
    real = torch.export.export

    def export(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", export)
    return calls


def _compact(net, x):
    s = fprune.structure.groups(net, (x,))
    params = {k: v.detach() for k, v in net.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(net, params, masks, s, (x,), dynamic_shapes=None)
    return s, small, fprune.masked_call(net, params, masks, (x,))


def _randomize(net, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(net.parameters()) + [net.bn.running_mean, net.bn.running_var]:
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)


def test_groups_then_compact_graph_export_once(monkeypatch):
    net, x = Net().eval(), torch.randn(2, 3, 8, 8)
    calls = _counting(monkeypatch)
    s, small, want = _compact(net, x)
    assert len(calls) == 1
    assert fprune.structure.groups(net, (x,)).key() == s.key()
    assert len(calls) == 1
    torch.testing.assert_close(small(x), want, atol=1e-6, rtol=0)


def test_values_changed_in_place_are_the_modules_values_now(monkeypatch):
    net, x = Net().eval(), torch.randn(2, 3, 8, 8)
    calls = _counting(monkeypatch)
    _compact(net, x)
    _randomize(net, 1)  # weights and BatchNorm statistics (not in params) change in place
    _, small, want = _compact(net, x)
    assert len(calls) == 1
    torch.testing.assert_close(small(x), want, atol=1e-5, rtol=0)


class Negated(Net):
    def forward(self, x):
        return -super().forward(x)


CHANGES = {
    "flag": lambda net: setattr(net, "use_tanh", not net.use_tanh),
    "config": lambda net: setattr(net.config, "double", not net.config.double),
    "hook": lambda net: net.conv.register_forward_hook(lambda m, i, o: o * 3),
    "submodule": lambda net: setattr(net, "head", torch.nn.Conv2d(8, 4, 1)),
    "parameter": lambda net: setattr(net.conv, "weight", torch.nn.Parameter(net.conv.weight.detach() + 1)),
    "buffer": lambda net: setattr(net.bn, "running_var", net.bn.running_var + 1),
    "forward": lambda net: setattr(net, "forward", lambda x: Net.forward(net, x) + 1),
    "class": lambda net: setattr(net, "__class__", Negated),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_the_graph_may_depend_on_exports_again(monkeypatch, change):
    net, x = Net().eval(), torch.randn(2, 3, 8, 8)
    _randomize(net, 0)
    calls = _counting(monkeypatch)
    _compact(net, x)
    CHANGES[change](net)
    _, small, want = _compact(net, x)
    assert len(calls) == 2, change
    torch.testing.assert_close(small(x), want, atol=1e-5, rtol=0)


def test_other_inputs_export_again(monkeypatch):
    net = Net().eval()
    calls = _counting(monkeypatch)
    fprune.structure.groups(net, (torch.randn(2, 3, 8, 8),))
    fprune.structure.groups(net, (torch.randn(2, 3, 8, 8),))  # same shapes: reused
    fprune.structure.groups(net, (torch.randn(3, 3, 8, 8),))  # another shape
    fprune.structure.groups(net, (torch.randn(3, 3, 8, 8),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert len(calls) == 3


class Scale:
    """An input export takes as a constant (a registered pytree constant); mutable."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Scale) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


torch.utils._pytree.register_constant(Scale)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, scale):
        return self.lin(x) * scale.value


def test_an_input_the_key_cannot_describe_exports_every_time(monkeypatch):
    net, x, scale = Scaled().eval(), torch.randn(2, 4), Scale(1.0)
    calls = _counting(monkeypatch)
    fprune.structure.groups(net, (x, scale))
    scale.value = 2.0  # the same object, changed: export must see the new value
    fprune.structure.groups(net, (x, scale))
    assert len(calls) == 2
    assert _exports.key_of(net, (x, scale), {}, None) is None


def test_the_kept_export_does_not_keep_the_module_alive():
    net = Net().eval()
    fprune.structure.groups(net, (torch.randn(2, 3, 8, 8),))
    ref = weakref.ref(net)
    assert net in _exports._LAST
    del net
    gc.collect()
    assert ref() is None


OPS = st.sampled_from(["values", *CHANGES, "batch"])


@settings(max_examples=8, deadline=None)
@given(ops=st.lists(OPS, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_reused_exports_equal_fresh_ones(ops, seed):
    net, batch = Net().eval(), 2
    _randomize(net, seed)
    _compact(net, torch.randn(batch, 3, 8, 8))
    for i, op in enumerate(ops):
        if op == "values":
            _randomize(net, seed + i + 1)
        elif op == "batch":
            batch = 5 - batch  # 2 <-> 3
        else:
            CHANGES[op](net)
        x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(i))
        s, small, want = _compact(net, x)
        _exports.forget(net)
        fresh_s, fresh_small, _ = _compact(net, x)
        assert s.key() == fresh_s.key(), ops[: i + 1]
        assert small.code == fresh_small.code, ops[: i + 1]
        torch.testing.assert_close(small(x), want, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(small(x), fresh_small(x), atol=0, rtol=0)


def test_forget_names_a_bad_argument():
    with pytest.raises(TypeError, match=r"Expected module to be a torch\.nn\.Module, got dict"):
        fprune.structure.forget({})
