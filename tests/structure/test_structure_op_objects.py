"""Structural ops as objects (fprune/structure/_ops): the registry each pass reads holds every
op's parts, a name is filed once; ops added as one object each (PReLU with its layer,
activations by name) and grouped-query ``scaled_dot_product_attention``, each compacted and
checked against ``masked_call`` with every channel mattering."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fprune
from benchmarks.zoo import every_channel_matters, relative_error
from fprune.structure import _ops


def test_every_op_is_filed_under_its_names_and_layers():
    for op in _ops.OPS:
        for name in op.aten:
            assert _ops.RULES[name] is op.rule
            assert _ops.REWRITES.get(name) is op.rewrite
        for cls, resize in op.layers.items():
            assert _ops.RESIZERS[cls] is resize
    assert sum(len(op.aten) for op in _ops.OPS) == len(_ops.RULES)


def test_a_name_is_filed_once():
    with pytest.raises(ValueError, match="'linear' already has one"):
        _ops.register(_ops.Op(("linear",), _ops.RULES["relu"]))
    assert _ops.RULES["linear"] is _ops.dense.LINEAR.rule


def test_in_place_twins_follow_only_element_wise_ops():
    assert _ops.rule_of("relu_") is _ops.RULES["relu"]
    assert _ops.rule_of("mul_") is _ops.RULES["mul"]
    assert _ops.rule_of("softmax_") is None  # softmax is no element-wise op


def _check(model, x, seed, route):
    """Random channel scores, half of every prunable exact group: compact == masked."""
    model = every_channel_matters(model, seed)
    s = fprune.structure.groups(model, (x,))
    g = torch.Generator().manual_seed(seed)
    params = {k: v.detach() for k, v in model.named_parameters()}
    scores = {k: torch.rand(v.shape, generator=g) for k, v in params.items()}
    masks = fprune.group_structured(params, 0.5, s, importance_scores=scores)
    small = route(model, params, masks, s, (x,))
    y = torch.randn((5,) + tuple(x.shape[1:]), generator=g)
    with torch.no_grad():
        assert relative_error(small(y), fprune.masked_call(model, params, masks, (y,))) <= 1e-5
    return s, small


ROUTES = {"compact": fprune.compact, "compact_graph": fprune.compact_graph}


class PReLUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.act, self.conv2 = nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.Conv2d(8, 4, 1)
        self.shared = nn.PReLU()  # one slope for all channels: no channel of its own

    def forward(self, x):
        return self.conv2(self.shared(self.act(self.conv1(x))))


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 1000), route=st.sampled_from(sorted(ROUTES)))
def test_prelu_slopes_go_with_their_channels(seed, route):
    s, small = _check(PReLUNet().eval(), torch.randn(2, 3, 8, 8), seed, ROUTES[route])
    g = s.group("conv1.weight:0")
    assert g.prunable and g.exact and ("act.weight", 0) in {(m.param, m.dim) for m in g.members}
    assert small.get_parameter("act.weight").shape == (4,)
    if route == "compact":
        assert small.act.num_parameters == 4  # the layer's resizer


@pytest.mark.parametrize("act", [nn.Softshrink(), nn.Hardshrink(), nn.LogSigmoid(), nn.Threshold(0.1, 0.0)])
def test_activations_added_by_name_are_element_wise(act):
    model = nn.Sequential(nn.Linear(6, 8), act, nn.Linear(8, 3)).eval()
    s, small = _check(model, torch.randn(2, 6), 0, fprune.compact)
    assert s.group("0.weight:0").prunable
    assert (small[0].out_features, small[2].in_features) == (4, 4)


class GroupedQuery(nn.Module):
    """4 query heads over 2 key/value heads, through ``scaled_dot_product_attention(enable_gqa=True)``."""

    def __init__(self, dim=16, heads=4, kv_heads=2, head_dim=4):
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(dim, heads * head_dim)
        self.k = nn.Linear(dim, kv_heads * head_dim)
        self.v = nn.Linear(dim, kv_heads * head_dim)
        self.o = nn.Linear(heads * head_dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (f(x).view(b, n, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, n, -1))


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 1000), route=st.sampled_from(sorted(ROUTES)))
def test_grouped_query_attention_prunes_whole_key_value_groups(seed, route):
    s, small = _check(GroupedQuery().eval(), torch.randn(2, 5, 16), seed, ROUTES[route])
    g = s.group("q.weight:0")
    assert (g.kind, g.size, g.prunable, g.exact) == ("head", 2, True, True)
    per = {m.param: m.per_channel for m in g.members if m.dim == 0}
    assert per == {"q.weight": 8, "q.bias": 8, "k.weight": 4, "k.bias": 4, "v.weight": 4, "v.bias": 4}
    assert small.get_parameter("q.weight").shape == (8, 16)
    assert small.get_parameter("k.weight").shape == (4, 16)


def test_key_value_heads_that_do_not_divide_the_query_heads_are_unprunable():
    class Broadcast(GroupedQuery):
        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = (f(x).view(b, n, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
            return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))

    s = fprune.structure.groups(Broadcast(kv_heads=1).eval(), (torch.randn(2, 5, 16),))
    reasons = {g.reason for g in s.groups if not g.prunable}
    assert any(r and "1 key/value heads for 4 query heads" in r for r in reasons)
