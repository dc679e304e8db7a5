"""Op rules of fprune.structure on small hand-written modules: in-place twins, squeeze-excitation
gates, channel shuffles, index / pad / roll along dims without channels, a position embedding
with tokens x channels, and compaction with a dynamic batch. Each compacted model is checked
against ``masked_call`` on random channel choices, with every channel mattering."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fprune
from benchmarks.zoo import every_channel_matters, relative_error


@functools.cache
def _structure(cls, shape):
    torch.manual_seed(0)
    return fprune.structure.groups(cls().eval(), (torch.randn(shape),))


def structure(cls, x):
    """``groups`` of ``cls()`` on inputs shaped like ``x`` (traced once per class)."""
    return _structure(cls, tuple(x.shape))


def members(s, name):
    return {(m.param, m.dim) for m in s.group(name).members}


def compacts_exactly(model, x, s, seed, amount=0.5, **compact_kwargs):
    """Random channel scores, ``amount`` of every prunable exact group: compact == masked."""
    model = every_channel_matters(model, seed)
    g = torch.Generator().manual_seed(seed)
    params = {k: v.detach() for k, v in model.named_parameters()}
    scores = {k: torch.rand(v.shape, generator=g) for k, v in params.items()}
    masks = fprune.group_structured(params, amount, s, importance_scores=scores)
    small = fprune.compact_graph(model, params, masks, s, (x,), **compact_kwargs)
    with torch.no_grad():
        assert relative_error(small(x), fprune.masked_call(model, params, masks, (x,))) <= 1e-5
    return small


# ------------------------------------------------------------------------------- in-place twins


class Activations(nn.Module):
    def __init__(self, inplace):
        super().__init__()
        self.inplace = inplace
        self.conv1, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.conv3 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.bn(self.conv1(x))
        y = F.hardswish(y, inplace=self.inplace)
        y = F.dropout(y, 0.2, training=False, inplace=self.inplace)
        z = self.conv2(y)
        if self.inplace:
            z.mul_(y).add_(y)
        else:
            z = z * y + y
        return self.conv3(F.relu6(z, inplace=self.inplace))


def test_in_place_ops_group_as_their_out_of_place_twins():
    x = torch.randn(2, 3, 8, 8)
    ours = fprune.structure.groups(Activations(True).eval(), (x,))
    twin = fprune.structure.groups(Activations(False).eval(), (x,))
    assert ours.key() == twin.key()
    assert ours.group("conv1.weight:0").prunable
    assert ("conv2.weight", 0) in members(ours, "conv1.weight:0")  # the in-place mul couples them


class Cumsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.conv2(self.conv1(x).cumsum_(1))


def test_in_place_op_without_an_element_wise_twin_is_unknown():
    s = fprune.structure.groups(Cumsum().eval(), (torch.randn(2, 3, 4, 4),))
    g = s.group("conv1.weight:0")
    assert not g.prunable and "cumsum_" in g.reason


# ------------------------------------------------------------------------------ squeeze-excitation


class SqueezeExcite(nn.Module):
    """A block scaled by per-channel gates computed from its own channels (MobileNetV3)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc1, self.fc2 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)
        self.out = nn.Conv2d(8, 5, 1)

    def forward(self, x):
        y = F.hardswish(self.bn(self.conv(x)), inplace=True)
        gate = F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(y, 1)))), inplace=True)
        return self.out(y * gate)


@settings(max_examples=3)
@given(seed=st.integers(0, 1000))
def test_squeeze_excitation_gates_are_coupled_with_their_channels(seed):
    x = torch.randn(2, 3, 8, 8)
    model = SqueezeExcite().eval()
    s = structure(SqueezeExcite, x)
    block = s.group("conv.weight:0")
    assert block.prunable and block.size == 8
    assert {("fc1.weight", 1), ("fc2.weight", 0), ("fc2.bias", 0), ("out.weight", 1)} <= members(
        s, block.name
    )
    assert s.group("fc1.weight:0").prunable  # the squeeze width on its own
    for m in block.members:  # gate channel c scales channel c: the same index
        if m.param in ("fc2.weight", "fc1.weight", "out.weight"):
            assert torch.equal(m.index, torch.arange(8)[:, None])
    compacts_exactly(model, x, s, seed)


class SpatialMap(nn.Module):
    """A (N, 1, H, W) attention map broadcast over channels: not a per-channel gate."""

    def __init__(self):
        super().__init__()
        self.conv, self.attn, self.out = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 1, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        return self.out(y * torch.sigmoid(self.attn(y)))


def test_a_map_broadcast_across_channels_is_no_gate():
    s = fprune.structure.groups(SpatialMap().eval(), (torch.randn(2, 3, 4, 4),))
    assert ("attn.weight", 0) not in members(s, "conv.weight:0")
    assert not s.group("attn.weight:0").prunable


# ------------------------------------------------------------------------------ channel shuffle


def shuffle(x, groups=2):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class Shuffle(nn.Module):
    """Two ShuffleNetV2-like blocks: concatenated branches, shuffled, split, shuffled again."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 6, 1), nn.Conv2d(3, 6, 1)
        self.inner, self.bn = nn.Conv2d(6, 6, 1), nn.BatchNorm2d(6)
        self.head = nn.Conv2d(12, 5, 1)

    def forward(self, x):
        y = shuffle(torch.cat([self.a(x), self.b(x)], 1))
        x1, x2 = y.chunk(2, dim=1)
        y = shuffle(torch.cat([x1, F.relu(self.bn(self.inner(x2)))], 1))
        return self.head(y)


@settings(max_examples=3)
@given(seed=st.integers(0, 1000), amount=st.sampled_from([0.25, 0.5, 0.75]))
def test_channel_shuffle_couples_what_it_interleaves(seed, amount):
    x = torch.randn(2, 3, 4, 4)
    model = Shuffle().eval()
    s = structure(Shuffle, x)
    prunable = [g for g in s.groups if g.prunable]
    assert prunable and all(g.exact for g in prunable)
    first = s.group("a.weight:0")
    # the first shuffle pairs channel i of each branch
    assert first.prunable and ("b.weight", 0) in members(s, first.name)
    compacts_exactly(model, x, s, seed, amount)


# ------------------------------------------------------------- index, pad, roll without channels


class RelativeBias(nn.Module):
    """Attention with a relative-position bias table indexed by position pairs (Swin)."""

    def __init__(self, dim=8, heads=2, tokens=4):
        super().__init__()
        self.heads, self.tokens = heads, tokens
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.table = nn.Parameter(torch.randn(7, heads))
        self.register_buffer(
            "index", torch.randint(0, 7, (tokens * tokens,), generator=torch.Generator().manual_seed(0))
        )

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q * 0.5) @ k.transpose(-2, -1)
        bias = self.table[self.index].view(t, t, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        attn = (attn + bias).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, t, c))


@settings(max_examples=3)
@given(seed=st.integers(0, 1000))
def test_relative_position_table_joins_its_heads(seed):
    x = torch.randn(2, 4, 8)
    model = RelativeBias().eval()
    s = structure(RelativeBias, x)
    heads = [g for g in s.groups if g.kind == "head"]
    assert len(heads) == 1 and heads[0].prunable and heads[0].size == 2
    assert ("table", 1) in members(s, heads[0].name)
    assert not any(m.param == "table" and m.dim == 0 for g in s.groups for m in g.members)
    small = compacts_exactly(model, x, s, seed)
    assert dict(small.named_parameters())["table"].shape == (7, 1)


class Spatial(nn.Module):
    def __init__(self, pad_channels=False):
        super().__init__()
        self.pad_channels = pad_channels
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 1), nn.Conv2d(10 if pad_channels else 8, 4, 3)

    def forward(self, x):
        y = self.conv1(x)
        if self.pad_channels:
            return self.conv2(F.pad(y, (0, 0, 0, 0, 1, 1)))
        y = F.pad(y.permute(0, 2, 3, 1), (0, 0, 0, 1, 0, 1)).permute(0, 3, 1, 2)  # NHWC, as Swin
        y = torch.roll(F.pad(y, (1, 1, 1, 1)), shifts=(1, -1), dims=(2, 3))
        return self.conv2(y.flip(-1))


@settings(max_examples=3)
@given(seed=st.integers(0, 1000))
def test_pad_and_roll_in_space_keep_channels(seed):
    x = torch.randn(2, 3, 5, 5)
    model = Spatial().eval()
    s = structure(Spatial, x)
    assert s.group("conv1.weight:0").prunable
    compacts_exactly(model, x, s, seed)


def test_padding_channels_is_unprunable_with_the_reason():
    s = fprune.structure.groups(Spatial(pad_channels=True).eval(), (torch.randn(2, 3, 5, 5),))
    g = s.group("conv1.weight:0")
    assert not g.prunable and "pad" in g.reason


# ------------------------------------------------------- position embedding, dynamic batch


class Tokens(nn.Module):
    """A ViT-like stem: patches, a class token, a (1, tokens, channels) position embedding."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 2, stride=2)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.pos = nn.Parameter(torch.randn(1, 5, 8))
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        y = self.patch(x).flatten(2).transpose(1, 2)
        y = torch.cat([self.cls.expand(y.shape[0], -1, -1), y], dim=1) + self.pos
        y = y + self.attn(y, y, y, need_weights=False)[0]
        return self.head(y[:, 0])


@settings(max_examples=3)
@given(seed=st.integers(0, 1000))
def test_position_embedding_is_per_channel(seed):
    x = torch.randn(2, 3, 4, 4)
    model = Tokens().eval()
    s = structure(Tokens, x)
    stream = s.group("cls:2")
    assert stream.prunable and {("pos", 2), ("cls", 2), ("head.weight", 1)} <= members(s, stream.name)
    assert not any(m.param == "pos" and m.dim == 1 for g in s.groups for m in g.members)
    compacts_exactly(model, x, s, seed)


def test_compact_with_a_dynamic_batch():
    x = torch.randn(2, 3, 4, 4)
    model = every_channel_matters(Tokens().eval())
    s = fprune.structure.groups(model, (x,))
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(model, params, masks, s, (x,), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    big = torch.randn(5, 3, 4, 4)
    with torch.no_grad():
        assert relative_error(small(big), fprune.masked_call(model, params, masks, (big,))) <= 1e-5


def test_each_shuffled_group_compacts_on_its_own():
    # After groups, any pruning of the prunable groups leaves every value rectangular: prune
    # each group alone (one channel) and compact.
    x = torch.randn(2, 3, 4, 4)
    model = Shuffle().eval()
    s = structure(Shuffle, x)
    params = {k: v.detach() for k, v in model.named_parameters()}
    for g in s.groups:
        if not g.prunable or g.size < 2:
            continue
        masks = fprune.group_structured(params, 1, s, where=lambda name, group, g=g: name == g.name)
        small = fprune.compact_graph(model, params, masks, s, (x,))
        with torch.no_grad():
            assert relative_error(small(x), fprune.masked_call(model, params, masks, (x,))) <= 1e-5


class ZeroChannels(nn.Module):
    """Channels made from literal sizes concatenated to computed ones: compact cannot drop them."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 1), nn.Conv2d(6, 5, 1)

    def forward(self, x):
        y = self.conv1(x)
        return self.conv2(torch.cat([y, y.new_zeros(y.shape[0], 2, y.shape[2], y.shape[3])], 1))


def test_layer_reading_constant_channels_keeps_their_columns():
    x = torch.randn(2, 3, 4, 4)
    s = structure(ZeroChannels, x)
    assert s.group("conv1.weight:0").prunable
    pinned = [
        g
        for g in s.groups
        if any(m.param == "conv2.weight" and m.dim == 1 for m in g.members) and g.size == 2
    ]
    assert pinned and not pinned[0].prunable and "carry none" in pinned[0].reason
    compacts_exactly(ZeroChannels().eval(), x, s, seed=0)
