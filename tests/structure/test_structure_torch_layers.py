"""fprune.structure on layers whose features are transposed or packed: a token-mixing Linear
(MLP-Mixer) keeps its own hidden width and does not merge channels with positions, a Linear over
transposed features is unprunable, and nn.TransformerEncoderLayer's heads compact exactly."""

from __future__ import annotations

import torch
import torch.nn as nn

import fprune


class _Mixer(nn.Module):
    def __init__(self, tokens=5, ch=8):
        super().__init__()
        self.emb = nn.Linear(4, ch)
        self.ln1 = nn.LayerNorm(ch)
        self.t1 = nn.Linear(tokens, 16)
        self.t2 = nn.Linear(16, tokens)
        self.ln2 = nn.LayerNorm(ch)
        self.c1 = nn.Linear(ch, 12)
        self.c2 = nn.Linear(12, ch)
        self.head = nn.Linear(ch, 3)

    def forward(self, x):
        h = self.emb(x)
        h = h + self.t2(torch.relu(self.t1(self.ln1(h).transpose(1, 2)))).transpose(1, 2)
        h = h + self.c2(torch.relu(self.c1(self.ln2(h))))
        return self.head(h.mean(1))


def test_token_mixing_linear_is_not_merged_into_one_prunable_group():
    # A linear layer over a transposed activation mixes positions, not channels: its input
    # columns are fixed by the token count, and the token MLP's hidden width is a group of its own
    # (not one 1-channel "prunable, exact" group covering whole layers).
    torch.manual_seed(0)
    net = _Mixer().eval()
    x = torch.randn(2, 5, 4)
    s = fprune.structure.groups(net, (x,))
    by_name = {g.name: g for g in s.groups}
    prunable = {g.name: g.size for g in s.groups if g.prunable}
    assert prunable == {"t1.weight:0": 16, "c1.weight:0": 12}
    assert "token-mixing" in by_name["t1.weight:1"].reason  # the token dim: fixed by the input
    params = {k: v.detach() for k, v in net.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact(net, params, masks, s, (x,))
    assert small.t1.weight.shape == (8, 5) and small.c1.weight.shape == (6, 8)
    assert torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-5)


def test_transposed_features_into_a_linear_are_unprunable():
    class Perm(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(5, 3)

        def forward(self, x):  # a's 6 features become b's batch dim; b mixes the 5 positions
            return self.b(self.a(x).transpose(-1, -2))

    s = fprune.structure.groups(Perm().eval(), (torch.randn(2, 5, 4),))
    assert not any(g.prunable for g in s.groups)
    assert all(g.size > 1 for g in s.groups)


def test_compact_torch_transformer_encoder_layer_heads():
    # nn.MultiheadAttention unflattens its packed q/k/v projection by head: compact_graph keeps
    # 2 of the 4 heads in each of q, k and v.
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    s = fprune.structure.groups(enc, (x,))
    heads = [g for g in s.groups if g.kind == "head"]
    assert len(heads) == 1 and heads[0].prunable and heads[0].exact and heads[0].size == 4
    params = {k: v.detach() for k, v in enc.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(enc, params, masks, s, (x,))
    assert small.get_parameter("self_attn.in_proj_weight").shape == (24, 16)  # 2 of 4 heads, q, k and v
    assert small.get_parameter("self_attn.out_proj.weight").shape == (16, 8)
    assert small.get_parameter("linear1.weight").shape == (16, 16)
    assert torch.allclose(small(x), fprune.masked_call(enc, params, masks, (x,)), atol=1e-5)
