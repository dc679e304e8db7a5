"""SparseGPT's solve beside the machine's matrix-multiply throughput: the fraction achieved.

Usage (from the repository root)::

    python -m benchmarks.solve_efficiency --json benchmarks/results/solve_efficiency.json \\
        --markdown benchmarks/results/solve_efficiency.md
    python -m benchmarks.solve_efficiency --baseline e497a36 --layers q_proj   # beside an older solve
    python -m benchmarks.solve_efficiency --quick                             # small shapes (seconds)

The layers are one Llama-2-13B block's (hidden 5120, intermediate 13824): ``q_proj`` (the
shape of ``k_proj``, ``v_proj`` and ``o_proj`` too: 5120 x 5120), ``gate_proj`` (of ``up_proj``
too: 13824 x 5120) and ``down_proj`` (5120 x 13824). Each is pruned to 50% by
``fprune.reconstruct.sparsegpt`` (blocksize 128, damp 0.01) in float32 from a random weight and
a random positive-definite hessian (``G G^T / 256 + I`` with ``G`` of 256 normal columns).

Its floating-point operations are counted from the algorithm's steps (a multiply-add is two):
the damping (``in``), the Cholesky factorization of the damped hessian (``in^3 / 3``), the
inverse of its triangular factor (``in^3 / 3``: the upper Cholesky factor of the inverse is the
reversed inverse of the reversed factor), the column sweep within each block (``2 out w`` for
each column with ``w`` later columns in its block, and ``out`` for its error) and the lazy batch
updates after each block (``2 out B (in - end)``); the mask choice (scores and selection) is
counted as the ``3 out in`` of its scores. The throughput is ``torch.mm``'s in float32 at the
same number of threads: square matrices (``--square``) and the solve's own product shapes (the
lazy update of each layer: ``(out, 128) @ (128, in - 128)``), the best of ``--repeats`` runs,
measured before and after each solve; the fraction is the solve's operations per second over
the best ``torch.mm`` rate (square or the layer's own shape, whichever is higher).

On a machine shared with other jobs the wall times vary with the load (recorded before and
after each measurement); the comparison with ``--baseline <commit>`` (that commit's
``fprune/reconstruct.py``, loaded from git) alternates the two solves on the same inputs in one
run and reports their ratio, and checks that they agree.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/solve_efficiency.py
    sys.path.insert(0, str(ROOT))

from benchmarks.posttrain_peer import _commit, _version  # noqa: E402  (after the path is set)
from benchmarks.record import cpu_model  # noqa: E402

HIDDEN, INTERMEDIATE, BLOCKS_13B = 5120, 13824, 40
# name: (out, in, how many of the block's seven layers have this shape)
LAYERS = {
    "q_proj": (HIDDEN, HIDDEN, 4),
    "gate_proj": (INTERMEDIATE, HIDDEN, 2),
    "down_proj": (HIDDEN, INTERMEDIATE, 1),
}
QUICK = {"q_proj": (640, 640, 4), "gate_proj": (1728, 640, 2), "down_proj": (640, 1728, 1)}
BLOCKSIZE = 128


def flops(rows: int, cols: int, blocksize: int = BLOCKSIZE) -> dict[str, float]:
    """The operations of ``sparsegpt(weight (rows, cols), hessian, amount)``, step by step."""
    sweep = lazy = 0.0
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        width = i2 - i1
        sweep += rows * width + 2.0 * rows * sum(width - 1 - i for i in range(width))
        lazy += 2.0 * rows * width * (cols - i2)
    return {
        "damping": float(cols),
        "cholesky": cols**3 / 3,
        "triangular_inverse": cols**3 / 3,
        "mask_scores": 3.0 * rows * cols,
        "sweep": sweep,
        "lazy_updates": lazy,
    }


# Llama-2 7B and 13B, Llama-2/3 70B: hidden, intermediate, blocks, attention heads, kv heads.
MODELS = {
    "7B": (4096, 11008, 32, 32, 32),
    "13B": (5120, 13824, 40, 40, 40),
    "70B": (8192, 28672, 80, 64, 8),
}
GPU_FLOPS = 50e12  # an assumed float32 rate for one H100-class GPU (no TF32): an estimate
GPU_TOKENS = (128, 2048)  # calibration of the SparseGPT paper: 128 sequences of 2048 tokens


def model_flops(name: str, tokens: int = GPU_TOKENS[0] * GPU_TOKENS[1]) -> dict[str, float]:
    """Operations of one-shot SparseGPT over a whole decoder of ``MODELS[name]``'s shape: the
    solves (:func:`flops` for each of a block's seven layers), the hessian sums (``2 tokens
    in^2`` for each of a block's four distinct inputs: q/k/v's, o's, gate/up's, down's) and two
    passes of the layers' products (``2 tokens out in`` each: the statistics and the pruned
    block's forward); attention scores and everything else left out."""
    h, inter, blocks, heads, kv = MODELS[name]
    kv_out = h // heads * kv
    layers = [(h, h), (kv_out, h), (kv_out, h), (h, h), (inter, h), (inter, h), (h, inter)]
    solve = sum(sum(flops(rows, cols).values()) for rows, cols in layers)
    hessians = 2.0 * tokens * (3 * h * h + inter * inter)
    forwards = 2 * 2.0 * tokens * sum(rows * cols for rows, cols in layers)
    return {
        "solve": blocks * solve,
        "hessians": blocks * hessians,
        "forwards": blocks * forwards,
        "tokens": float(tokens),
        "gpu_flops": GPU_FLOPS,
    }


def gpu_estimate_table() -> str:
    """The markdown table of :func:`model_flops` for 7B, 13B and 70B at ``GPU_FLOPS``."""
    lines = [
        (
            "| model | solves (TFLOP) | hessian sums (TFLOP) | two forwards (TFLOP) | "
            "at 50 TFLOP/s: solves (s) | all (min) |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for name in MODELS:
        f = model_flops(name)
        total = f["solve"] + f["hessians"] + f["forwards"]
        lines.append(
            f"| {name} | {f['solve'] / 1e12:,.0f} | {f['hessians'] / 1e12:,.0f} | "
            f"{f['forwards'] / 1e12:,.0f} | {f['solve'] / GPU_FLOPS:.0f} | {total / GPU_FLOPS / 60:.0f} |"
        )
    return "\n".join(lines)


def _load(repo_path: str, commit: str | None) -> Any:
    """``fprune.reconstruct`` as it is, or as it was at ``commit`` (loaded under another name)."""
    if commit is None:
        import fprune.reconstruct

        return fprune.reconstruct
    text = subprocess.run(
        ["git", "show", f"{commit}:{repo_path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="solve_efficiency_"))
    path = folder / f"reconstruct_{commit[:12]}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"reconstruct_{commit[:12]}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def matmul_rate(shapes: list[tuple[int, int, int]], repeats: int) -> tuple[dict, dict]:
    """Best ``torch.mm`` rates (operations per second of wall time, and per second of the
    process's CPU time) for each ``(m, k, n)`` of ``shapes``."""
    import torch

    wall, cpu = {}, {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)  # warm
        best = best_cpu = float("inf")
        for _ in range(repeats):
            started, cpu_started = time.perf_counter(), time.process_time()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - started)
            best_cpu = min(best_cpu, time.process_time() - cpu_started)
        wall[f"{m}x{k}x{n}"] = 2.0 * m * k * n / best
        cpu[f"{m}x{k}x{n}"] = 2.0 * m * k * n / max(best_cpu, 1e-9)
    return wall, cpu


def problem(rows: int, cols: int, seed: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=g)
    G = torch.randn(cols, 256, generator=g)
    hessian = G @ G.T / 256
    hessian.diagonal().add_(1.0)
    return weight, hessian


def time_solve(module: Any, weight: Any, hessian: Any) -> tuple[float, float, Any]:
    started, cpu = time.perf_counter(), time.process_time()
    new, keep = module.sparsegpt(weight, hessian, 0.5, blocksize=BLOCKSIZE)
    return time.perf_counter() - started, time.process_time() - cpu, (new, keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default=",".join(LAYERS), help="of q_proj,gate_proj,down_proj")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="torch.mm runs per shape (the best)")
    parser.add_argument("--square", type=int, default=4096)
    parser.add_argument("--baseline", help="a commit whose fprune/reconstruct.py to time beside")
    parser.add_argument("--quick", action="store_true", help="shapes a tenth of 13B's")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    shapes = QUICK if args.quick else LAYERS
    current = _load("fprune/reconstruct.py", None)
    baseline = _load("fprune/reconstruct.py", args.baseline) if args.baseline else None
    runs = []
    for name in args.layers.split(","):
        rows, cols, count = shapes[name]
        weight, hessian = problem(rows, cols, seed=len(runs))
        square = min(args.square, max(rows, cols))
        mm_shapes = [(square, square, square), (rows, BLOCKSIZE, cols - BLOCKSIZE)]
        load = [os.getloadavg()[0]]
        before, before_cpu = matmul_rate(mm_shapes, args.repeats)
        wall, cpu, (new, keep) = time_solve(current, weight, hessian)
        load.append(os.getloadavg()[0])
        after, after_cpu = matmul_rate(mm_shapes, args.repeats)
        load.append(os.getloadavg()[0])
        rate = {k: max(before[k], after[k]) for k in before}
        rate_cpu = {k: max(before_cpu[k], after_cpu[k]) for k in before}
        ops = flops(rows, cols)
        total = sum(ops.values())
        run: dict[str, Any] = {
            "layer": name,
            "shape": [rows, cols],
            "layers_of_this_shape": count,
            "flops": ops,
            "flops_total": total,
            "wall_s": wall,
            "cpu_s": cpu,
            "solve_rate": total / wall,
            "mm_rate": rate,
            "mm_rate_before": before,
            "mm_rate_after": after,
            "fraction": total / wall / max(rate.values()),
            "mm_rate_cpu": rate_cpu,
            "solve_rate_cpu": total / cpu,
            "fraction_cpu": total / cpu / max(rate_cpu.values()),
            "load": load,
            "sparsity": float((~keep).float().mean()),
        }
        print(
            f"{name} {rows}x{cols}: {wall:.1f} s, {total / wall / 1e9:.1f} GFLOP/s, mm "
            f"{max(rate.values()) / 1e9:.1f} GFLOP/s: {run['fraction']:.2f}; by CPU time "
            f"{run['fraction_cpu']:.2f}; load {load}",
            file=sys.stderr,
            flush=True,
        )
        if baseline is not None:
            bwall, bcpu, (bnew, bkeep) = time_solve(baseline, weight, hessian)
            wall2, cpu2, _ = time_solve(current, weight, hessian)  # after, so each has a neighbour
            load.append(os.getloadavg()[0])
            differ = keep != bkeep

            def error(v: Any, w: Any = weight, h: Any = hessian) -> float:
                d = (v - w).double()  # the layer's reconstruction error, (W' - W) H (W' - W)^T
                return float(((d @ h.double()) * d).sum())

            rows_same = ~differ.any(1)
            run["baseline"] = {
                "mask_entries_differing": int(differ.sum()),
                "rows_with_a_differing_mask": int((~rows_same).sum()),
                "max_abs_difference_rows_same_mask": float((new - bnew)[rows_same].abs().max())
                if bool(rows_same.any())
                else None,
                "error": error(new),
                "error_baseline": error(bnew),
                "commit": args.baseline,
                "wall_s": bwall,
                "cpu_s": bcpu,
                "current_again_wall_s": wall2,
                "current_again_cpu_s": cpu2,
                "ratio_wall": bwall / ((wall + wall2) / 2),
                "ratio_cpu": bcpu / ((cpu + cpu2) / 2),
                "masks_equal": bool(torch.equal(keep, bkeep)),
                "max_abs_difference": float((new - bnew).abs().max()),
                "max_abs_weight": float(bnew.abs().max()),
            }
            print(f"  baseline {args.baseline}: {bwall:.1f} s, again {wall2:.1f} s", file=sys.stderr)
        runs.append(run)
    block = {}
    if not args.quick and {r["layer"] for r in runs} == set(LAYERS):
        block_flops = sum(r["flops_total"] * r["layers_of_this_shape"] for r in runs)
        block_wall = sum(r["wall_s"] * r["layers_of_this_shape"] for r in runs)
        block_cpu = sum(r["cpu_s"] * r["layers_of_this_shape"] for r in runs)
        block = {
            "flops": block_flops,
            "wall_s": block_wall,
            "cpu_s": block_cpu,
            "fraction": block_flops / block_wall / max(max(r["mm_rate"].values()) for r in runs),
            "fraction_cpu": block_flops / block_cpu / max(max(r["mm_rate_cpu"].values()) for r in runs),
            "model_flops": block_flops * BLOCKS_13B,
        }
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(["python", "-m", "benchmarks.solve_efficiency", *(argv or sys.argv[1:])]),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "versions": {"torch": _version("torch")},
        "blocksize": BLOCKSIZE,
        "runs": runs,
        "block_13b": block,
    }
    text = markdown(record)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


def markdown(record: dict) -> str:
    lines = [
        "### SparseGPT's solve beside `torch.mm`: float32, one Llama-2-13B block's layers",
        "",
        (
            f"{record['date']}, commit {record['commit']}, `{record['command']}`, {record['cpu']} "
            f"({record['cpus']} CPUs), {record['threads']} threads, python {record['python']}, torch "
            f"{record['versions']['torch']}. Operations counted from the algorithm's steps "
            f"(Cholesky in^3/3, triangular inverse in^3/3, sweep and lazy updates about out in^2); "
            f"`torch.mm` rate: the best of its runs before and after the solve, square or the "
            f"lazy update's shape. Load: 1-minute average before / after the solve / after the "
            f"products. By CPU time: the same operations over the process's CPU seconds, beside "
            f"`torch.mm`'s best operations per CPU second (on a shared machine the wall-time rates "
            f"measure the share of the cores the process got as much as the code)."
        ),
        "",
        (
            "| layer | shape | GFLOP | solve (s) | solve GFLOP/s | torch.mm GFLOP/s | fraction | "
            "CPU (s) | by CPU time: solve / torch.mm GFLOP/s, fraction | load |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["runs"]:
        lines.append(
            f"| {r['layer']} | {r['shape'][0]} x {r['shape'][1]} | {r['flops_total'] / 1e9:.0f} | "
            f"{r['wall_s']:.1f} | {r['solve_rate'] / 1e9:.1f} | {max(r['mm_rate'].values()) / 1e9:.1f} | "
            f"{r['fraction']:.2f} | {r['cpu_s']:.1f} | {r['solve_rate_cpu'] / 1e9:.1f} / "
            f"{max(r['mm_rate_cpu'].values()) / 1e9:.1f}, {r['fraction_cpu']:.2f} | "
            f"{' / '.join(f'{v:.1f}' for v in r['load'][:3])} |"
        )
    block = record.get("block_13b")
    if block:
        lines += [
            "",
            (
                f"One 13B block (4 x q_proj's shape, 2 x gate_proj's, 1 x down_proj's): "
                f"{block['flops'] / 1e12:.2f} TFLOP in {block['wall_s']:.0f} s, "
                f"{block['fraction']:.2f} of the best `torch.mm` rate ({block['cpu_s']:.0f} CPU s, "
                f"{block['fraction_cpu']:.2f} by CPU time); the 40 blocks: "
                f"{block['model_flops'] / 1e12:.0f} TFLOP."
            ),
        ]
    compared = [r for r in record["runs"] if "baseline" in r]
    if compared:
        lines += [
            "",
            (
                "| layer | baseline commit | baseline (s) | this commit (s), twice | ratio | CPU ratio | "
                "mask entries differing (rows) | max difference, rows with equal masks | "
                "reconstruction error, this / baseline |"
            ),
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in compared:
            b = r["baseline"]
            lines.append(
                f"| {r['layer']} | {b['commit']} | {b['wall_s']:.1f} | {r['wall_s']:.1f}, "
                f"{b['current_again_wall_s']:.1f} | {b['ratio_wall']:.2f} | {b['ratio_cpu']:.2f} | "
                f"{b['mask_entries_differing']} of {r['shape'][0] * r['shape'][1]} "
                f"({b['rows_with_a_differing_mask']} of {r['shape'][0]}) | "
                f"{b['max_abs_difference_rows_same_mask']:.1e} (of {b['max_abs_weight']:.2f}) | "
                f"{b['error'] / b['error_baseline']:.7f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
