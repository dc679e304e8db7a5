"""One-shot pruning beside busy cores: how much 2 torch threads lose to 1 when the cores are shared.

Usage (from the repository root; a few minutes)::

    python -m benchmarks.contention --json benchmarks/results/contention.json \\
        --markdown benchmarks/results/contention.md
    python -m benchmarks.contention --busy 0 --policies default   # one condition
    python -m benchmarks.contention --serial-entries 0 ...         # every layer's solve threaded

The model is ``transformers.LlamaForCausalLM`` from a config of 4 blocks of hidden 512
(intermediate 1376, 8 heads, vocab 1024; random init, float32, ``eval()``), calibration 8
sequences of 128 random tokens in one batch. Each condition (busy cores beside it, and
``OMP_WAIT_POLICY`` unset or ``PASSIVE``, an environment variable OpenMP reads when it starts)
runs in a fresh process; in it, at 1 and at 2 torch threads (``torch.set_num_threads``), the
dense forward of the model on the calibration batch (the reference: ``--forwards`` times) and
``fprune.oneshot.prune(model, params, batches, 0.5, method=...)`` for SparseGPT, Wanda and
magnitude, each timed in wall and CPU time (the process's, all threads) after a warm-up
forward. A busy core is a shell loop (``while :; do :; done``) started before the process and
killed after it. The cores are shared with whatever else runs: the 1-minute load average is
recorded before each condition and each task.

Read per condition: the 2-thread time over the 1-thread time of each task (above 1: the second
thread costs more than it gives), and each pruning method's ratio over the forward's in the
same process (at most 1: fprune's loops lose no more to a shared machine than torch's own
dense forward does).
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
if __package__ in (None, ""):  # python benchmarks/contention.py
    sys.path.insert(0, str(ROOT))

from benchmarks.record import cpu_model  # noqa: E402  (after the path is set)

TASKS = ("forward", "sparsegpt", "wanda", "magnitude")
NAMES = {"forward": "dense forward", "sparsegpt": "SparseGPT", "wanda": "Wanda", "magnitude": "magnitude"}


def worker(threads: list[int], forwards: int, serial_entries: int | None) -> dict[str, Any]:
    """Build the model and the data, then each task at each thread count; in its own process."""
    imported = time.perf_counter()
    import torch
    import transformers

    import fprune
    from fprune import _threads

    import_s = time.perf_counter() - imported
    if serial_entries is not None:
        _threads.SERIAL_ENTRIES = serial_entries
    config = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=1024,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, config.vocab_size, (8, 128), generator=g)}]

    def forward() -> None:
        with torch.no_grad():
            for _ in range(forwards):
                model(**batches[0], use_cache=False)

    runs = []
    for n in threads:
        torch.set_num_threads(n)
        forward()  # warm-up: the thread pool started, the allocator's first blocks taken
        for task in TASKS:
            load = os.getloadavg()[0]
            wall, cpu = time.perf_counter(), time.process_time()
            if task == "forward":
                forward()
            else:
                fprune.oneshot.prune(model, params, batches, 0.5, method=task)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            runs.append({"threads": n, "task": task, "wall_s": wall, "cpu_s": cpu, "load_before": load})
            print(f"  {n} threads, {task}: {wall:.2f} s, CPU {cpu:.2f} s", file=sys.stderr, flush=True)
    return {
        "import_s": import_s,
        "runs": runs,
        "parameters": sum(p.numel() for p in params.values()),
        "serial_entries": _threads.SERIAL_ENTRIES,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["bash", "-c", "while :; do :; done"]) for _ in range(n)]


def _stop(loops: list[subprocess.Popen]) -> None:
    for loop in loops:
        loop.kill()
        loop.wait()


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "fprune"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def ratios(cell: dict) -> dict[str, float]:
    """Each task's 2-thread wall time over its 1-thread wall time in one condition."""
    wall = {(r["task"], r["threads"]): r["wall_s"] for r in cell["runs"]}
    return {task: wall[task, 2] / wall[task, 1] for task in TASKS if (task, 1) in wall and (task, 2) in wall}


def summary(record: dict) -> str:
    """The table of ratios, one row per condition (the docs quote it)."""
    lines = [
        "| busy cores | OMP_WAIT_POLICY | load before | dense forward | SparseGPT | Wanda | magnitude |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in record["cells"]:
        r = ratios(cell)
        forward = r["forward"]
        methods = " | ".join(
            f"{r[task]:.2f}x ({r[task] / forward:.2f})" for task in ("sparsegpt", "wanda", "magnitude")
        )
        lines.append(
            f"| {cell['busy']} | {cell['wait_policy']} | {cell['load_before']:.1f} | {forward:.2f}x | "
            f"{methods} |"
        )
    return "\n".join(lines)


def markdown(record: dict) -> str:
    lines = [
        "### One-shot pruning beside busy cores: 2 torch threads against 1",
        "",
        (
            f"{record['date']}, commit {record['commit']}, `{record['command']}`, {record['cpu']}, "
            f"{record['cores']} cores, python {record['python']}, torch {record['versions']['torch']}, "
            f"transformers {record['versions']['transformers']}. Llama, 4 blocks of hidden 512 "
            f"({record['parameters'] / 1e6:.1f}M parameters), calibration 8 x 128 tokens, sparsity 0.5; "
            f"the dense forward {record['forwards']} times; layers of at most "
            f"{record['serial_entries']} weight entries solved on one thread "
            f"(fprune._threads.SERIAL_ENTRIES). One fresh process per condition. Load: the 1-minute "
            f"load average before the condition (the busy loops and the measured process count in it)."
        ),
        "",
        (
            "2-thread wall time over 1-thread wall time; in parentheses, the method's ratio over the "
            "dense forward's in the same process (at most 1: no more sensitive than the forward):"
        ),
        "",
        summary(record),
        "",
        (
            "| busy cores | OMP_WAIT_POLICY | task | 1 thread: wall (CPU) s | 2 threads: wall (CPU) s | "
            "load before, 1 / 2 |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for cell in record["cells"]:
        runs = {(r["task"], r["threads"]): r for r in cell["runs"]}
        for task in TASKS:
            one, two = runs.get((task, 1)), runs.get((task, 2))
            if one is None or two is None:
                continue
            lines.append(
                f"| {cell['busy']} | {cell['wait_policy']} | {NAMES[task]} | {one['wall_s']:.2f} "
                f"({one['cpu_s']:.2f}) | {two['wall_s']:.2f} ({two['cpu_s']:.2f}) | "
                f"{one['load_before']:.1f} / {two['load_before']:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", default="0,1,2", help="busy cores beside the process, comma-separated")
    parser.add_argument(
        "--policies", default="default,PASSIVE", help="OMP_WAIT_POLICY values ('default': unset)"
    )
    parser.add_argument("--forwards", type=int, default=3, help="dense forwards in the reference task")
    parser.add_argument("--serial-entries", type=int, help="fprune._threads.SERIAL_ENTRIES in the process")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # the thread counts, comma-separated
    args = parser.parse_args(argv)
    if args.worker:
        threads = [int(n) for n in args.worker.split(",")]
        print(json.dumps(worker(threads, args.forwards, args.serial_entries)))
        return 0
    cells = []
    for b, busy in enumerate(int(n) for n in args.busy.split(",")):
        for p, policy in enumerate(args.policies.split(",")):
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
            if policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            env["PYTHONPATH"] = str(ROOT)
            # 1 then 2 threads, or 2 then 1, alternating, so that a drift of the load favours neither
            threads = "1,2" if (b + p) % 2 == 0 else "2,1"
            flags = ["--worker", threads, "--forwards", str(args.forwards)]
            if args.serial_entries is not None:
                flags += ["--serial-entries", str(args.serial_entries)]
            loops = _busy(busy)
            try:
                time.sleep(1.0 if busy else 0.0)  # the loops running before the load is read
                load = os.getloadavg()
                print(f"{busy} busy, OMP_WAIT_POLICY={policy}, load {load[0]:.1f}", file=sys.stderr)
                proc = subprocess.run(
                    [sys.executable, "-m", "benchmarks.contention", *flags],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    text=True,
                    check=False,
                    env=env,
                )
            finally:
                _stop(loops)
            if proc.returncode:
                return proc.returncode
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            cells.append({"busy": busy, "wait_policy": policy, "load_before": load[0], "loadavg": load})
            cells[-1].update(result)
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(
            ["python", "-m", "benchmarks.contention", *(argv if argv is not None else sys.argv[1:])]
        ),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "versions": cells[0]["versions"],
        "parameters": cells[0]["parameters"],
        "serial_entries": cells[0]["serial_entries"],
        "forwards": args.forwards,
        "cells": cells,
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
