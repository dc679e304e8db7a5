"""fprune.compact's check: a forward that still holds an old size (a number in the code, an
attribute fprune does not update) is refused with the module named and the graph route offered;
layers that cannot take fewer heads are refused; bad arguments; the original left as it was."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import fprune
from fprune.structure import CompactError
from structure_cases import TORCH_CASES, assert_unchanged, prune, snapshot


class LiteralView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)).view(-1, 64))  # 64: a size written in the code


class OwnHeads(nn.Module):
    """An attention block holding its sizes in attributes fprune has no resizer for."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)
        self.heads, self.width = 4, 16

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.width, dim=-1)
        q, k, v = (z.view(b, t, self.heads, 4).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, self.width))


class StaleScale(nn.Module):
    """Runs fine on fewer channels but computes other values: a width held in an attribute."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 16)
        self.head = nn.Linear(16, 2)
        self.width = 16

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.head(h * (h.shape[-1] / self.width))


@pytest.mark.parametrize(
    "make, x, words",
    [
        (
            LiteralView,
            torch.randn(4, 8),
            (
                r"fails on the example inputs in module 'fc2' \(Linear\), "
                r"called from the top module \(LiteralView\): "
                r"RuntimeError: mat1 and mat2"
            ),
        ),
        (
            OwnHeads,
            torch.randn(2, 5, 16),
            r"fails on the example inputs in the top module \(OwnHeads\): ValueError: not enough values",
        ),
        (
            StaleScale,
            torch.randn(3, 4),
            r"StaleScale's output differs from the masked model's by .*allowed: 1e-05",
        ),
    ],
)
def test_a_forward_holding_an_old_size_is_refused_and_the_graph_route_works(make, x, words):
    torch.manual_seed(0)
    model, s, params, masks = prune(make().eval(), (x,))
    before = snapshot(model)
    with pytest.raises(CompactError, match=words) as raised:
        fprune.compact(model, params, masks, s, (x,))
    message = str(raised.value)
    assert "fprune.compact_graph(module, params, masks, structure, args, kwargs)" in message
    assert "x.view(-1, 64)" in message  # what to look for in the code
    assert_unchanged(model, before)
    # The graph route rewrites those sizes; it runs at other batch (and sequence) sizes too.
    graph = fprune.compact_graph(model, params, masks, s, (x,))
    for y in (x, torch.randn(6, *x.shape[1:]), torch.randn(2, *x.shape[1:])):
        want = fprune.masked_call(model, params, masks, (y,))
        torch.testing.assert_close(graph(y), want, atol=1e-5, rtol=0)


def test_unknown_layers_that_shrank_are_named_as_suspects():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.rand(64) + 0.5)
            self.size = 64

        def forward(self, x):
            return (x * self.scale).reshape(-1, self.size)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.block, self.b = nn.Linear(8, 64), Block(), nn.Linear(64, 3)

        def forward(self, x):
            return self.b(self.block(self.a(x)))

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    model, s, params, masks = prune(Net().eval(), (x,))
    with pytest.raises(CompactError, match=r"no resizer for, whose tensors shrank: 'block' \(Block\)"):
        fprune.compact(model, params, masks, s, (x,))


def test_multihead_attention_heads_cannot_shrink_in_the_module_route():
    case = next(c for c in TORCH_CASES if c.name == "encoder_layer")
    model = case.make()
    s = fprune.structure.groups(model, case.example)
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)  # heads too
    before = snapshot(model)
    words = (
        r"nn.MultiheadAttention 'layer.self_attn' would keep 2 of its 4 heads.*embed_dim // num_heads"
        r".*g.kind != 'head'.*compact_graph"
    )
    with pytest.raises(CompactError, match=words):
        fprune.compact(model, params, masks, s, case.example)
    assert_unchanged(model, before)
    graph = fprune.compact_graph(model, params, masks, s, case.example)
    assert graph.get_parameter("layer.self_attn.in_proj_weight").shape == (24, 16)
    for args in case.others:
        want = fprune.masked_call(model, params, masks, args)
        torch.testing.assert_close(graph(*args), want, atol=1e-5, rtol=0)


def test_bad_arguments_and_other_models():
    case = TORCH_CASES[0]
    model, s, params, masks = prune(case)
    with pytest.raises(TypeError, match="Structure"):
        fprune.compact(model, params, masks, "groups", case.example)
    with pytest.raises(TypeError, match="tuple"):
        fprune.compact(model, params, masks, s, case.example[0])
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        fprune.compact(lambda x: x, params, masks, s, case.example)
    with pytest.raises(ValueError, match="tolerance"):
        fprune.compact(model, params, masks, s, case.example, tolerance=0)
    other = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 4))
    with pytest.raises(ValueError, match=r"does not match this module: 4.weight has shape \(4, 24\)"):
        fprune.compact(other, params, masks, s, case.example)
    with pytest.raises(ValueError, match="structure does not match this module: it has no parameter"):
        fprune.compact(nn.Sequential(nn.Linear(6, 16)), params, masks, s, case.example)
    with pytest.raises(ValueError, match="'auto', None"):
        fprune.compact_graph(model, params, masks, s, case.example, dynamic_shapes="dynamic")


def test_a_module_that_cannot_be_copied():
    class Locked(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
            self.lock = threading.Lock()

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    x = torch.randn(2, 4)
    model, s, params, masks = prune(Locked().eval(), (x,))
    with pytest.raises(
        CompactError, match=r"copy\.deepcopy, which failed on Locked: TypeError.*compact_graph"
    ):
        fprune.compact(model, params, masks, s, (x,))
