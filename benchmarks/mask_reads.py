"""How a bool mask is read when applied: the choices behind ``fprune.apply._masked``.

Usage (from the repository root; well under a minute on one thread)::

    python benchmarks/mask_reads.py [--numel 1000000] [--out benchmarks/results/mask_reads.md]

One float32 weight of ``numel`` entries and a bool mask with half its entries kept, on the CPU,
one thread. Eager: the cast alone and the multiply, with the mask cast from bool and from a uint8
view of it, and ``torch.where``. Compiled (inductor, forward only): ``p * mask.to(p.dtype)`` with the mask
passed as bool and as uint8. Process CPU time per call, the median of 7 rounds, the variants
interleaved so that a busy machine slows each alike; the ratios are the figures to read.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import time
from collections.abc import Callable

import torch


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def measure(numel: int, rounds: int = 7) -> dict[str, float]:
    torch.manual_seed(0)
    p = torch.randn(numel)
    mask = torch.rand(numel) < 0.5
    as_uint8 = mask.to(torch.uint8)
    product = torch.compile(lambda w, m: w * m.to(w.dtype), dynamic=False)
    variants = {
        "cast, mask.to(p.dtype) (bool)": lambda: mask.to(p.dtype),
        "cast, mask.view(uint8).to(p.dtype)": lambda: mask.view(torch.uint8).to(p.dtype),
        "eager, p * mask.to(p.dtype) (bool)": lambda: p * mask.to(p.dtype),
        "eager, p * mask.view(uint8).to(p.dtype)": lambda: p * mask.view(torch.uint8).to(p.dtype),
        "eager, torch.where(mask, p, 0)": lambda: torch.where(mask, p, 0.0),
        "compiled, mask passed as bool": lambda: product(p, mask),
        "compiled, mask passed as uint8": lambda: product(p, as_uint8),
    }
    for fn in variants.values():  # compile and warm up
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(_per_call(fn, 20))
    return {name: statistics.median(t) for name, t in times.items()}


def table(numel: int, result: dict[str, float]) -> str:
    names = list(result)
    base = {"cast": result[names[1]], "eager": result[names[3]], "compiled": result[names[6]]}
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    load = f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    command = f"`python benchmarks/mask_reads.py --numel {numel}`"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"# Mask reads ({numel:,} float32 entries, 1 thread)",
        "",
        f"{stamp}, commit {commit or '?'}, torch {torch.__version__}, {load} ({command}).",
        "",
        "| variant | CPU ms per call | against the uint8 read of its kind |",
        "|---|---:|---:|",
    ]
    for name, t in result.items():
        lines.append(f"| {name} | {t * 1e3:.3f} | {t / base[name.split(',')[0]]:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    text = table(args.numel, measure(args.numel))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
