"""Compare fprune at two or more git revisions, side by side in one run.

Usage (from the repository root)::

    python -m benchmarks.compare f834e55 HEAD --size 100M --rounds 3
    python -m benchmarks.compare main . --case local --size 10M     # "." = this working tree

Each revision is checked out into a temporary ``git worktree`` (``.`` uses the working tree as
it is, uncommitted changes included). The revisions then take turns, round after round: every
round runs one fresh process per revision, which builds the same transformer-like model (from
*this* checkout's ``benchmarks/models.py``, so the inputs never differ), imports that revision's
``fprune``, warms up, and times ``--repeats`` calls. Reported per revision:

* the median over rounds of the per-round median **process CPU time** (``time.process_time``),
  and its ratio to the first revision. CPU time with one intra-op thread (the default) is what
  stays comparable on a shared machine: with two threads and a busy second core, OpenMP worker
  threads spin and wall times of *any* revision grow by 10-20x (measured on this project's 2-core
  machine, 2026-11-23), which is noise, not a regression;
* the torch operators one call runs, with their call counts (torch's profiler, once per
  revision): if two revisions run the same operators the same number of times, a difference in
  time is the machine, not the code. Operators whose counts differ are listed.

Also reported: the count pruned and a digest of the masks (sha256 over the mask leaves, in
sorted name order), so that a table shows whether the revisions give the same masks.

Prints a markdown table; ``--json`` writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = ("global", "local", "structured")


# ----------------------------------------------------------------------------- the child process


def _load_models():
    """This checkout's ``benchmarks/models.py``, loaded by path (the revision may have another)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_compare_models", ROOT / "benchmarks" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(case: str, size: str, amount: float, repeats: int, threads: int, profile: bool) -> dict[str, Any]:
    """Time ``repeats`` calls of one case with the ``fprune`` importable here; one JSON-able dict."""
    import gc
    import hashlib
    import time

    import torch

    torch.set_num_threads(threads)
    import fprune

    models = _load_models()

    def weights_of(model):
        return {name + ".weight": m.weight for name, m in models.weight_modules(model)}

    def call(weights):
        if case == "global":
            return fprune.global_unstructured(weights, amount)
        if case == "local":
            return fprune.l1_unstructured(weights, amount)
        return fprune.ln_structured(weights, amount, n=2, dim=0)

    call(weights_of(models.transformer_like("tiny")))
    weights = weights_of(models.transformer_like(size))
    masks = call(weights)
    pruned = sum(m.numel() - int(torch.count_nonzero(m)) for m in masks.values())
    digest = hashlib.sha256()
    for name in sorted(masks):  # leaf by leaf: no concatenation of the masks
        digest.update(name.encode())
        digest.update(masks[name].contiguous().view(torch.uint8).numpy().tobytes())
    del masks
    gc.collect()
    gc.freeze()  # what lives now is left out of the collections between repeats
    cpu, wall = [], []
    for _ in range(repeats):
        gc.collect()
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        result = call(weights)
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start_wall)
        del result
    out: dict[str, Any] = {
        "fprune_file": fprune.__file__,
        "pruned": pruned,
        "masks": digest.hexdigest()[:16],
        "cpu_s": statistics.median(cpu),
        "wall_s": statistics.median(wall),
        "threads": torch.get_num_threads(),
    }
    if profile:
        # torch.autograd.profiler's CPU profile: the same operator events as torch.profiler's,
        # whose start also imports torch._inductor (a second of the child's time).
        from torch.autograd.profiler import profile as torch_profile

        with torch_profile() as prof:
            call(weights)
        out["ops"] = {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}
    return out


# ----------------------------------------------------------------------------- the parent


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _checkout(rev: str, scratch: Path) -> Path:
    if rev == ".":
        return ROOT
    sha = _git("rev-parse", "--verify", rev + "^{commit}")
    path = scratch / sha[:12]
    if not path.exists():
        _git("worktree", "add", "--detach", "--quiet", str(path), sha)
    return path


def _run_child(tree: Path, args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--case",
        args.case,
        "--size",
        args.size,
        "--amount",
        str(args.amount),
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
    ]
    if profile:
        cmd.append("--profile")
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"revision at {tree} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = (tree / "fprune" / "__init__.py").resolve()
    if Path(result["fprune_file"]).resolve() != expected:
        raise RuntimeError(f"the child imported {result['fprune_file']}, not {expected}")
    return result


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run the revisions in turn, ``args.rounds`` times; one entry per revision given (a revision
    given twice is measured twice: a check of the noise)."""
    scratch = Path(tempfile.mkdtemp(prefix="fprune-compare-"))
    trees = {rev: _checkout(rev, scratch) for rev in args.revs}
    labels = {
        rev: (_git("rev-parse", "--short", "HEAD", cwd=tree) + ("+wt" if rev == "." else ""))
        for rev, tree in trees.items()
    }
    runs: list[list[dict[str, Any]]] = [[] for _ in args.revs]
    try:
        for r in range(args.rounds):
            for i, rev in enumerate(args.revs):
                runs[i].append(_run_child(trees[rev], args, profile=(r == 0)))
                print(
                    f"round {r + 1}/{args.rounds} {rev} ({labels[rev]})"
                    f": cpu {runs[i][-1]['cpu_s'] * 1e3:.1f} ms",
                    file=sys.stderr,
                )
    finally:
        if not args.keep:
            for tree in set(trees.values()):
                if tree != ROOT:
                    _git("worktree", "remove", "--force", str(tree))
    entries = []
    for rev, rev_runs in zip(args.revs, runs, strict=True):
        cpu = [run["cpu_s"] for run in rev_runs]
        entries.append(
            {
                "rev": rev,
                "commit": labels[rev],
                "cpu_s": statistics.median(cpu),
                "cpu_s_range": [min(cpu), max(cpu)],
                "wall_s": statistics.median(run["wall_s"] for run in rev_runs),
                "pruned": rev_runs[0]["pruned"],
                "masks": rev_runs[0].get("masks", "?"),
                "ops": rev_runs[0]["ops"],
                "threads": rev_runs[0]["threads"],
            }
        )
    return {
        "case": args.case,
        "size": args.size,
        "amount": args.amount,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "revisions": entries,
    }


def markdown(report: dict[str, Any]) -> str:
    base = report["revisions"][0]
    lines = [
        (
            f"`{report['case']}` on transformer-like {report['size']}, amount {report['amount']}, "
            f"{base['threads']} thread(s); median over {report['rounds']} "
            f"rounds of the median of {report['repeats']} calls."
        ),
        "",
        (
            "| revision | CPU time | range over rounds | vs first "
            "| wall | pruned | masks (sha256) | operators differing from first |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["revisions"]:
        diff = sorted(
            f"{op} {base['ops'].get(op, 0)}->{entry['ops'].get(op, 0)}"
            for op in set(base["ops"]) | set(entry["ops"])
            if base["ops"].get(op, 0) != entry["ops"].get(op, 0)
        )
        low, high = entry["cpu_s_range"]
        lines.append(
            f"| {entry['rev']} ({entry['commit']}) | {entry['cpu_s'] * 1e3:.1f} ms | "
            f"{low * 1e3:.1f}-{high * 1e3:.1f} ms | "
            f"{entry['cpu_s'] / base['cpu_s']:.2f}x | {entry['wall_s'] * 1e3:.1f} ms | {entry['pruned']:,} | "
            f"{entry['masks']}{'' if entry['masks'] == base['masks'] else ' (differ)'} | "
            f"{', '.join(diff) if diff else 'none'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "revs",
        nargs="*",
        help="git revisions to compare ('.' = this working tree); the first is the reference",
    )
    parser.add_argument("--case", choices=CASES, default="global")
    parser.add_argument(
        "--size",
        default="10M",
        help="a transformer-like size from benchmarks/models.py (tiny, 1M, 10M, 100M, ...)",
    )
    parser.add_argument("--amount", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--keep", action="store_true", help="keep the temporary worktrees")
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(
            json.dumps(measure(args.case, args.size, args.amount, args.repeats, args.threads, args.profile))
        )
        return 0
    if len(args.revs) < 2:
        parser.error(f"revs: give at least two revisions to compare, got {args.revs!r}")
    report = compare(args)
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
