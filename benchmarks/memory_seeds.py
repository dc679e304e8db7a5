"""Extra peak memory of one global selection in fresh processes, one per hash seed.

Usage (from the repository root)::

    python -m benchmarks.memory_seeds --size 100M --amount 0.9 --seeds 0 1 2 3 4 5
    python -m benchmarks.memory_seeds --size 100M --amount 0.9 --mmap-threshold 131072

Each process builds the transformer-like model of ``benchmarks/models.py``, warms up on the tiny
one, then runs ``fprune.global_unstructured`` on every Linear weight and reports the RSS high-water
above the one before the call, per weight (the returned bool masks are 1 byte per weight). With
``--mmap-threshold`` the processes run with ``MALLOC_MMAP_THRESHOLD_`` set (glibc's allocator
then keeps a fixed threshold instead of raising it when a large block is freed). Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import gc, json, resource, sys
import torch
torch.set_num_threads({threads})
from benchmarks import models
import fprune
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tiny = {{n + ".weight": m.weight.detach() for n, m in models.weight_modules(models.transformer_like("tiny"))}}
fprune.global_unstructured(tiny, {amount})
model = models.transformer_like("{size}")
weights = {{n + ".weight": m.weight.detach() for n, m in models.weight_modules(model)}}
n = sum(p.numel() for p in weights.values())
gc.collect()
base = rss()
masks = fprune.global_unstructured(weights, {amount})
print(json.dumps({{"weights": n, "extra_bytes_per_weight": (rss() - base) / n}}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="100M")
    parser.add_argument("--amount", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--mmap-threshold", type=int, default=None)
    args = parser.parse_args(argv)
    code = CHILD.format(threads=args.threads, amount=args.amount, size=args.size)
    rows = []
    for seed in args.seeds:
        env = dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=str(ROOT))
        if args.mmap_threshold is not None:
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append((seed, json.loads(done.stdout.strip().splitlines()[-1])["extra_bytes_per_weight"]))
    threshold = "glibc's default" if args.mmap_threshold is None else f"{args.mmap_threshold}"
    print(
        f"`global_unstructured` on transformer-like {args.size}, amount {args.amount}, "
        f"{args.threads} thread(s), mmap threshold: {threshold}\n"
    )
    print("| PYTHONHASHSEED | extra B/weight (masks included) |\n|---:|---:|")
    for seed, value in rows:
        print(f"| {seed} | {value:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
