"""Benchmark section "posttrain": one-shot SparseGPT at 50% on GPT-2 124M, time and peak memory.

Usage (from the repository root)::

    python -m benchmarks.posttrain --json benchmarks/results/posttrain.json \\
        --markdown benchmarks/results/posttrain.md
    python -m benchmarks --only posttrain        # the same section from the runner
    python -m benchmarks.posttrain --quick       # a 2-layer GPT-2 (seconds)
    python -m benchmarks.posttrain --inplace --json benchmarks/results/posttrain_inplace.json \\
        --markdown benchmarks/results/posttrain_inplace.md   # inplace=True

The model is ``transformers.GPT2LMHeadModel(GPT2Config())`` (124M parameters, random init,
nothing downloaded, float32, ``eval()``); calibration is 64 sequences of 256 random tokens in
8 batches of 8. ``fprune.oneshot.prune(model, params, batches, 0.5)`` (SparseGPT, blocksize 128,
damp 0.01) runs in a fresh process, so the peak memory is that process's RSS high-water
(``ru_maxrss``): after the model and the data are built (the baseline), and after the pruning.
The time is split as :class:`fprune.oneshot.BlockReport` reports it: the first block's inputs
captured, each block's statistics (its forward with the hessians accumulated), the weight
updates (``sparsegpt``), and the pruned block's forward for the next block's inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/posttrain.py
    sys.path.insert(0, str(ROOT))

TARGET_SECONDS = 300.0
TARGET_MEMORY_RATIO = 1.5


def _rss_peak() -> int:
    """The process's RSS high-water mark in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(quick: bool, threads: int | None, inplace: bool = False) -> dict[str, Any]:
    """Build GPT-2 and the calibration data, then prune; runs in its own process."""
    import torch
    import transformers

    import fprune

    if threads:
        torch.set_num_threads(threads)
    start_rss = _rss_now()
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4) if quick else transformers.GPT2Config()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    model_bytes = sum(p.numel() * p.element_size() for p in params.values())
    g = torch.Generator().manual_seed(1)
    sequences, length, per_batch = (16, 64, 8) if quick else (64, 256, 8)
    tokens = torch.randint(0, config.vocab_size, (sequences, length), generator=g)
    batches = [{"input_ids": tokens[i : i + per_batch]} for i in range(0, sequences, per_batch)]
    baseline_rss, baseline_peak = _rss_now(), _rss_peak()
    reports: list = []
    load_before = os.getloadavg()[0]
    started, cpu_started = time.perf_counter(), time.process_time()
    new, masks = fprune.oneshot.prune(model, params, batches, 0.5, progress=reports.append, inplace=inplace)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    peak = _rss_peak()
    load_after = os.getloadavg()[0]
    pruned = [k for k, m in masks.items() if not m.all()]
    statistics = sum(r.statistics_seconds for r in reports)
    updates = sum(r.pruning_seconds for r in reports)
    forward = sum(r.forward_seconds for r in reports)
    # inplace=True returns the model's own tensors: only the masks are new
    output_bytes = sum(0 if inplace else new[k].numel() * new[k].element_size() for k in pruned) + sum(
        m.numel() for m in masks.values()
    )
    return {
        "model": "gpt2-2x128" if quick else "gpt2-124M",
        "inplace": inplace,
        "parameters": sum(p.numel() for p in params.values()),
        "model_bytes": model_bytes,
        "calibration_tokens": [sequences, length],
        "threads": torch.get_num_threads(),
        "wall_s": wall,
        "cpu_s": cpu,
        "capture_s": wall - statistics - updates - forward,
        "statistics_s": statistics,
        "updates_s": updates,
        "forward_s": forward,
        "process_rss_start": start_rss,
        "baseline_rss": baseline_rss,
        "baseline_peak": baseline_peak,
        "peak_rss": peak,
        "extra_peak": peak - baseline_peak,
        "output_bytes": output_bytes,
        "layers_pruned": len(pruned),
        "sparsity_of_pruned": float(
            sum(int((~masks[k]).sum()) for k in pruned) / sum(masks[k].numel() for k in pruned)
        ),
        "load_before": load_before,
        "load_after": load_after,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def markdown(record: dict[str, Any]) -> str:
    mib = 2**20
    wall = record["wall_s"]

    def share(key: str) -> str:
        return f"{record[key]:.1f} s ({100 * record[key] / wall:.0f}%)"

    model = record["model_bytes"]
    lines = [
        f"### Post-training: one-shot SparseGPT 50%, {record['model']}"
        + (", inplace=True" if record.get("inplace") else ""),
        "",
        (
            f"{record['parameters'] / 1e6:.1f}M parameters ({model / mib:.0f} MiB float32), calibration "
            f"{record['calibration_tokens'][0]} x {record['calibration_tokens'][1]} tokens, "
            f"{record['threads']} threads, load {record['load_before']:.1f} before / "
            f"{record['load_after']:.1f} after (1-minute average). Target: under "
            f"{TARGET_SECONDS / 60:.0f} min and {TARGET_MEMORY_RATIO}x the model's memory."
        ),
        "",
        "| measure | value |",
        "|---|---|",
        f"| time, total | {wall:.1f} s ({wall / 60:.1f} min) |",
        f"| CPU time of the process (all threads) | {record['cpu_s']:.1f} s |",
        f"| capture of the first block's inputs | {share('capture_s')} |",
        f"| statistics: blocks' forwards with hessians | {share('statistics_s')} |",
        f"| SparseGPT updates | {share('updates_s')} |",
        f"| pruned blocks' forwards (next inputs) | {share('forward_s')} |",
        (
            f"| RSS before the model (torch, transformers imported) | "
            f"{record['process_rss_start'] / mib:.0f} MiB |"
        ),
        f"| RSS high-water with model and data (baseline) | {record['baseline_peak'] / mib:.0f} MiB |",
        f"| RSS high-water after pruning (peak) | {record['peak_rss'] / mib:.0f} MiB |",
        (
            f"| peak - baseline | {record['extra_peak'] / mib:.0f} MiB = "
            f"{record['extra_peak'] / model:.2f}x the model |"
        ),
        (
            f"| of which the returned weights and masks | {record['output_bytes'] / mib:.0f} MiB = "
            f"{record['output_bytes'] / model:.2f}x the model |"
        ),
        f"| peak / baseline | {record['peak_rss'] / record['baseline_peak']:.2f}x |",
        (
            f"| (peak - RSS before the model) / model | "
            f"{(record['peak_rss'] - record['process_rss_start']) / model:.2f}x |"
        ),
        f"| layers pruned, their sparsity | {record['layers_pruned']}, {record['sparsity_of_pruned']:.4f} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2-layer GPT-2: seconds")
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--inplace", action="store_true", help="prune with inplace=True")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.quick, args.threads, args.inplace)))
        return 0
    flags = (
        ["--worker"]
        + (["--quick"] if args.quick else [])
        + (["--inplace"] if args.inplace else [])
        + (["--threads", str(args.threads)] if args.threads else [])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.posttrain", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    text = markdown(record)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
