"""One-shot SparseGPT 50% on a 1.1B Llama-architecture decoder in bfloat16: peak memory and time.

Usage (from the repository root; needs about 3 GiB free beyond the 2.1 GiB model)::

    python -m benchmarks.posttrain_1b --json benchmarks/results/posttrain_1b.json \\
        --markdown benchmarks/results/posttrain_1b.md
    python -m benchmarks.posttrain_1b --layers 4,8 --json ... # the same model at 4 and 8 layers
    python -m benchmarks.posttrain_1b --layers 22,4,8           # all three, one table

The model is ``transformers.LlamaForCausalLM`` built from a config with TinyLlama-1.1B's shape
(hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 kv heads, vocab 32000, untied
embeddings; 1.10B parameters), bfloat16, ``eval()``, with random weights (each matrix a window
at a random offset of one pool of 2**24 normal samples, std 0.02; norms at one); calibration is 8
sequences of 128 random tokens in one batch. Each depth runs in a fresh process:
``fprune.oneshot.prune(model, params, batches, 0.5, method="sparsegpt")`` with fprune's
lowest-memory options where ``prune`` takes them (``inplace=True``: pruned weights written into
the module's own, block by block; ``masks=None``). Measured: the RSS before the model, with the
model and data built (the baseline, after freed memory is handed back with ``malloc_trim``),
the RSS high-water during pruning (the kernel's high-water reset to the baseline through
``/proc/self/clear_refs``), and the RSS and high-water at each block's progress report, which
show whether the peak grows with depth. Every pruned layer's sparsity is checked (its zeros).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/posttrain_1b.py
    sys.path.insert(0, str(ROOT))

from benchmarks.posttrain_peer import (  # noqa: E402  (after the path is set)
    MIB,
    _commit,
    _status,
    _version,
    fprune_options,
    peak_since_reset,
    reset_peak,
)

BLOCKS: list[dict] = []


def _random_model(transformers: Any, config: Any, dtype: Any) -> Any:
    """The model with its matrices (linear and embedding weights) filled from one pool of 2**24
    normal samples (std 0.02, as the config's init) at a random offset each, and its norms at
    one: the weight init of transformers draws every entry, minutes for 1.1B on a loaded core."""
    import torch

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an older transformers: its own init
        return transformers.LlamaForCausalLM._from_config(config, dtype=dtype).eval()
    with no_init_weights():
        model = transformers.LlamaForCausalLM._from_config(config, dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    pool = (torch.randn(2**24, generator=g) * config.initializer_range).to(dtype)
    pool = torch.cat([pool, pool])  # any window of len(pool) // 2 from any offset
    size = len(pool) // 2
    with torch.no_grad():
        for p in model.parameters():
            flat = p.view(-1)
            if p.dim() == 1:
                flat.fill_(1.0)
                continue
            for start in range(0, flat.numel(), size):
                n = min(size, flat.numel() - start)
                offset = int(torch.randint(0, size, (), generator=g))
                flat[start : start + n].copy_(pool[offset : offset + n])
    return model


def worker(layers: int, threads: int | None) -> dict[str, Any]:
    import torch
    import transformers

    import fprune

    if threads:
        torch.set_num_threads(threads)
    start_rss = _status("VmRSS")
    config = transformers.LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    built = time.perf_counter()
    model = _random_model(transformers, config, torch.bfloat16)
    build_s = time.perf_counter() - built
    params = {k: v.detach() for k, v in model.named_parameters()}
    model_bytes = sum(p.numel() * p.element_size() for p in params.values())
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, config.vocab_size, (8, 128), generator=g)}]
    options = {"method": "sparsegpt", **fprune_options(fprune.oneshot.prune)}
    baseline_rss, how = reset_peak()
    print(
        f"built in {build_s:.0f} s: {model_bytes / MIB:.0f} MiB of parameters, "
        f"RSS {baseline_rss / MIB:.0f} MiB",
        file=sys.stderr,
        flush=True,
    )
    load_before = os.getloadavg()[0]
    started, cpu_started = time.perf_counter(), time.process_time()

    def progress(report: Any) -> None:
        if getattr(report, "phase", "prune") == "prune":
            BLOCKS.append(
                {
                    "block": report.number,
                    "rss": _status("VmRSS") - baseline_rss,
                    "hwm": _status("VmHWM") - baseline_rss,
                    "seconds": time.perf_counter() - started,
                    "cpu_seconds": time.process_time() - cpu_started,
                    "statistics_s": report.statistics_seconds,
                    "pruning_s": report.pruning_seconds,
                    "forward_s": report.forward_seconds,
                }
            )
            print(f"block {report.number + 1}/{report.total}: {BLOCKS[-1]}", file=sys.stderr, flush=True)

    new, _ = fprune.oneshot.prune(model, params, batches, 0.5, progress=progress, **options)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    peak = peak_since_reset(how)
    if not options.get("inplace"):
        fprune.load_into(model, new)
    del new
    sparsity = {
        f"{name}.weight": float((m.weight == 0).float().mean())
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.startswith("model.layers.")
    }
    return {
        "layers": layers,
        "parameters": sum(p.numel() for p in params.values()),
        "model_bytes": model_bytes,
        "dtype": str(next(model.parameters()).dtype),
        "calibration_tokens": [8, 128],
        "options": {k: str(v) for k, v in options.items()},
        "threads": torch.get_num_threads(),
        "build_s": build_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "process_rss_start": start_rss,
        "baseline_rss": baseline_rss,
        "peak_rss": peak,
        "extra_peak": peak - baseline_rss,
        "peak_measured_by": how,
        "blocks": BLOCKS,
        "layers_pruned": len(sparsity),
        "sparsity_min": min(sparsity.values()),
        "sparsity_max": max(sparsity.values()),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def markdown(record: dict) -> str:
    lines = [
        "### One-shot SparseGPT 50%, Llama-architecture 1.1B (TinyLlama's shape), bfloat16",
        "",
        (
            f"{record['date']}, commit {record['commit']}, `{record['command']}`, python "
            f"{record['python']}, torch {record['versions']['torch']}, transformers "
            f"{record['versions']['transformers']}; free memory at the start {record['free_gib']:.1f} GiB. "
            f"Calibration 8 x 128 tokens; fresh process per depth; fprune options "
            f"{record['runs'][0]['options']}. Extra peak: RSS high-water during pruning minus the RSS "
            f"with the model built. Block high-water: the largest extra high-water seen at a block's "
            f"report, over the first half of the blocks and over the second."
        ),
        "",
        (
            "| layers | parameters | model (MiB) | RSS with model (MiB) | peak RSS (MiB) | "
            "extra peak (MiB) | extra / model | block high-water, 1st half / 2nd (MiB) | time (s) | "
            "CPU (s) | threads, load | layer sparsity |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in record["runs"]:
        hwm = [b["hwm"] for b in run["blocks"]]
        half = max(1, len(hwm) // 2)
        first, second = max(hwm[:half], default=0), max(hwm[half:], default=0)
        lines.append(
            f"| {run['layers']} | {run['parameters'] / 1e9:.3f}B | {run['model_bytes'] / MIB:.0f} | "
            f"{run['baseline_rss'] / MIB:.0f} | {run['peak_rss'] / MIB:.0f} | "
            f"{run['extra_peak'] / MIB:.0f} | "
            f"{run['extra_peak'] / run['model_bytes']:.3f} | {first / MIB:.0f} / {second / MIB:.0f} | "
            f"{run['wall_s']:.0f} | {run['cpu_s']:.0f} | {run['threads']}, {run['load_before']:.1f}-"
            f"{run['load_after']:.1f} | {run['sparsity_min']:.4f}-{run['sparsity_max']:.4f} |"
        )
    return "\n".join(lines)


def _free_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="22", help="depths, comma-separated (default 22)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads)))
        return 0
    free = _free_gib()
    runs = []
    for layers in [int(n) for n in args.layers.split(",")]:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.posttrain_1b",
                "--worker",
                str(layers),
                "--threads",
                str(args.threads),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        if proc.returncode:
            return proc.returncode
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(
            ["python", "-m", "benchmarks.posttrain_1b", *(argv if argv is not None else sys.argv[1:])]
        ),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("torch", "transformers")},
        "free_gib": free,
        "runs": runs,
    }
    text = markdown(record)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
