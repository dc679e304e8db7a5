"""Where the test suite's time goes: a pytest plugin that records each test's start and end (wall
clock and the process's CPU time) in every worker, and a summary by file.

Record (from the repo root; one JSON-lines file per pytest-xdist worker in the folder)::

    FPRUNE_TIMELINE=/tmp/timeline python -m pytest -q -n auto -p benchmarks.suite_timeline

Summarize::

    python -m benchmarks.suite_timeline /tmp/timeline [--top 25]

Or both, with the machine's busy CPU time from ``/proc/stat`` around the run, into a results
file (the tree to time can be another checkout: ``--tree``)::

    python -m benchmarks.suite_timeline --run [--tree DIR] --markdown benchmarks/results/suite_timeline.md

The summary gives, for each test file, the workers' wall time in its tests and their CPU time
(a test that runs subprocesses, such as the gloo ranks, spends its wall time waiting: its CPU is
theirs, not the worker's), and for each worker when it started its first test and ended its last.
With ``--run``, the machine's busy time while the suite ran is the difference of
``/proc/stat``'s counters (user, nice, system, irq, softirq, steal) before and after.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_OUT: list = []


def _write(event: dict[str, Any]) -> None:
    folder = os.environ.get("FPRUNE_TIMELINE")
    if not folder:
        return
    if not _OUT:
        Path(folder).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _OUT.append(open(Path(folder) / f"{worker}.jsonl", "w", buffering=1))  # noqa: SIM115
    _OUT[0].write(json.dumps(event) + "\n")


def pytest_sessionstart(session: Any) -> None:
    _write({"event": "start", "t": time.time()})


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"event": "test", "id": nodeid, "t": time.time(), "cpu": time.process_time()})


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _write({"event": "done", "id": nodeid, "t": time.time(), "cpu": time.process_time()})


def summary(folder: Path, top: int = 25) -> str:
    """The per-file and per-worker summary of a recorded folder, as text."""
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    workers = []
    origin = None
    for path in sorted(folder.glob("gw*.jsonl")) or sorted(folder.glob("*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        starts = {e["id"]: e for e in events if e["event"] == "test"}
        ends = [e for e in events if e["event"] == "done"]
        origin = min(origin or events[0]["t"], events[0]["t"])
        for end in ends:
            begin = starts[end["id"]]
            row = files[end["id"].split("::")[0]]
            row[0] += end["t"] - begin["t"]
            row[1] += end["cpu"] - begin["cpu"]
            row[2] += 1
        if ends:
            workers.append((path.stem, min(s["t"] for s in starts.values()), ends[-1]["t"], len(ends)))
    total = sum(r[0] for r in files.values())
    lines = [f"workers' wall time in tests: {total:.1f} s", "", "| file | wall s | worker CPU s | tests |"]
    lines.append("|---|---:|---:|---:|")
    for name, (wall, cpu, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name} | {wall:.1f} | {cpu:.1f} | {int(n)} |")
    lines += ["", "| worker | first test at s | last test ended at s | tests |", "|---|---:|---:|---:|"]
    for name, first, last, n in workers:
        lines.append(f"| {name} | {first - origin:.1f} | {last - origin:.1f} | {n} |")
    return "\n".join(lines)


def _busy_seconds() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(tree: Path, top: int) -> str:
    """Run ``python -m pytest -q -n auto`` in ``tree`` with the plugin; the results as markdown."""
    from benchmarks.record import commit as commit_of
    from benchmarks.record import cpu_model

    commit = commit_of(tree)
    folder = Path(tempfile.mkdtemp(prefix="fprune-timeline-"))
    # The plugin goes in under a name of its own, so that the timed tree's packages (another
    # checkout's benchmarks/, say) are the ones its tests import.
    plugin = folder / "plugin"
    plugin.mkdir()
    (plugin / "fprune_suite_timeline.py").write_text(Path(__file__).read_text())
    env = dict(os.environ, FPRUNE_TIMELINE=str(folder))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin), env.get("PYTHONPATH", "")) if p)
    load_before, busy_before, start = os.getloadavg()[0], _busy_seconds(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "fprune_suite_timeline"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    wall, busy, load_after = time.perf_counter() - start, _busy_seconds() - busy_before, os.getloadavg()[0]
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    now = datetime.datetime.now(datetime.UTC)
    cores = os.cpu_count() or 1
    about = (
        f"{now:%Y-%m-%d %H:%M} UTC, the tree of commit {commit}, `python -m benchmarks.suite_timeline "
        f"--run` (`python -m pytest -q -n auto` with the plugin), {cpu_model()}, {cores} cores, load "
        f"average {load_before:.2f} before and {load_after:.2f} after. Exit status {done.returncode}: {last}"
    )
    busy_line = (
        f"Wall time {wall:.1f} s; the machine's busy CPU time meanwhile {busy:.1f} s "
        f"({busy / wall / cores:.0%} of {cores} cores)."
    )
    head = ["# Where the test suite's time goes", "", about, "", busy_line, ""]
    return "\n".join(head) + summary(folder, top) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--run", action="store_true", help="run the suite with the plugin first")
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="the checkout to time (--run)")
    parser.add_argument("--markdown", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.run:
        text = run(args.tree, args.top)
    elif args.folder is not None:
        text = summary(args.folder, args.top)
    else:
        parser.error("give a recorded folder, or --run")
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
