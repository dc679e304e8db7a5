"""fprune.structure: dependency groups written out by hand, group_structured against a plain
reference, compact == masked_call, save/load, bad input."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st
from torch.func import stack_module_state, vmap

import fprune
from fprune import structure
from fprune.select import Global
from tests.helpers import params_of

transformers = pytest.importorskip("transformers")


# ---------------------------------------------------------------------------------------------
# Models


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class CNN(nn.Module):
    """BatchNorm, a residual add, a grouped conv, a depthwise conv, a concatenation."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.l1 = Block(8)
        self.gc = nn.Conv2d(8, 16, 3, padding=1, groups=2)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.a = nn.Conv2d(16, 4, 1)
        self.fc = nn.Linear(20, 10)

    def forward(self, x):
        x = self.l1(torch.relu(self.bn(self.stem(x))))
        x = self.gc(x)
        x = x + self.dw(x)
        x = torch.cat([x, self.a(x)], 1)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def make_cnn(seed=0):
    torch.manual_seed(seed)
    model = CNN()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so that compaction is tested on them
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    return model.eval()


def make_gpt2(attn="sdpa", seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=64,
        n_positions=16,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=attn,
    )
    return transformers.GPT2LMHeadModel(config).eval()


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
IDS = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def cnn():
    model = make_cnn()
    return model, structure.groups(model, (X,))


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def gpt2(request):
    model = make_gpt2(request.param)
    return model, structure.groups(model, (), {"input_ids": IDS})


def summary(s):
    return {
        g.name: (g.size, g.prunable, g.exact, g.kind, {(m.param, m.dim): m.index.tolist() for m in g.members})
        for g in s.groups
    }


def rows(k, size, step, offset=0):
    """Channel c covers positions offset + c + i * step, i < k."""
    return [[offset + c + i * step for i in range(k)] for c in range(size)]


# ---------------------------------------------------------------------------------------------
# Groups written out by hand


def test_cnn_groups_by_hand(cnn):
    _, s = cnn
    one8 = rows(1, 8, 0)
    # The grouped conv (2 groups of 4 inputs) reads input channel j and 4 + j with the same
    # weight column j: the stem's 8 channels are 4 channels of 2.
    stem = rows(2, 4, 4)
    gc_out = rows(2, 8, 8)  # its 16 outputs: output j of each group is one channel
    expected = {
        "stem.weight:0": (
            4,
            True,
            True,
            "channel",
            {
                ("stem.weight", 0): stem,
                ("stem.bias", 0): stem,
                ("bn.weight", 0): stem,
                ("bn.bias", 0): stem,
                ("l1.conv1.weight", 1): stem,
                ("l1.conv2.weight", 0): stem,
                ("l1.bn2.weight", 0): stem,
                ("l1.bn2.bias", 0): stem,
                ("gc.weight", 1): rows(1, 4, 0),
                ("bn.running_mean", 0): stem,
                ("bn.running_var", 0): stem,
                ("l1.bn2.running_mean", 0): stem,
                ("l1.bn2.running_var", 0): stem,
            },
        ),
        "stem.weight:1": (3, False, True, "channel", {("stem.weight", 1): rows(1, 3, 0)}),
        "l1.conv1.weight:0": (
            8,
            True,
            True,
            "channel",
            {
                ("l1.conv1.weight", 0): one8,
                ("l1.bn1.weight", 0): one8,
                ("l1.bn1.bias", 0): one8,
                ("l1.conv2.weight", 1): one8,
                ("l1.bn1.running_mean", 0): one8,
                ("l1.bn1.running_var", 0): one8,
            },
        ),
        "gc.weight:0": (
            8,
            True,
            True,
            "channel",
            {
                ("gc.weight", 0): gc_out,
                ("gc.bias", 0): gc_out,
                ("dw.weight", 0): gc_out,
                ("dw.bias", 0): gc_out,
                ("a.weight", 1): gc_out,
                ("fc.weight", 1): gc_out,
            },
        ),
        "a.weight:0": (
            4,
            True,
            True,
            "channel",
            {
                ("a.weight", 0): rows(1, 4, 0),
                ("a.bias", 0): rows(1, 4, 0),
                ("fc.weight", 1): rows(1, 4, 0, offset=16),
            },
        ),
        "fc.weight:0": (
            10,
            False,
            True,
            "channel",
            {
                ("fc.weight", 0): rows(1, 10, 0),
                ("fc.bias", 0): rows(1, 10, 0),
            },
        ),
    }
    assert summary(s) == expected
    assert s.group("stem.weight:1").reason == "model input 'x'"
    assert s.group("fc.weight:0").reason == "model output"
    assert s.aliases == ()


def gpt2_expected(width=32, heads=4, inner=128, layers=2, vocab=64, positions=16):
    d = width // heads
    one = lambda n: rows(1, n, 0)
    head_cols = [[h * d + i + part * width for part in range(3) for i in range(d)] for h in range(heads)]
    head_rows = [[h * d + i for i in range(d)] for h in range(heads)]
    residual = {("transformer.wte.weight", 1): one(width), ("transformer.wpe.weight", 1): one(width)}
    expected = {
        "transformer.wte.weight:0": (
            vocab,
            False,
            True,
            "channel",
            {("transformer.wte.weight", 0): one(vocab)},
        ),
        "transformer.wpe.weight:0": (
            positions,
            False,
            True,
            "channel",
            {("transformer.wpe.weight", 0): one(positions)},
        ),
    }
    for i in range(layers):
        h = f"transformer.h.{i}"
        for name, dim in [
            ("ln_1.weight", 0),
            ("ln_1.bias", 0),
            ("attn.c_attn.weight", 0),
            ("attn.c_proj.weight", 1),
            ("attn.c_proj.bias", 0),
            ("ln_2.weight", 0),
            ("ln_2.bias", 0),
            ("mlp.c_fc.weight", 0),
            ("mlp.c_proj.weight", 1),
            ("mlp.c_proj.bias", 0),
        ]:
            residual[(f"{h}.{name}", dim)] = one(width)
        expected[f"{h}.attn.c_attn.weight:1"] = (
            heads,
            True,
            True,
            "head",
            {
                (f"{h}.attn.c_attn.weight", 1): head_cols,
                (f"{h}.attn.c_attn.bias", 0): head_cols,
                (f"{h}.attn.c_proj.weight", 0): head_rows,
            },
        )
        expected[f"{h}.mlp.c_fc.weight:1"] = (
            inner,
            True,
            True,
            "channel",
            {
                (f"{h}.mlp.c_fc.weight", 1): one(inner),
                (f"{h}.mlp.c_fc.bias", 0): one(inner),
                (f"{h}.mlp.c_proj.weight", 0): one(inner),
            },
        )
    residual[("transformer.ln_f.weight", 0)] = one(width)
    residual[("transformer.ln_f.bias", 0)] = one(width)
    # The residual stream: prunable, but LayerNorm statistics make removal inexact.
    expected["transformer.wte.weight:1"] = (width, True, False, "channel", residual)
    return expected


def test_gpt2_groups_by_hand(gpt2):
    _, s = gpt2
    assert summary(s) == gpt2_expected()
    # lm_head is tied to wte: one member, under the name named_parameters() keeps.
    assert s.aliases == (("lm_head.weight", "transformer.wte.weight"),)
    assert s.canonical("lm_head.weight") == "transformer.wte.weight"
    assert "LayerNorm" in s.group("transformer.wte.weight:1").inexact_reason
    assert "embedding" in s.group("transformer.wte.weight:0").reason


def test_bert_heads_and_mlp():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=50,
        max_position_embeddings=16,
    )
    model = transformers.BertModel(config).eval()
    kwargs = {"input_ids": IDS % 50, "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    s = structure.groups(model, (), kwargs)
    free = {g.name: (g.size, g.kind) for g in s.groups if g.prunable}
    assert free == {
        "encoder.layer.0.attention.self.query.weight:0": (4, "head"),
        "encoder.layer.0.intermediate.dense.weight:0": (64, "channel"),
    }
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(model, params, masks, s, (), kwargs)
    want = fprune.masked_call(model, params, masks, (), kwargs).last_hidden_state
    torch.testing.assert_close(small(**kwargs).last_hidden_state, want, atol=1e-5, rtol=0)


def test_structure_pickles_and_holds_no_module(cnn):
    _, s = cnn
    again = pickle.loads(pickle.dumps(s))
    assert again.key() == s.key()
    assert again.explain() == s.explain()
    buffer = io.BytesIO()
    torch.save(s, buffer)  # torch.save pickles too; no module inside to drag along
    assert b"CNN" not in pickle.dumps(s)


def test_explain_lists_every_group(gpt2):
    _, s = gpt2
    text = s.explain()
    for g in s.groups:
        assert f"group {g.name}:" in text
    assert "tied: lm_head.weight = transformer.wte.weight" in text
    assert "4 heads, prunable, exact" in text


# ---------------------------------------------------------------------------------------------
# Later scope and unknown ops: unprunable with a reason, never a guess


class SharedKeyValue(nn.Module):
    """One key/value head broadcast to 4 query heads (no ``enable_gqa``): not whole groups."""

    def __init__(self):
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(16, 16), nn.Linear(16, 4), nn.Linear(16, 16)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 4).transpose(1, 2)
        k = self.kv(x).view(b, t, 1, 4).transpose(1, 2)
        o = nn.functional.scaled_dot_product_attention(q, k, k)
        return self.o(o.transpose(1, 2).reshape(b, t, 16))


class Flipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.b(torch.flip(self.a(x), [1]))


class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.t = nn.Conv2d(3, 4, 3), nn.ConvTranspose2d(4, 4, 3)

    def forward(self, x):
        return self.t(self.a(x)).mean()


@pytest.mark.parametrize(
    "model, x, group, words",
    [
        (SharedKeyValue(), torch.randn(2, 3, 16), "q.weight:0", "1 key/value heads for 4 query heads"),
        (Flipped(), torch.randn(2, 4), "a.weight:0", "aten.flip"),
        (Transposed(), torch.randn(2, 3, 8, 8), "a.weight:0", "transposed convolutions"),
    ],
)
def test_unsupported_ops_make_groups_unprunable(model, x, group, words):
    s = structure.groups(model, (x,))
    g = s.group(group)
    assert not g.prunable and words in g.reason
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    # Nothing unprunable is ever pruned.
    for m in g.members:
        if m.param in masks:
            assert masks[m.param].all()


# ---------------------------------------------------------------------------------------------
# group_structured


def channel_state(mask, member):
    """Per channel of a member: whether any of its slices is kept; the mask must be a box."""
    along = [mask.movedim(d, 0).reshape(mask.shape[d], -1).any(dim=1) for d in range(mask.dim())]
    box = along[0]
    for d in range(1, mask.dim()):
        box = box.unsqueeze(-1) & along[d].reshape((1,) * d + (-1,))
    assert torch.equal(box, mask), f"{member.param}'s mask is not whole slices"
    return member.slices(mask).any(dim=1)


def kept_channels(masks, g):
    # A leaf that another group emptied (global scope can take a whole group) says nothing.
    states = [
        channel_state(masks[m.param], m) for m in g.members if m.param in masks and masks[m.param].any()
    ]
    if not states:
        return torch.zeros(g.size, dtype=torch.bool)
    for state in states[1:]:
        assert torch.equal(state, states[0]), f"group {g.name} is not consistent"
    return states[0]


def reference_scores(params, g, n, scores=None, prior=None):
    total = torch.zeros(g.size, dtype=torch.float64)
    for m in g.members:
        if m.param not in params:
            continue
        v = (params if scores is None else scores)[m.param].double()
        if scores is None and prior is not None:
            v = v * prior[m.param]
        total += m.slices(v.abs() ** n).sum(dim=1)
    return total


def reference_keep(scores, k, alive=None):
    """Prune the k lowest among alive channels; ties: lower index first."""
    keep = torch.ones(len(scores), dtype=torch.bool) if alive is None else alive.clone()
    candidates = [c for c in range(len(scores)) if keep[c]]
    candidates.sort(key=lambda c: (float(scores[c]), c))
    for c in candidates[:k]:
        keep[c] = False
    return keep


@given(
    amount=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 1.0]), n=st.sampled_from([1, 2]), seed=st.integers(0, 3)
)
def test_local_counts_and_reference(cnn, amount, n, seed):
    model, s = cnn
    params = {
        k: v + 0.1 * torch.randn(v.shape, generator=torch.Generator().manual_seed(seed))
        for k, v in params_of(model).items()
    }
    masks = fprune.group_structured(params, amount, s, n=n)
    assert set(masks) == set(params) and all(m.dtype == torch.bool for m in masks.values())
    for g in s.groups:
        if not g.prunable:
            if amount < 1:  # (at 1.0 other groups empty whole leaves, these dims with them)
                assert kept_channels(masks, g).all()
            continue
        kept = kept_channels(masks, g)
        assert int((~kept).sum()) == round(amount * g.size)
        want = reference_keep(reference_scores(params, g, n), round(amount * g.size))
        assert torch.equal(kept, want)


def test_ties_prune_lower_channel_first(cnn):
    model, s = cnn
    params = {k: torch.ones_like(v) for k, v in params_of(model).items()}
    masks = fprune.group_structured(params, 0.5, s)
    kept = kept_channels(masks, s.group("l1.conv1.weight:0"))
    assert kept.tolist() == [False] * 4 + [True] * 4


@given(first=st.sampled_from([0.25, 0.5]), second=st.sampled_from([0.0, 0.3, 0.5, 1.0]))
def test_prior_masks_respected(cnn, first, second):
    model, s = cnn
    params = params_of(model)
    before = fprune.group_structured(params, first, s)
    after = fprune.group_structured(params, second, s, masks=before)
    for k in params:
        assert not bool((after[k] & ~before[k]).any())  # nothing comes back
    prior = {k: v.to(torch.float32) for k, v in before.items()}
    for g in s.groups:
        if not g.prunable:
            continue
        alive = kept_channels(before, g)
        remaining = int(alive.sum())
        kept = kept_channels(after, g)
        assert int((~kept).sum()) == (g.size - remaining) + round(second * remaining)
        want = reference_keep(reference_scores(params, g, 2, prior=prior), round(second * remaining), alive)
        assert torch.equal(kept, want)


def test_importance_scores_drive_the_ranking(cnn):
    model, s = cnn
    params = params_of(model)
    scores = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(7)) for k, v in params.items()}
    masks = fprune.group_structured(params, 0.5, s, importance_scores=scores, n=1)
    for g in s.groups:
        if g.prunable:
            want = reference_keep(reference_scores(params, g, 1, scores=scores), round(0.5 * g.size))
            assert torch.equal(kept_channels(masks, g), want)


def test_global_scope_one_ranking(cnn):
    model, s = cnn
    params = params_of(model)
    masks = fprune.group_structured(params, 0.4, s, scope=Global())
    chosen = [g for g in s.groups if g.prunable]
    total = sum(g.size for g in chosen)
    pruned = sum(int((~kept_channels(masks, g)).sum()) for g in chosen)
    assert pruned == round(0.4 * total)
    flat = torch.cat([reference_scores(params, g, 2) for g in sorted(chosen, key=lambda g: g.name)])
    threshold = flat.sort().values[pruned - 1]
    for g in chosen:
        gone = ~kept_channels(masks, g)
        assert bool((reference_scores(params, g, 2)[gone] <= threshold + 1e-6).all())


def test_round_to_and_where(cnn):
    model, s = cnn
    params = params_of(model)
    masks = fprune.group_structured(params, 0.3, s, round_to=4)
    g = s.group("l1.conv1.weight:0")  # 8 channels: round(0.3 * 8) = 2 pruned, 6 kept -> 4 kept
    assert int(kept_channels(masks, g).sum()) == 4
    only = fprune.group_structured(params, 0.5, s, where=lambda g: g.name == "a.weight:0")
    for g in s.groups:
        assert int((~kept_channels(only, g)).sum()) == (2 if g.name == "a.weight:0" else 0)


def test_where_takes_name_and_group_as_everywhere_and_the_old_form(cnn):
    """``where(name, group)``, the vocabulary of every other ``where``; ``where(group)`` still works."""
    model, s = cnn
    params = params_of(model)
    seen = []

    def two(name, group):
        seen.append((name, group.name))
        return name == "a.weight:0"

    new = fprune.group_structured(params, 0.5, s, where=two)
    assert seen and all(name == group_name for name, group_name in seen)
    old = fprune.group_structured(params, 0.5, s, where=lambda g: g.name == "a.weight:0")
    assert all(torch.equal(new[k], old[k]) for k in params)

    class Picker:  # a callable object with one argument: the old form
        def __call__(self, group):
            return group.name == "a.weight:0"

    assert all(
        torch.equal(new[k], v) for k, v in fprune.group_structured(params, 0.5, s, where=Picker()).items()
    )
    import functools  # a partial of two arguments taking the name by keyword is still two-argument

    picked = fprune.group_structured(
        params, 0.5, s, where=functools.partial(lambda name, group, want: name == want, want="a.weight:0")
    )
    assert all(torch.equal(new[k], picked[k]) for k in params)


def test_inexact_groups_only_when_asked(gpt2):
    model, s = gpt2
    params = params_of(model)
    residual = s.group("transformer.wte.weight:1")
    default = fprune.group_structured(params, 0.5, s)
    assert kept_channels(default, residual).all()
    wide = fprune.group_structured(params, 0.5, s, where=lambda g: g.prunable)
    assert int((~kept_channels(wide, residual)).sum()) == 16
    head = s.group("transformer.h.0.attn.c_attn.weight:1")
    assert int((~kept_channels(default, head)).sum()) == 2


def test_vmap_and_compile_equal_eager(cnn):
    model, s = cnn
    members = [make_cnn(seed) for seed in range(3)]
    stacked, _ = stack_module_state(members)
    stacked = {k: v.detach() for k, v in stacked.items()}
    batched = vmap(lambda p: fprune.group_structured(p, 0.5, s))(stacked)
    for i, member in enumerate(members):
        eager = fprune.group_structured(params_of(member), 0.5, s)
        for k in eager:
            assert torch.equal(batched[k][i], eager[k])
    params = params_of(model)
    prior = fprune.group_structured(params, 0.25, s)
    compiled = torch.compile(
        lambda p, m: fprune.group_structured(p, 0.5, s, masks=m), fullgraph=True, backend="eager"
    )
    got = compiled(params, prior)
    want = fprune.group_structured(params, 0.5, s, masks=prior)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_tied_alias_gets_the_same_mask(gpt2):
    model, s = gpt2
    params = {k: v.detach() for k, v in model.named_parameters(remove_duplicate=False)}
    masks = fprune.group_structured(params, 0.5, s, where=lambda g: g.prunable)
    assert torch.equal(masks["lm_head.weight"], masks["transformer.wte.weight"])
    assert not masks["lm_head.weight"].all()


# ---------------------------------------------------------------------------------------------
# compact


@pytest.mark.parametrize("amount", [0.25, 0.5, 0.75])
def test_cnn_compact_equals_masked(cnn, amount):
    model, s = cnn
    params = params_of(model)
    masks = fprune.group_structured(params, amount, s)
    small = fprune.compact(model, params, masks, s, (X,))
    graph = fprune.compact_graph(model, params, masks, s, (X,))
    want = fprune.masked_call(model, params, masks, (X,))
    torch.testing.assert_close(small(X), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(graph(X), want, atol=1e-5, rtol=0)
    small_params = dict(small.named_parameters())
    for k, v in small_params.items():
        assert graph.get_parameter(k).shape == v.shape
    # Shapes: every member dim loses exactly the pruned channels' slices.
    lost = {}
    for g in s.groups:
        pruned = int((~kept_channels(masks, g)).sum())
        for m in g.members:
            lost[(m.param, m.dim)] = lost.get((m.param, m.dim), 0) + pruned * m.per_channel
    for (name, dim), count in lost.items():
        if name in small_params:
            assert small_params[name].shape[dim] == params[name].shape[dim] - count
    assert small.get_buffer("bn.running_mean").shape[0] == small_params["bn.weight"].shape[0]
    pure = fprune.compact_params(params, masks, s)
    assert all(torch.equal(pure[k], small_params[k]) for k in pure)


def test_gpt2_compact_equals_masked(gpt2):
    model, s = gpt2
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    with pytest.warns(UserWarning, match="config .* cannot describe"):  # fewer GPT-2 heads
        small = fprune.compact(model, params, masks, s, (), {"input_ids": IDS})
    graph = fprune.compact_graph(model, params, masks, s, (), {"input_ids": IDS})
    want = fprune.masked_call(model, params, masks, (), {"input_ids": IDS}).logits
    torch.testing.assert_close(small(input_ids=IDS).logits, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(graph(input_ids=IDS).logits, want, atol=1e-5, rtol=0)
    assert small.transformer.h[0].attn.c_attn.weight.shape == (32, 48)
    assert small.transformer.h[1].mlp.c_proj.weight.shape == (64, 32)
    assert small.lm_head.weight is small.transformer.wte.weight  # still tied
    assert graph.get_parameter("lm_head.weight") is graph.get_parameter("transformer.wte.weight")


def test_compact_removes_inexact_groups_only_when_allowed(gpt2):
    model, s = gpt2
    params = params_of(model)
    masks = fprune.group_structured(params, 0.25, s, where=lambda g: g.prunable)
    with pytest.raises(ValueError, match=r"transformer\.wte\.weight:1.*not exact.*allow_inexact"):
        fprune.compact(model, params, masks, s, (), {"input_ids": IDS})
    with pytest.raises(ValueError, match="allow_inexact"):
        fprune.compact_params(params, masks, s)
    small = fprune.compact_graph(model, params, masks, s, (), {"input_ids": IDS}, allow_inexact=True)
    assert small.get_parameter("transformer.wte.weight").shape == (64, 24)
    assert small(input_ids=IDS).logits.shape == (2, 5, 64)


def test_compact_saves_and_loads(cnn, tmp_path):
    model, s = cnn
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(model, params, masks, s, (X,))
    want = small(X)
    # state_dict: the original names with smaller shapes; load into a skeleton made the same way.
    torch.save(small.state_dict(), tmp_path / "small.pt")
    skeleton = fprune.compact_graph(make_cnn(seed=5), params_of(make_cnn(seed=5)), masks, s, (X,))
    assert not torch.allclose(skeleton(X), want)
    skeleton.load_state_dict(torch.load(tmp_path / "small.pt"))
    torch.testing.assert_close(skeleton(X), want, atol=0, rtol=0)
    # torch.export.save: a program that loads without any of this code.
    torch.export.save(torch.export.export(small, (X,)), tmp_path / "small.pt2")
    loaded = torch.export.load(tmp_path / "small.pt2").module()
    torch.testing.assert_close(loaded(X), want, atol=1e-6, rtol=0)


def test_gpt2_compact_exports_and_saves(tmp_path):
    model = make_gpt2()
    s = structure.groups(model, (), {"input_ids": IDS})
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(model, params, masks, s, (), {"input_ids": IDS})
    torch.export.save(torch.export.export(small, (), {"input_ids": IDS}), tmp_path / "gpt2.pt2")
    loaded = torch.export.load(tmp_path / "gpt2.pt2").module()
    torch.testing.assert_close(loaded(input_ids=IDS).logits, small(input_ids=IDS).logits)


# ---------------------------------------------------------------------------------------------
# Bad input


def test_inconsistent_masks_name_the_member(cnn):
    model, s = cnn
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    masks = dict(masks)
    masks["l1.bn1.bias"] = torch.ones_like(masks["l1.bn1.bias"])
    with pytest.raises(ValueError, match=r"group l1\.conv1\.weight:0.*masks\['l1\.bn1\.bias'\]"):
        fprune.compact(model, params, masks, s, (X,))
    with pytest.raises(ValueError, match="not consistent"):
        fprune.compact_params(params, masks, s)
    # Pruning an unprunable group (the model's outputs) is refused too.
    out = dict(fprune.identity(params))
    out["fc.weight"] = out["fc.weight"].clone()
    out["fc.weight"][0] = False
    out["fc.bias"] = out["fc.bias"].clone()
    out["fc.bias"][0] = False
    with pytest.raises(ValueError, match=r"fc\.weight:0.*cannot be removed: model output"):
        fprune.compact_params(params, out, s)


def test_bad_arguments(cnn):
    model, s = cnn
    params = params_of(model)
    with pytest.raises(TypeError, match="Structure"):
        fprune.group_structured(params, 0.5, "groups")
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        structure.groups(lambda x: x, (X,))
    with pytest.raises(TypeError, match="tuple"):
        structure.groups(model, X)
    with pytest.raises(TypeError, match=r"Expected scope to be fprune\.select\.EACH.*got 'layer'"):
        fprune.group_structured(params, 0.5, s, scope="layer")
    with pytest.raises(ValueError, match="amount"):
        fprune.group_structured(params, 1.5, s)
    with pytest.raises(ValueError, match="round_to"):
        fprune.group_structured(params, 0.5, s, round_to=0)
    with pytest.raises(ValueError, match="round_to"):
        fprune.group_structured(params, 0.5, s, round_to=2, scope=Global())
    with pytest.raises(TypeError, match="where"):
        fprune.group_structured(params, 0.5, s, where="a")
    with pytest.raises(TypeError, match="scope"):
        fprune.group_structured(params, 0.5, s, scope=fprune.select.Rows(0))
    wrong = dict(params)
    wrong["fc.weight"] = torch.zeros(10, 21)
    with pytest.raises(ValueError, match=r"params\['fc\.weight'\].*\(10, 20\)"):
        fprune.group_structured(wrong, 0.5, s)
    other = make_gpt2()
    masks = fprune.group_structured(params, 0.5, s)
    with pytest.raises(ValueError, match="structure does not match"):
        fprune.compact(model, params, masks, structure.groups(other, (), {"input_ids": IDS}), (X,))
    before = {k: v.clone() for k, v in params.items()}
    fprune.group_structured(params, 0.5, s)
    assert all(torch.equal(before[k], params[k]) for k in params)
    assert not model.training  # analysis restores the mode it found
    model.train()
    structure.groups(model, (X,))
    assert model.training
    model.eval()


def test_dynamic_batch(cnn):
    model, s = cnn
    dynamic = ({0: torch.export.Dim.AUTO},)
    assert structure.groups(model, (X,), dynamic_shapes=dynamic).key() == s.key()
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(model, params, masks, s, (X,), dynamic_shapes=dynamic)
    y = torch.randn(7, 3, 8, 8)
    torch.testing.assert_close(small(y), fprune.masked_call(model, params, masks, (y,)), atol=1e-5, rtol=0)


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        return y[y > 0]  # a data-dependent shape


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        return y if y.sum() > 0 else -y  # Python control flow on values: export fails


def test_export_failure_and_data_dependent_sizes_are_reported():
    with pytest.raises(RuntimeError, match=r"torch\.export could not trace Branchy"):
        structure.groups(Branchy(), (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="data-dependent sizes"):
        structure.groups(DataDependent(), (torch.randn(2, 4),))


def test_toolkit_scores_drive_group_pruning(cnn):
    """A Taylor (SNIP) score from fprune.scores, summed per channel over the group (n=1)."""
    model, s = cnn
    params = params_of(model)
    labels = torch.tensor([0, 1])
    loss_fn = lambda p, x: nn.functional.cross_entropy(fprune.masked_call(model, p, {}, (x,)), labels)
    taylor = fprune.scores.snip(loss_fn, params, [X])
    masks = fprune.group_structured(params, 0.5, s, importance_scores=taylor, n=1)
    for g in s.groups:
        if g.prunable:
            want = reference_keep(reference_scores(params, g, 1, scores=taylor), round(0.5 * g.size))
            assert torch.equal(kept_channels(masks, g), want)


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class SwiGLU(nn.Module):
    """Llama's MLP block: RMSNorm (a mean over channels), gate * up."""

    def __init__(self):
        super().__init__()
        self.emb, self.norm = nn.Linear(6, 16), RMSNorm(16)
        self.up, self.gate, self.down = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.emb(x)
        h = h + self.down(nn.functional.silu(self.gate(self.norm(h))) * self.up(self.norm(h)))
        return self.head(self.norm(h))


def test_rmsnorm_swiglu():
    torch.manual_seed(0)
    model = SwiGLU().eval()
    x = torch.randn(2, 4, 6)
    s = structure.groups(model, (x,))
    mlp = s.group("up.weight:0")
    assert (mlp.size, mlp.prunable, mlp.exact) == (32, True, True)
    assert {(m.param, m.dim) for m in mlp.members} == {
        ("up.weight", 0),
        ("up.bias", 0),
        ("gate.weight", 0),
        ("gate.bias", 0),
        ("down.weight", 1),
    }
    residual = s.group("emb.weight:0")  # a statistic over channels: inexact, but still 16 channels
    assert residual.size == 16 and not residual.exact and "aten.mean" in residual.inexact_reason
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact(model, params, masks, s, (x,))
    torch.testing.assert_close(small(x), fprune.masked_call(model, params, masks, (x,)), atol=1e-5, rtol=0)
