"""Benchmark section "many leaves": the cost per leaf, fprune and torch side by side in one run.

Usage (from the repository root)::

    python -m benchmarks.many_leaves --json benchmarks/results/many_leaves.json \\
        --markdown benchmarks/results/many_leaves.md
    python -m benchmarks --only many_leaves      # the same section from the runner
    python -m benchmarks.many_leaves --traced --threads 1   # the traced path: memory and time at 20M

Models (float32, in one process; every call is timed ``repeats`` times, the median reported):

* ``5000x1000``: 5,000 leaves of 10x100 (5M weights), and the same 5M weights as 50 leaves of
  1000x100: the difference of the two global times, divided by the difference of the leaf
  counts, is the fixed cost per leaf.
* ``20000x256``: 20,000 leaves of 16x16 (5.1M weights).
* ``gpt2-200``: GPT-2 from a tiny config (``n_embd=64``, 2 heads, vocabulary 512, 128 positions)
  with 200 layers: 2,403 leaves (every weight, bias and norm), 10.1M weights.

Calls (amount 0.5 everywhere): ``global_unstructured`` over all leaves against
``torch.nn.utils.prune.global_unstructured`` (``L1Unstructured``) and
``fprune.compat.global_unstructured`` on the same modules; ``l1_unstructured`` over all leaves
against a loop of torch's ``L1Unstructured.compute_mask``; ``ln_structured`` (L2, dim 0) over the
2-D leaves against a loop of torch's ``LnStructured.compute_mask``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/many_leaves.py
    sys.path.insert(0, str(ROOT))

import fprune  # noqa: E402
from benchmarks import run as runner  # noqa: E402
from benchmarks.worker import unprune  # noqa: E402

AMOUNT = 0.5


class Holder(torch.nn.Module):
    """One parameter per module, so that torch's module-based API sees one leaf per module."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(value)


def leaves_model(count: int, shape, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.ModuleList([Holder(torch.randn(shape, generator=g)) for _ in range(count)])


def gpt2_model(layers: int, seed: int = 0) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    config = GPT2Config(n_embd=64, n_layer=layers, n_head=2, vocab_size=512, n_positions=128)
    return GPT2Model(config)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "5000x1000": lambda: leaves_model(5000, (10, 100)),
    "50x100000": lambda: leaves_model(50, (1000, 100)),
    "20000x256": lambda: leaves_model(20000, (16, 16)),
    "gpt2-200": lambda: gpt2_model(200),
}
QUICK_MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "200x1000": lambda: leaves_model(200, (10, 100)),
    "2x100000": lambda: leaves_model(2, (1000, 100)),
    "gpt2-2": lambda: gpt2_model(2),
}


def compat_module():
    try:
        import fprune.compat as compat
    except ImportError:
        return None
    return compat


def timed(fn: Callable[[], Any], repeats: int, after: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Wall and CPU (process) times of ``repeats`` calls; ``median_s`` is the CPU time's median.

    CPU time, because this machine's 2 cores are shared: under load, wall times of the same
    call vary several-fold, while the CPU time of a 1-thread run stays put (run with
    ``--threads 1`` to compare like with like).
    """
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(repeats):
        gc.collect()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        cpus.append(time.process_time() - start_cpu)
        walls.append(time.perf_counter() - start)
        if after is not None:
            after(result)
        del result
    return {
        "wall_s": walls,
        "cpu_s": cpus,
        "median_s": statistics.median(cpus),
        "median_wall_s": statistics.median(walls),
    }


def measure(name: str, model: torch.nn.Module, repeats: int, torch_repeats: int) -> dict[str, Any]:
    """Every call on one model: fprune, torch and compat, side by side."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    pairs = []
    for module in model.modules():
        for pname, _ in list(module.named_parameters(recurse=False)):
            pairs.append((module, pname))
    matrices = {n: p for n, p in params.items() if p.dim() > 1}
    out: dict[str, Any] = {
        "leaves": len(params),
        "weights": sum(p.numel() for p in params.values()),
        "matrices": len(matrices),
        "calls": {},
    }

    def undo(_result: Any = None) -> None:
        for module, pname in pairs:
            unprune(module, pname)

    calls = out["calls"]
    fprune.global_unstructured(params, AMOUNT)  # warm up
    calls["global/fprune"] = timed(lambda: fprune.global_unstructured(params, AMOUNT), repeats)
    if name not in ("50x100000", "2x100000"):
        calls["global/torch"] = timed(
            lambda: torch_prune.global_unstructured(
                pairs, pruning_method=torch_prune.L1Unstructured, amount=AMOUNT
            ),
            torch_repeats,
            undo,
        )
        compat = compat_module()
        if compat is not None:
            calls["global/compat"] = timed(
                lambda: compat.global_unstructured(
                    pairs, pruning_method=compat.L1Unstructured, amount=AMOUNT
                ),
                torch_repeats,
                undo,
            )
        calls["local/fprune"] = timed(lambda: fprune.l1_unstructured(params, AMOUNT), repeats)
        l1 = torch_prune.L1Unstructured(AMOUNT)
        calls["local/torch"] = timed(
            lambda: [l1.compute_mask(p, torch.ones_like(p)) for p in params.values()], torch_repeats
        )
        only_matrices = lambda path, p: p.dim() > 1
        calls["structured/fprune"] = timed(
            lambda: fprune.ln_structured(params, AMOUNT, 2, 0, where=only_matrices), repeats
        )
        ln = torch_prune.LnStructured(AMOUNT, n=2, dim=0)
        calls["structured/torch"] = timed(
            lambda: [ln.compute_mask(p, torch.ones_like(p)) for p in matrices.values()], torch_repeats
        )
    return out


def run(quick: bool = False, threads: int | None = None) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    models = QUICK_MODELS if quick else MODELS
    repeats, torch_repeats = (3, 1) if quick else (3, 2)
    results = {}
    for name, build in models.items():
        with torch.no_grad():
            model = build()
        # The objects alive now (the model, the imported modules) go to the permanent generation:
        # the collection before each timed call then scans only what the calls made, not the
        # whole heap (a fifth of a second each with transformers imported).
        gc.collect()
        gc.freeze()
        try:
            results[name] = measure(name, model, repeats, torch_repeats)
        finally:
            gc.unfreeze()
        print(f"many_leaves: {name} done", file=sys.stderr, flush=True)
    return {
        "mode": "quick" if quick else "full",
        "threads": torch.get_num_threads(),
        "machine": runner.machine(),
        "models": results,
    }


def _t(calls, key) -> float | None:
    entry = calls.get(key)
    return entry["median_s"] if entry else None


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"### Many leaves ({report['mode']} run, {m['date_utc']} UTC)",
        "",
        (
            f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']} ({report['threads']} intra-op "
            f"threads); fprune at {m['git_commit']}. Medians of the process CPU time "
            f"(see `timed`); amount 0.5. torch's local and structured "
            f"columns are loops of `L1Unstructured` "
            f"/ `LnStructured(n=2, dim=0)`.compute_mask over the leaves."
        ),
        "",
        (
            "| model (leaves, weights) | call | fprune | torch | fprune.compat "
            "| torch / fprune | torch / compat "
            "| fprune per leaf |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    models = report["models"]
    for name, res in models.items():
        calls = res["calls"]
        if "global/torch" not in calls:
            continue
        label = f"{name} ({res['leaves']:,}, {res['weights'] / 1e6:.1f}M)"
        for case, what in (
            ("global", "global_unstructured"),
            ("local", "l1_unstructured"),
            ("structured", f"ln_structured ({res['matrices']:,} 2-D leaves)"),
        ):
            f, t, c = _t(calls, f"{case}/fprune"), _t(calls, f"{case}/torch"), _t(calls, f"{case}/compat")
            leaves = res["matrices"] if case == "structured" else res["leaves"]
            per_leaf = f"{f / leaves * 1e6:.1f} us" if f is not None else "-"
            lines.append(
                f"| {label} | {what} | {runner._fmt_s(f)} | {runner._fmt_s(t)} | "
                f"{runner._fmt_s(c) if c is not None else '-'} | {runner._ratio(t, f)} | "
                f"{runner._ratio(t, c) if c is not None else '-'} | {per_leaf} |"
            )
    lines.append("")
    pairs = [("5000x1000", "50x100000"), ("200x1000", "2x100000")]
    for many, few in pairs:
        if many in models and few in models:
            t_many = _t(models[many]["calls"], "global/fprune")
            t_few = _t(models[few]["calls"], "global/fprune")
            extra = models[many]["leaves"] - models[few]["leaves"]
            lines.append(
                f"Fixed cost per leaf of `global_unstructured`: the same "
                f"{models[many]['weights'] / 1e6:.0f}M "
                f"weights as {models[few]['leaves']} leaves take {runner._fmt_s(t_few)}, as "
                f"{models[many]['leaves']:,} leaves {runner._fmt_s(t_many)}: "
                f"{(t_many - t_few) / extra * 1e6:.1f} us per extra leaf."
            )
            lines.append("")
    return "\n".join(lines)


def traced_one(mode: str, weights: int = 20_000_000) -> dict[str, Any]:
    """The traced path (a tensor amount) on ``weights`` float32 weights in 2 leaves, in this process:
    extra peak RSS per weight and CPU time, with the radix select or (``mode="sort"``) the sort."""
    import resource

    from fprune.select import _engine

    if mode == "sort":
        _engine.TRACED_SORT = 1 << 62
    params = {"a": torch.randn(weights // 2), "b": torch.randn(weights - weights // 2)}
    fprune.global_unstructured({"x": torch.randn(1000)}, torch.tensor(0.5))  # warm up
    gc.collect()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.process_time()
    masks = fprune.global_unstructured(params, torch.tensor(0.5))
    cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    pruned = sum(int((~m).sum()) for m in masks.values())
    return {
        "mode": mode,
        "weights": weights,
        "extra_bytes_per_weight": (peak - base) / weights,
        "cpu_s": cpu,
        "pruned": pruned,
    }


def traced_report(threads: int | None) -> str:
    """Both traced algorithms, each in a fresh process (so that the RSS high-water is its own)."""
    import subprocess

    rows = []
    for mode in ("radix", "sort"):
        command = [sys.executable, "-m", "benchmarks.many_leaves", "--traced-one", mode]
        command += ["--threads", str(threads)] if threads else []
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    lines = ["| traced path, 20M float32 weights | extra B/weight | CPU time |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['extra_bytes_per_weight']:.1f} | {runner._fmt_s(r['cpu_s'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--traced", action="store_true", help="only the traced path's memory and time at 20M")
    parser.add_argument("--traced-one", choices=["radix", "sort"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.traced_one:
        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(traced_one(args.traced_one)))
        return 0
    if args.traced:
        print(traced_report(args.threads))
        return 0
    report = run(args.quick, args.threads)
    text = markdown(report)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
