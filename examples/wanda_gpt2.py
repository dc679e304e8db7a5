"""Wanda 2:4 pruning of a (tiny, randomly initialised) GPT-2, end to end, with fprune.

1. Build GPT-2 from a tiny ``transformers.GPT2Config`` (random weights, nothing downloaded).
2. Calibrate: run it on random token batches through ``fprune.calibration.input_norms``, which
   collects the L2 norm of every input feature of every ``Conv1D`` (GPT-2's linear layers, weight
   stored ``(in, out)``) during ``functional_call``; no hook is left behind.
3. Score: ``fprune.scores.wanda`` gives ``|W| * ||X_j||``.
4. Select 2:4: in every group of 4 consecutive input features of every output (``dim=0`` for a
   ``Conv1D`` weight), keep the 2 of highest score (``fprune.select.select`` with the ``NM(2, 4)``
   scope) for the attention and MLP weights of every block; embeddings and the tied LM head
   stay dense.
5. Run the pruned model with ``fprune.masked_call`` and compare its logits with the dense
   model's, for Wanda and for plain magnitude 2:4, on held-out random tokens.

With random weights there are no outlier features, so Wanda and magnitude choose similar masks.
A second run gives 4 features of every LayerNorm a 20x gain, a stand-in for the outlier
features of trained language models that Wanda was designed for: there Wanda's masks keep the
weights those features feed and its logits stay closer to the dense ones. Run:
``python examples/wanda_gpt2.py`` (a few seconds). Needs the ``zoo`` extra (transformers).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

import fprune
from fprune.select import NM


def build(n_layer: int = 2, n_embd: int = 64, vocab: int = 512, seed: int = 0, outliers: int = 0):
    """Tiny GPT-2 with random weights; ``outliers`` features of every LayerNorm get a 20x gain,
    a stand-in for the outlier features of trained language models (Dettmers et al. 2022)."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=n_layer,
        n_head=4,
        n_embd=n_embd,
        vocab_size=vocab,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    if outliers:
        chosen = torch.randperm(n_embd, generator=torch.Generator().manual_seed(seed))[:outliers]
        with torch.no_grad():
            for block in model.transformer.h:
                block.ln_1.weight[chosen] *= 20
                block.ln_2.weight[chosen] *= 20
    return model


def in_blocks(name: str, tensor: torch.Tensor) -> bool:
    """The attention and MLP weights of the transformer blocks (Conv1D, 2-d)."""
    return ".h." in name and name.endswith("weight") and tensor.dim() == 2


def two_four(scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """2:4 masks along the input features (dim 0 of a Conv1D weight) of the block weights."""
    return fprune.select.select(scores, None, scope=NM(2, 4, dim=0), where=in_blocks)


def relative_error(model, params, masks, tokens) -> float:
    with torch.no_grad():
        dense = model(tokens).logits
        pruned = fprune.masked_call(model, params, masks, (tokens,)).logits
    return float((pruned - dense).norm() / dense.norm())


def run(calibration_batches: int = 8, seed: int = 0, outliers: int = 0, progress=print) -> dict:
    model = build(seed=seed, outliers=outliers)
    params = {k: v.detach() for k, v in model.named_parameters()}
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    batches = [
        {"input_ids": torch.randint(0, vocab, (4, 32), generator=g)} for _ in range(calibration_batches)
    ]
    held_out = torch.randint(0, vocab, (4, 32), generator=g)

    norms = fprune.calibration.input_norms(model, params, batches, where=in_blocks)
    wanda = two_four(fprune.scores.wanda(params, norms))
    magnitude = two_four(fprune.scores.magnitude(params))
    pruned = [k for k in params if in_blocks(k, params[k])]
    for k in pruned:  # every group of 4 along the input features keeps exactly 2
        groups = wanda[k].T.reshape(wanda[k].shape[1], -1, 4)
        assert (groups.sum(-1) == 2).all(), k
    stats = fprune.sparsity(wanda)
    result = {
        "layers pruned": len(pruned),
        "block weights pruned": float(sum(wanda[k].numel() - wanda[k].sum() for k in pruned))
        / sum(wanda[k].numel() for k in pruned),
        "overall sparsity": float(stats.overall),
        "logit error, Wanda 2:4": relative_error(model, params, wanda, held_out),
        "logit error, magnitude 2:4": relative_error(model, params, magnitude, held_out),
        "masks differ (fraction of entries)": float(
            sum((wanda[k] != magnitude[k]).sum() for k in pruned) / sum(wanda[k].numel() for k in pruned)
        ),
    }
    if progress is not None:
        progress(f"-- {outliers} outlier features per LayerNorm" if outliers else "-- random weights")
        for key, value in result.items():
            progress(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    return result


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8, help="calibration batches of 4 x 32 tokens")
    parser.add_argument("--outliers", type=int, default=4, help="outlier features in the second run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return {"random": run(args.batches), "outliers": run(args.batches, outliers=args.outliers)}


if __name__ == "__main__":
    main(sys.argv[1:])
