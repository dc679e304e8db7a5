"""Post-training pruning of a small GPT-2-shaped language model, with held-out perplexity.

1. Corpus: the Python standard library's own source files, which ship with every Python
   (``sysconfig.get_paths()["stdlib"]``, without ``site-packages``, the test suites, ``idlelib``
   and ``lib2to3``: about 600 files, 11 MB on CPython 3.11). Files are sorted by path; every
   tenth is held out (about 1.1 MB). Tokens are bytes (a vocabulary of 256), so perplexity is
   per byte.
2. Train a GPT-2-shaped model (``transformers.GPT2LMHeadModel``: 4 layers, width 128, 4 heads,
   context 128; 0.8M parameters) with AdamW, 1000 steps of 16 random windows of 128 bytes of
   the training files (2M bytes seen).
3. Prune every weight of its blocks' attention and MLP layers (``Conv1D``; embeddings, the tied
   LM head and norms stay dense) with ``fprune.oneshot.prune`` from 64 calibration windows of
   128 bytes of the training files: magnitude, Wanda, SparseGPT, and SparseGPT followed by the
   least-squares refinement (``method=Refine(SparseGPT())``), at 50%, 2:4 and 70%, the unstructured ones also
   with OWL's per-block sparsities (``profile="owl"``; not defined for N:M).
4. Held-out perplexity of each (the same 128 windows of 128 bytes for all), a table and a plot.

Run ``python examples/posttrain_lm.py`` (training takes about 6 min of CPU time on one core of
a 2-core CPU, pruning and evaluation about one more; ``--quick`` runs a smaller, shorter version
in seconds). ``--json``/``--plot`` write the results (with OWL's per-block amounts) and the
figure: docs/posttrain.json and docs/posttrain.png come from ``python examples/posttrain_lm.py
--json docs/posttrain.json --plot docs/posttrain.png``. Needs the ``zoo`` extra (transformers)
and, for the plot, matplotlib.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import sysconfig
import time
from collections.abc import Sequence

import torch

import fprune

SKIPPED = ("site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__")
# (key, label, method): a fprune.oneshot.LayerMethod, or its shorthand.
METHODS = [
    ("magnitude", "magnitude", fprune.oneshot.Magnitude()),
    ("wanda", "Wanda", fprune.oneshot.Wanda()),
    ("sparsegpt", "SparseGPT", fprune.oneshot.SparseGPT(blocksize=128, damp=0.01)),
    ("sparsegpt+refine", "SparseGPT + refine", fprune.oneshot.Refine(fprune.oneshot.SparseGPT(), iters=30)),
]
SETTINGS = [
    ("50%", 0.5, None, None),
    ("50% OWL", 0.5, None, "owl"),
    ("2:4", None, (2, 4), None),
    ("70%", 0.7, None, None),
    ("70% OWL", 0.7, None, "owl"),
]


def corpus() -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """The standard library's source files, sorted by path: (training files, held-out files)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    found = []
    for folder, subfolders, names in os.walk(root):  # not into the skipped folders (site-packages)
        subfolders[:] = [name for name in subfolders if name not in SKIPPED]
        found += [pathlib.Path(folder, name) for name in names if name.endswith(".py")]
    files = sorted(found)
    return [p for i, p in enumerate(files) if i % 10], [p for i, p in enumerate(files) if i % 10 == 0]


def as_bytes(files: Sequence[pathlib.Path]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"".join(p.read_bytes() for p in files)), dtype=torch.uint8).long()


def windows(data: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length, (count,), generator=generator)
    return torch.stack([data[s : s + length] for s in starts.tolist()])


def build(quick: bool):
    import transformers

    config = transformers.GPT2Config(
        vocab_size=256,
        n_positions=128,
        n_embd=64 if quick else 128,
        n_layer=2 if quick else 4,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def train(model, data: torch.Tensor, steps: int, batch: int, length: int, seed: int, log) -> float:
    """AdamW with a linear warm-up and a cosine decay; returns the last steps' mean loss."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))),
    )
    model.train()
    losses = []
    started = time.perf_counter()
    for step in range(steps):
        ids = windows(data, batch, length, g)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if log and (step + 1) % max(1, steps // 10) == 0:
            log(
                f"step {step + 1}/{steps}: loss {sum(losses[-20:]) / len(losses[-20:]):.3f} "
                f"({time.perf_counter() - started:.0f} s)"
            )
    model.eval()
    return sum(losses[-20:]) / len(losses[-20:])


@torch.no_grad()
def perplexity(model, params: dict, held_out: torch.Tensor) -> float:
    total, count = 0.0, 0
    for chunk in held_out.split(32):
        out = torch.func.functional_call(model, params, (), {"input_ids": chunk, "labels": chunk})
        total += float(out.loss) * chunk.shape[0] * (chunk.shape[1] - 1)
        count += chunk.shape[0] * (chunk.shape[1] - 1)
    return math.exp(total / count)


def run(quick: bool = False, seed: int = 0, log=print) -> dict:
    torch.manual_seed(seed)
    train_files, held_files = corpus()
    train_data, held_data = as_bytes(train_files), as_bytes(held_files)
    g = torch.Generator().manual_seed(seed + 1)
    length = 64 if quick else 128
    held_out = windows(held_data, 64 if quick else 128, length, g)
    calibration = windows(train_data, 16 if quick else 64, length, g)
    batches = [{"input_ids": b} for b in calibration.split(16)]
    model = build(quick)
    steps = 60 if quick else 1000
    log(
        f"corpus: {len(train_files)} training files ({train_data.numel() / 1e6:.1f} MB), "
        f"{len(held_files)} held-out files ({held_data.numel() / 1e6:.1f} MB); model "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; {steps} steps"
    )
    started = time.perf_counter()
    final_loss = train(model, train_data, steps, 16, length, seed, log)
    trained = time.perf_counter() - started
    params = {k: v.detach() for k, v in model.named_parameters()}
    results: dict = {"dense": perplexity(model, params, held_out)}
    log(f"dense: held-out perplexity {results['dense']:.3f} per byte (training loss {final_loss:.3f})")
    started = time.perf_counter()
    for key, label, method in METHODS:
        for setting, sparsity, n_m, profile in SETTINGS:
            new, _ = fprune.oneshot.prune(
                model, params, batches, sparsity, method=method, n_m=n_m, profile=profile, masks=None
            )
            results[f"{key} {setting}"] = perplexity(model, new, held_out)
            log(f"{label} {setting}: {results[f'{key} {setting}']:.3f}")
    pruned = time.perf_counter() - started

    # OWL's per-block amounts, as prune computes them (input norms of the dense model).
    def in_blocks(name: str, p: torch.Tensor) -> bool:
        return ".h." in name and p.dim() == 2

    norms = fprune.calibration.input_norms(model, params, batches, where=in_blocks)
    owl = {}
    for sparsity in (0.5, 0.7):
        amounts = fprune.distributions.owl(params, norms, sparsity)
        owl[str(sparsity)] = {name.split(".")[2]: a for name, a in amounts.items() if a is not None}
    return {
        "results": results,
        "owl_block_amounts": owl,
        "train_files": len(train_files),
        "held_out_files": len(held_files),
        "train_bytes": int(train_data.numel()),
        "held_out_bytes": int(held_data.numel()),
        "held_out_tokens": int(held_out.numel()),
        "calibration_tokens": list(calibration.shape),
        "steps": steps,
        "final_training_loss": final_loss,
        "seconds_training": trained,
        "seconds_pruning": pruned,
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "quick": quick,
    }


def table(report: dict) -> str:
    """The markdown table of held-out perplexities (per byte)."""
    results = report["results"]
    head = "| method | " + " | ".join(s for s, *_ in SETTINGS) + " |"
    lines = [
        head,
        "|---" * (len(SETTINGS) + 1) + "|",
        f"| dense | {results['dense']:.2f} |" + " |" * (len(SETTINGS) - 1),
    ]
    for key, label, _ in METHODS:
        cells = [f"{results[f'{key} {s}']:.2f}" for s, *_ in SETTINGS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(METHODS)
    for i, (key, label, _) in enumerate(METHODS):
        xs = [j + (i - (len(METHODS) - 1) / 2) * width for j in range(len(SETTINGS))]
        ax.bar(xs, [results[f"{key} {s}"] for s, *_ in SETTINGS], width, label=label)
    ax.axhline(results["dense"], color="black", linestyle="--", linewidth=1, label="dense")
    ax.set_xticks(range(len(SETTINGS)), [s for s, *_ in SETTINGS])
    ax.set_yscale("log")
    ax.set_ylabel("held-out perplexity per byte (log)")
    ax.set_title("One-shot pruning of a 0.8M GPT-2 trained on the Python stdlib")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model, 60 steps: seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here")
    parser.add_argument("--plot", type=pathlib.Path, help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = run(args.quick, args.seed, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(report, args.plot)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
