"""fprune.compact (the module route) on every torch.nn layer kind it resizes: the user's own
class, smaller, equal to the masked model at other input sizes, with size attributes that
describe the new shapes; an ordinary model afterwards (modes, optimizer steps, save and load)."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fprune
from fprune.structure import CompactError
from structure_cases import (
    TORCH_CASES,
    Case,
    assert_outputs_close,
    assert_unchanged,
    prune,
    snapshot,
)
from tests.helpers import params_of

CASES = {c.name: c for c in TORCH_CASES}


@pytest.fixture(scope="module", params=list(CASES))
def pruned(request):
    case = CASES[request.param]
    model, s, params, masks = prune(case)
    return case, model, s, params, masks


def test_same_class_smaller_and_equal_at_other_sizes(pruned):
    case, model, s, params, masks = pruned
    before = snapshot(model)
    small = fprune.compact(model, params, masks, s, case.example)
    assert type(small) is type(model)
    assert [type(m) for m in small.modules()] == [type(m) for m in model.modules()]
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())
    assert not small.training  # the mode of the original (eval)
    for args in [case.example, *case.others]:
        with torch.no_grad():
            assert_outputs_close(small(*args), fprune.masked_call(model, params, masks, args))
    assert_unchanged(model, before)


def _rebuilt_shapes(m: nn.Module) -> dict | None:
    """The parameter shapes of a fresh layer built from ``m``'s size attributes alone."""
    if isinstance(m, nn.Linear):
        fresh = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
    elif isinstance(m, (nn.Conv1d, nn.Conv2d)):
        fresh = type(m)(
            m.in_channels, m.out_channels, m.kernel_size, groups=m.groups, bias=m.bias is not None
        )
    elif isinstance(m, nn.modules.batchnorm._BatchNorm):
        fresh = type(m)(m.num_features)
    elif isinstance(m, nn.LayerNorm):
        fresh = nn.LayerNorm(m.normalized_shape)
    elif isinstance(m, nn.Embedding):
        fresh = nn.Embedding(m.num_embeddings, m.embedding_dim)
    elif isinstance(m, nn.MultiheadAttention):
        fresh = nn.MultiheadAttention(m.embed_dim, m.num_heads, kdim=m.kdim, vdim=m.vdim)
        assert m.head_dim * m.num_heads == m.embed_dim
    else:
        return None
    # out_proj is a layer of its own (checked as an nn.Linear): its outputs may be narrower.
    return {
        k: tuple(v.shape)
        for k, v in fresh.state_dict().items()
        if k != "num_batches_tracked" and not k.startswith("out_proj.")
    }


def test_size_attributes_describe_the_new_shapes(pruned):
    case, model, s, params, masks = pruned
    small = fprune.compact(model, params, masks, s, case.example)
    checked = 0
    for name, m in small.named_modules():
        want = _rebuilt_shapes(m)
        if want is None:
            continue
        got = {k: tuple(v.shape) for k, v in m.state_dict().items() if k in want}
        assert got == want, name
        checked += 1
    assert checked >= 2
    changed = [n for n, m in small.named_modules() if repr(m) != repr(dict(model.named_modules())[n])]
    assert changed  # the printed model shows the new sizes


def test_resized_attributes_by_hand():
    conv2d = CASES["conv2d"]
    model, s, params, masks = prune(conv2d)
    small = fprune.compact(model, params, masks, s, conv2d.example)
    # 8 stem channels -> 4; the depthwise conv keeps its multiplier of 2 (groups follow the
    # channels); the grouped conv keeps its 4 groups, with 2 of 4 input channels and 1 of 3
    # output channels per group (the same ones in every group).
    assert (small.stem.out_channels, small.bn.num_features) == (4, 4)
    assert (small.dw.in_channels, small.dw.out_channels, small.dw.groups) == (4, 8, 4)
    assert small.bn2.num_features == 8 and small.bn2.running_var.shape == (8,)
    assert (small.gc.in_channels, small.gc.out_channels, small.gc.groups) == (8, 4, 4)
    assert small.fc.in_features == 4
    emb = CASES["embedding"]
    model, s, params, masks = prune(emb)
    small = fprune.compact(model, params, masks, s, emb.example)
    assert (small.emb.num_embeddings, small.emb.embedding_dim) == (20, 6)
    assert (small.up.out_features, small.down.in_features) == (16, 16)
    cross = CASES["cross_attention"]
    model, s, params, masks = prune(cross)
    small = fprune.compact(model, params, masks, s, cross.example)
    attn = small.attn
    assert (attn.embed_dim, attn.num_heads, attn.head_dim, attn.kdim, attn.vdim) == (16, 4, 4, 6, 5)
    assert not attn._qkv_same_embed_dim and attn.out_proj.out_features == 8


def test_layer_norm_width_with_allow_inexact():
    # A LayerNorm's channels are inexact (its statistics change): removed only when asked, and
    # then the module route computes what the graph route computes.
    emb = CASES["embedding"]
    model, s, params, _ = prune(emb)
    masks = fprune.group_structured(params, 0.25, s, where=lambda name, g: g.prunable)
    with pytest.raises(ValueError, match=r"not exact.*allow_inexact"):
        fprune.compact(model, params, masks, s, emb.example)
    small = fprune.compact(model, params, masks, s, emb.example, allow_inexact=True)
    graph = fprune.compact_graph(model, params, masks, s, emb.example, allow_inexact=True)
    assert small.norm.normalized_shape == (12,) and small.norm.weight.shape == (12,)
    assert small.proj.out_features == 12 and small.out.in_features == 12
    for args in [emb.example, *emb.others]:
        with torch.no_grad():
            torch.testing.assert_close(small(*args), graph(*args), atol=1e-5, rtol=0)


def test_train_and_eval_modes(pruned):
    case, model, s, params, masks = pruned
    model.train()
    try:
        small = fprune.compact(model, params, masks, s, case.example)
    finally:
        model.eval()
    assert all(m.training for m in small.modules())  # the mode of the original (train)
    small.eval()
    assert not any(m.training for m in small.modules())
    small.train()
    small(*case.others[-1])  # runs in training mode (BatchNorm batch statistics)


def _loss(out):
    return sum((t.float() ** 2).mean() for t in (out if isinstance(out, tuple) else (out,)))


def test_optimizer_steps_equal_masked_training(pruned):
    # Three SGD steps on the compact model give the compacted result of three SGD steps on the
    # masked model through masked_call (pruned entries get zero gradients there).
    case, model, s, params, masks = pruned
    small = fprune.compact(model, params, masks, s, case.example)
    small.eval()  # dropout and BatchNorm statistics fixed, so that both runs see the same function
    opt = torch.optim.SGD(small.parameters(), lr=0.1)
    for args in case.others[:3] * 2:
        opt.zero_grad()
        _loss(small(*args)).backward()
        opt.step()
    trained = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.SGD(trained.values(), lr=0.1)
    for args in case.others[:3] * 2:
        opt.zero_grad()
        _loss(fprune.masked_call(model, trained, masks, args)).backward()
        opt.step()
    trained = {k: v.detach() for k, v in trained.items()}
    want = fprune.compact(model, trained, masks, s, case.example)
    got = small.state_dict()
    for k, v in want.state_dict().items():
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=1e-5, msg=k)


def test_save_and_load(pruned, tmp_path):
    case, model, s, params, masks = pruned
    small = fprune.compact(model, params, masks, s, case.example)
    args = case.others[-1]
    with torch.no_grad():
        want = small(*args)
    # The whole model (pickled by class, so the class must be importable where it is loaded).
    torch.save(small, tmp_path / "small.pt")
    loaded = torch.load(tmp_path / "small.pt", weights_only=False)
    assert type(loaded) is type(model)
    with torch.no_grad():
        assert_outputs_close(loaded(*args), want, atol=0)
    # Its state_dict, into a compact copy of another dense model made with the same masks.
    buffer = io.BytesIO()
    torch.save(small.state_dict(), buffer)
    other = case.make(seed=1)
    skeleton = fprune.compact(other, params_of(other), masks, s, case.example)
    skeleton.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    with torch.no_grad():
        assert_outputs_close(skeleton(*args), want, atol=0)


def test_unstructured_zeros_stay_zeros():
    case = CASES["conv2d"]
    model, s, params, masks = prune(case)
    entries = fprune.l1_unstructured(params, 0.3, where=lambda name, p: p.dim() > 1)
    both = {k: masks[k] & entries[k] for k in masks}
    small = fprune.compact(model, params, both, s, case.example)
    # The same channels go; inside the kept ones, the unstructured zeros are still there.
    assert small.stem.weight.shape == (4, 3, 3, 3)
    keep = masks["stem.weight"].flatten(1).any(1)
    assert torch.equal(small.stem.weight != 0, both["stem.weight"][keep])
    for args in case.others:
        with torch.no_grad():
            assert_outputs_close(small(*args), fprune.masked_call(model, params, both, args))


def test_nothing_removed_warns_once():
    case = CASES["linear"]
    model, s, params, _ = prune(case)
    entries = fprune.identity(params)  # one entry zeroed per weight: no whole channel
    for k in entries:
        if entries[k].dim() == 2:
            entries[k] = entries[k].clone()
            entries[k][0, 0] = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = fprune.compact(model, params, entries, s, case.example)
    assert [str(w.message)[:40] for w in caught] == ["compact: the masks remove no channel (no"]
    assert caught[0].filename == __file__
    assert [p.shape for p in small.parameters()] == [p.shape for p in model.parameters()]
    with pytest.warns(UserWarning, match="remove no channel"):
        fprune.compact_graph(model, params, entries, s, case.example)


def test_tied_parameters_stay_tied():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.b = nn.Linear(8, 8)
            self.c = nn.Linear(8, 3)
            self.b2 = self.b  # the same layer called twice

        def forward(self, x):
            return self.c(torch.relu(self.b2(torch.relu(self.b(torch.relu(self.a(x)))))))

    torch.manual_seed(0)
    case = Case("tied", Tied, (torch.randn(2, 4),), [(torch.randn(5, 4),)])
    model, s, params, masks = prune(case)
    small = fprune.compact(model, params, masks, s, case.example)
    assert small.b is small.b2 and small.b.weight.shape == (4, 4)
    assert_outputs_close(small(*case.others[0]), fprune.masked_call(model, params, masks, case.others[0]))


def test_keeps_hooks_and_requires_grad_and_memory_is_its_own():
    case = CASES["linear"]
    model, s, params, masks = prune(case)
    calls = []
    handle = model[0].register_forward_hook(lambda m, i, o: calls.append(o.shape[-1]))
    model[2].bias.requires_grad_(False)
    try:
        small = fprune.compact(model, params, masks, s, case.example)
        calls.clear()
        small(*case.example)
        assert calls == [8]  # the copy's hook sees the copy's 8 channels
        assert not small[2].bias.requires_grad and small[0].weight.requires_grad
        # No parameter shares memory with the dense model or params: training one leaves the
        # other alone, even for tensors that keep their size (the output layer's bias).
        with torch.no_grad():
            small[4].bias.add_(1.0)
        assert not torch.equal(small[4].bias, model[4].bias)
    finally:
        handle.remove()
        model[2].bias.requires_grad_(True)


_STRUCTURES: dict = {}


@settings(max_examples=20)
@given(
    name=st.sampled_from(["linear", "conv2d", "conv1d", "embedding"]),
    amount=st.sampled_from([0.1, 0.25, 0.5, 0.75]),
    seed=st.integers(0, 3),
    batch=st.integers(1, 5),
)
def test_property_compact_equals_masked_for_any_amount_and_batch(name, amount, seed, batch):
    case = CASES[name]
    if name not in _STRUCTURES:  # one export per model
        model = case.make()
        _STRUCTURES[name] = (model, fprune.structure.groups(model, case.example))
    model, s = _STRUCTURES[name]
    torch.manual_seed(seed)
    params = {k: torch.randn_like(v) for k, v in params_of(model).items()}
    masks = fprune.group_structured(params, amount, s)
    emptied = any(
        not masks[m.param].any() for g in s.groups if g.prunable for m in g.members if m.param in masks
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small amount may remove no channel of a small group
        if emptied:  # round(0.75 * 2) = 2: a group of 2 channels loses both
            with pytest.raises(CompactError, match="remove every channel along"):
                fprune.compact(model, params, masks, s, case.example)
            return
        small = fprune.compact(model, params, masks, s, case.example)
    # Group masks prune whole channels: the kept entries are exactly what remains.
    assert sum(p.numel() for p in small.parameters()) == sum(int(m.sum()) for m in masks.values())
    args = tuple(
        torch.randn(batch, *a.shape[1:])
        if a.is_floating_point()
        else torch.randint(0, 20, (batch, *a.shape[1:]))
        for a in case.others[-1]
    )
    with torch.no_grad():
        assert_outputs_close(small(*args), fprune.masked_call(model, params, masks, args))
