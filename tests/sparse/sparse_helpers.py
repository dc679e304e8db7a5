"""Shared pieces of the fprune.sparse tests: small models, their pruned params, a close check."""

from __future__ import annotations

import itertools

import pytest
import torch

import fprune


def mlp(seed: int = 0, sizes: tuple = (48, 96, 32)) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list = []
    for a, b in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).eval()


def gpt2(seed: int = 0, layers: int = 2, width: int = 32, lm_head: bool = False) -> torch.nn.Module:
    """GPT-2 from a tiny config (transformers' Conv1D layers; no download)."""
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = GPT2Config(
        n_embd=width, n_layer=layers, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config) if lm_head else GPT2Model(config)
    return model.eval()


def linear_weights(name: str, p: torch.Tensor) -> bool:
    """``where`` for the weights of linear layers (2-D, not GPT-2's embeddings)."""
    return p.dim() == 2 and not name.startswith(("wte", "wpe", "transformer.wte", "transformer.wpe"))


def pruned(model: torch.nn.Module, amount: float) -> tuple[dict, dict]:
    """``model``'s params (detached) and l1_unstructured masks of its linear weights."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, amount, where=linear_weights)
    return params, {k: m for k, m in masks.items() if linear_weights(k, params[k])}


def output(out):
    """The tensor a model returns (transformers' outputs hold it in a field)."""
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5) -> None:
    """Equal to ``rtol`` relative to the largest entry of ``want`` (sums in another order)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    assert err <= rtol * max(scale, 1e-30), f"max abs diff {err:.3g} > {rtol} x {scale:.3g}"


def llama(seed: int = 0, layers: int = 2, width: int = 32) -> torch.nn.Module:
    """A Llama causal LM from a tiny config (nn.Linear layers; no download)."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()
