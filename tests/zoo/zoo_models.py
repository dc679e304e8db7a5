"""The model zoo: small models built from real definitions, randomly initialised (nothing downloaded).

Every case says how to build the model (seeded, dropout off), its inputs, which tensor of its
output to look at, and which parameters are prunable (every tensor with 2 or more dims: weight
matrices, conv kernels, embeddings, ``in_proj_weight``, LSTM/GRU ``weight_ih``/``weight_hh``).
The Hugging Face models need ``transformers`` (the ``zoo`` extra); without it they are absent.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import fprune

try:
    import transformers
except ImportError:  # the zoo's HF cases are optional
    transformers = None


@dataclasses.dataclass(frozen=True)
class Case:
    """One zoo model: ``build(seed=0)`` gives it in eval mode; ``inputs()`` gives ``(args, kwargs)``."""

    name: str
    build: Callable[..., nn.Module]
    inputs: Callable[[], tuple[tuple, dict]]
    output: Callable[[Any], torch.Tensor]  # the tensor of the module's output that tests compare
    tied: tuple[tuple[str, str], ...] = ()  # (name kept in named_parameters, tied alias)

    def __repr__(self) -> str:
        return self.name


def prunable(name: str, tensor: torch.Tensor) -> bool:
    """The ``where=`` of the zoo: weight matrices, kernels and embeddings; never biases or norms."""
    return tensor.dim() >= 2


def seeded(build: Callable[[], nn.Module]) -> Callable[..., nn.Module]:
    """``build`` run under ``torch.manual_seed(seed)``, the model put in eval mode."""

    def make(seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return build().eval()

    return make


def _tokens(vocab: int, shape=(2, 7), seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _randn(*shape, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class ConvNetBN(nn.Module):
    """A small CNN with BatchNorm (running-stat buffers) and a linear head."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 12, 3),
            nn.BatchNorm2d(12),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class EmbeddingClassifier(nn.Module):
    """Bag of embeddings (``nn.Embedding`` with a padding index) and a linear head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 12, padding_idx=0)
        self.head = nn.Linear(12, 3)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


def _transformer_encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


TORCH_CASES = [
    Case(
        "transformer_encoder",
        seeded(_transformer_encoder),
        lambda: ((_randn(2, 6, 16),), {}),
        lambda out: out,
    ),
    Case(
        "multihead_attention",
        seeded(lambda: nn.MultiheadAttention(16, 2, batch_first=True)),
        lambda: ((_randn(2, 5, 16), _randn(2, 6, 16, seed=2), _randn(2, 6, 16, seed=3)), {}),
        lambda out: out[0],
    ),
    Case(
        "lstm",
        seeded(lambda: nn.LSTM(6, 10, num_layers=2, batch_first=True)),
        lambda: ((_randn(2, 5, 6),), {}),
        lambda out: out[0],
    ),
    Case(
        "gru",
        seeded(lambda: nn.GRU(6, 8, batch_first=True, bidirectional=True)),
        lambda: ((_randn(2, 5, 6),), {}),
        lambda out: out[0],
    ),
    Case("convnet_batchnorm", seeded(ConvNetBN), lambda: ((_randn(4, 3, 8, 8),), {}), lambda out: out),
    Case(
        "embedding",
        seeded(EmbeddingClassifier),
        lambda: ((_tokens(40),), {}),
        lambda out: out,
    ),
]


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    return transformers.BertModel(config)


def _bert_inputs():
    ids = _tokens(100)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, -2:] = 0  # a padded sequence
    return (ids,), {"attention_mask": attention_mask}


HF_CASES = [
    Case(
        "gpt2",
        seeded(_gpt2),
        lambda: ((_tokens(100),), {}),
        lambda out: out.logits,
        tied=(("transformer.wte.weight", "lm_head.weight"),),
    ),
    Case(
        "bert",
        seeded(_bert),
        _bert_inputs,
        lambda out: torch.cat([out.last_hidden_state.flatten(1), out.pooler_output], 1),
    ),
]


def buffers_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.clone() for name, b in model.named_buffers()}


def run(case: Case, model: nn.Module, params=None, masks=None, buffers=None) -> torch.Tensor:
    """The case's output tensor: a plain call, or ``masked_call`` with ``params`` and ``masks``."""
    args, kwargs = case.inputs()
    if params is None:
        return case.output(model(*args, **kwargs))
    state = dict(params) if buffers is None else {**params, **buffers}
    return case.output(fprune.masked_call(model, state, masks, args, kwargs))


def zeroed_copy(model: nn.Module, masks: dict[str, torch.Tensor]) -> nn.Module:
    """The reference: a deep copy whose parameters have their pruned entries set to zero in place.

    Parameters are modified through the module itself (``named_parameters``), so tied aliases
    see the zeros too, and every code path that reads a weight reads the pruned one.
    """
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in copied.named_parameters():
            if name in masks:
                p.mul_(masks[name].to(p.dtype))
    return copied


def owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """``("a.b.weight")`` -> ``(model.a.b, "weight")``: what torch.nn.utils.prune takes."""
    module_name, _, leaf = name.rpartition(".")
    return (model.get_submodule(module_name) if module_name else model), leaf
