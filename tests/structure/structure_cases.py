"""Models and helpers shared by the tests of fprune.compact (tests/structure)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fprune
from tests.helpers import params_of


def masked_copy(model: nn.Module, params: dict, masks: Any) -> nn.Module:
    """A deep copy of ``model`` whose parameters are the masked ``params`` (for generate)."""
    out = copy.deepcopy(model)
    out.load_state_dict(fprune.apply_masks(params, masks), strict=False)
    return out


def tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of an output (a tensor, a tuple, a transformers ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in tensors(v)]
    return []


def assert_outputs_close(got: Any, want: Any, atol: float = 1e-5) -> None:
    """Equal within ``atol`` times the output's scale (``max(1, max|want|)``), compact's own rule."""
    got, want = tensors(got), tensors(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(w.abs().max())) if w.numel() and w.is_floating_point() else 1.0
        torch.testing.assert_close(g, w, atol=atol * scale, rtol=0)


def snapshot(model: nn.Module) -> dict:
    """What compact must leave as it was: values, attributes, hooks and flags of every module."""
    state = {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()}
    modules = {}
    for name, m in model.named_modules():
        attrs = {
            k: v
            for k, v in vars(m).items()
            if not k.startswith("_") and not isinstance(v, (torch.Tensor, nn.Module))
        }
        hooks = {k: list(v) for k, v in vars(m).items() if k.endswith("hooks") and isinstance(v, dict)}
        params = {k: id(v) for k, v in m._parameters.items()}
        modules[name] = (type(m), repr(attrs), hooks, params, m.training)
    return {"state": state, "modules": modules}


def assert_unchanged(model: nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["modules"] == before["modules"]
    assert after["state"].keys() == before["state"].keys()
    for k, v in before["state"].items():
        assert torch.equal(after["state"][k], v), k


# ---------------------------------------------------------------------------------------------
# torch.nn models, one per layer kind


class Conv2dNet(nn.Module):
    """Conv2d + BatchNorm2d, a depthwise conv with a channel multiplier, a grouped conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 16, 3, padding=1, groups=8)  # depthwise, multiplier 2
        self.bn2 = nn.BatchNorm2d(16)
        self.gc = nn.Conv2d(16, 12, 3, padding=1, groups=4)  # grouped
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.bn2(self.dw(x)))
        x = torch.relu(self.gc(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Conv1dNet(nn.Module):
    """Conv1d + BatchNorm1d, a depthwise Conv1d, a grouped Conv1d, global pooling."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 12, 3, padding=1)
        self.bn = nn.BatchNorm1d(12)
        self.dw = nn.Conv1d(12, 12, 5, padding=2, groups=12)
        self.gc = nn.Conv1d(12, 8, 1, groups=2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.relu(self.gc(torch.relu(self.dw(x))))
        return self.fc(x.mean(-1))


class EmbeddingNet(nn.Module):
    """An embedding whose width feeds a linear layer (exact), and a LayerNorm'd MLP."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.proj = nn.Linear(12, 16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)

    def forward(self, ids):
        h = self.proj(self.emb(ids))
        h = self.norm(h + self.down(nn.functional.gelu(self.up(h))))
        return self.out(h)


class CrossAttention(nn.Module):
    """nn.MultiheadAttention with kdim and vdim (keys and values from another stream)."""

    def __init__(self):
        super().__init__()
        self.keys = nn.Linear(6, 12)
        self.values = nn.Linear(6, 10)
        self.attn = nn.MultiheadAttention(16, 4, kdim=12, vdim=10, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x, memory):
        y, _ = self.attn(x, self.keys(memory), self.values(memory), need_weights=False)
        return self.head(y)


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer between two linear layers."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layer(self.inp(x)))


@dataclasses.dataclass
class Case:
    """A model, its example inputs, inputs of other sizes, and the groups to prune."""

    name: str
    build: Callable[[], nn.Module]
    example: tuple
    others: list  # argument tuples of other sizes
    where: Callable | None = None

    def make(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        model = self.build()
        with torch.no_grad():  # non-trivial BatchNorm statistics, so that slicing them matters
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.running_mean.uniform_(-1, 1)
                    m.running_var.uniform_(0.5, 2)
        return model.eval()


def _ids(*shape):
    return torch.randint(0, 20, shape, generator=torch.Generator().manual_seed(sum(shape)))


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


TORCH_CASES = [
    Case(
        "linear",
        lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 3)),
        (_randn(2, 6),),
        [(_randn(1, 6),), (_randn(7, 6),), (_randn(3, 5, 6),)],
    ),
    Case(
        "conv2d",
        Conv2dNet,
        (_randn(2, 3, 8, 8),),
        [(_randn(1, 3, 8, 8),), (_randn(5, 3, 13, 9),), (_randn(2, 3, 32, 32),)],
    ),
    Case("conv1d", Conv1dNet, (_randn(2, 4, 10),), [(_randn(1, 4, 10),), (_randn(6, 4, 23),)]),
    Case("embedding", EmbeddingNet, (_ids(2, 5),), [(_ids(1, 3),), (_ids(4, 9),)]),
    Case(
        "cross_attention",
        CrossAttention,
        (_randn(2, 5, 16), _randn(2, 7, 6)),
        [(_randn(1, 3, 16), _randn(1, 2, 6)), (_randn(4, 9, 16), _randn(4, 11, 6))],
        where=lambda name, g: g.kind != "head" and g.exact,
    ),
    Case(
        "encoder_layer",
        Encoder,
        (_randn(2, 5, 6),),
        [(_randn(1, 2, 6),), (_randn(3, 11, 6),)],
        where=lambda name, g: g.kind != "head" and g.exact,
    ),  # heads: see test_structure_compact_errors
]


def prune(
    case_or_model: Any,
    example: tuple | None = None,
    kwargs: dict | None = None,
    *,
    amount: float = 0.5,
    where: Callable | None = None,
    seed: int = 0,
):
    """``(model, structure, params, masks)`` for a case (or a model and its example)."""
    if isinstance(case_or_model, Case):
        model, example, where = case_or_model.make(seed), case_or_model.example, case_or_model.where
    else:
        model = case_or_model
    s = fprune.structure.groups(model, example, kwargs)
    params = params_of(model)
    masks = fprune.group_structured(params, amount, s, where=where)
    return model, s, params, masks


# ---------------------------------------------------------------------------------------------
# transformers models from tiny configs (nothing downloaded)


def transformers_or_skip():
    return pytest.importorskip("transformers")


def gpt2(seed: int = 0, attn: str = "sdpa"):
    transformers = transformers_or_skip()
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=64,
        n_positions=64,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation=attn,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def bert(seed: int = 0):
    transformers = transformers_or_skip()
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
    )
    return transformers.BertModel(config).eval()


def llama(seed: int = 0):
    transformers = transformers_or_skip()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


IDS = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
