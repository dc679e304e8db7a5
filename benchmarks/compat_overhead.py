"""compat's own cost per pruned tensor, side by side with torch's, in one process.

Usage (from the repository root; about a minute on 2 cores)::

    python benchmarks/compat_overhead.py [--leaves 5000] [--size 1000] [--threads 2]
    python benchmarks/compat_overhead.py --bookkeeping-only [--no-gc]   # a few seconds

Many small tensors (``Linear(size, 1)`` weights) are pruned by ``global_unstructured`` with
``L1Unstructured``, amount 0.5, with torch.nn.utils.prune, with fprune.compat and with the core
call compat wraps (``fprune.global_unstructured``). The bookkeeping (hooks, ``_orig``, ``_mask``;
for compat also rollback and copy support) is timed on its own too: compat's with the core's
selection replaced by its precomputed result, torch's with its ``topk`` skipped (its container
returns the mask of ones), and the ``CustomFromMask.apply`` loop of each library. Best of 3,
interleaved; wall-clock.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import torch
import torch.nn.utils.prune as torch_prune

import fprune
import fprune.compat as compat_prune
from fprune.compat import functions as compat_functions


def _modules(leaves: int, size: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [torch.nn.Linear(size, 1, bias=False) for _ in range(leaves)]


def _timed(setup: Callable[[], Callable[[], object]], no_gc: bool) -> float:
    run = setup()
    gc.collect()
    if no_gc:
        gc.disable()
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=5000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bookkeeping-only", action="store_true", help="skip the selections")
    parser.add_argument("--no-gc", action="store_true", help="Python's garbage collector off while timed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, size = args.leaves, args.size

    def global_call(lib):
        def setup():
            pairs = [(m, "weight") for m in _modules(n, size)]
            return lambda: lib.global_unstructured(pairs, pruning_method=lib.L1Unstructured, amount=0.5)

        return setup

    def core_call():
        weights = {i: m.weight for i, m in enumerate(_modules(n, size))}
        return lambda: fprune.global_unstructured(weights, 0.5)

    def compat_bookkeeping():
        # compat's global_unstructured with the core's answer ready: what compat adds.
        modules = _modules(n, size)
        keeps = fprune.global_unstructured({i: m.weight for i, m in enumerate(modules)}, 0.5)
        pairs = [(m, "weight") for m in modules]

        def run():
            original = compat_functions.fprune.global_unstructured
            compat_functions.fprune.global_unstructured = lambda *a, **k: keeps
            try:
                compat_prune.global_unstructured(
                    pairs, pruning_method=compat_prune.L1Unstructured, amount=0.5
                )
            finally:
                compat_functions.fprune.global_unstructured = original

        return run

    def torch_bookkeeping():
        # torch's global_unstructured with its selection (topk in the container) skipped.
        pairs = [(m, "weight") for m in _modules(n, size)]

        def run():
            original = torch_prune.PruningContainer.compute_mask
            torch_prune.PruningContainer.compute_mask = lambda self, t, default_mask: default_mask
            try:
                torch_prune.global_unstructured(pairs, pruning_method=torch_prune.L1Unstructured, amount=0.5)
            finally:
                torch_prune.PruningContainer.compute_mask = original

        return run

    def apply_loop(lib):
        def setup():
            modules = _modules(n, size)
            masks = [torch.rand(1, size) > 0.5 for _ in modules]

            def run():
                for module, mask in zip(modules, masks, strict=True):
                    lib.CustomFromMask.apply(module, "weight", mask=mask)

            return run

        return setup

    cases: dict[str, Callable[[], Callable[[], object]]] = {
        "torch global_unstructured": global_call(torch_prune),
        "compat global_unstructured": global_call(compat_prune),
        "core global_unstructured": core_call,
        "compat bookkeeping (core answer precomputed)": compat_bookkeeping,
        "torch bookkeeping (its topk skipped)": torch_bookkeeping,
        "torch CustomFromMask.apply loop": apply_loop(torch_prune),
        "compat CustomFromMask.apply loop": apply_loop(compat_prune),
    }
    if args.bookkeeping_only:
        cases = {name: setup for name, setup in cases.items() if "global_unstructured" not in name}
    best = {name: float("inf") for name in cases}
    for _ in range(args.repeat):
        for name, setup in cases.items():
            best[name] = min(best[name], _timed(setup, args.no_gc))
    gc_state = "garbage collector off" if args.no_gc else "garbage collector on"
    print(
        f"{n} tensors of {size} weights, {torch.get_num_threads()} threads, best of {args.repeat}, {gc_state}"
    )
    print("| call | seconds | us per tensor |")
    print("|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.3f} | {seconds / n * 1e6:.1f} |")
    ours = best["compat bookkeeping (core answer precomputed)"]
    print(
        f"compat bookkeeping / torch's: {ours / best['torch bookkeeping (its topk skipped)']:.2f}x; "
        f"/ torch's CustomFromMask.apply loop: {ours / best['torch CustomFromMask.apply loop']:.2f}x"
    )
    if not args.bookkeeping_only:
        ratio = best["compat global_unstructured"] / best["torch global_unstructured"]
        print(f"compat / torch global_unstructured: {ratio:.2f}x")


if __name__ == "__main__":
    main()
