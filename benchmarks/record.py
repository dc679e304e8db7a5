"""Runs a command and writes its output, wall time and measurement conditions to a results file.

Usage (from the repository root)::

    python -m benchmarks.record benchmarks/results/NAME.md [--title TITLE] -- COMMAND ...

The file holds the command, the CPU model and CPU count (``lscpu``), the 1-minute load
average sampled every second while the command ran (its range), the date, the commit (with
``+changes`` when the work tree differs from it), the command's wall time and its output (stdout
and stderr) verbatim. The docs cite such files for figures that have no benchmark of their own.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path


def cpu() -> tuple[str, str]:
    """The CPU's model name (with ``AVX-512`` where its flags have it) and its CPU count, from ``lscpu``."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    model = fields.get("Model name", "unknown")
    if "avx512f" in fields.get("Flags", "").split():
        model += " with AVX-512"
    return model, fields.get("CPU(s)", str(os.cpu_count()))


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (as the benchmarks' JSON records it), else
    ``platform.processor()``, else ``"unknown"``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit(cwd: str | Path | None = None) -> str:
    """The checked-out commit (of the checkout at ``cwd``, else the current directory's), with
    ``+changes`` when tracked files differ from it."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=cwd, check=False).returncode != 0
    return head + ("+changes" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the results file to write (markdown)")
    parser.add_argument("--title", default=None, help="the file's heading (default: the command)")
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("a command to run is required after --")
    args = parser.parse_args(argv[: argv.index("--")])
    command = argv[argv.index("--") + 1 :]

    loads = [os.getloadavg()[0]]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    started = datetime.datetime.now(datetime.UTC)
    sampler.start()
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    loads.append(os.getloadavg()[0])

    model, cpus = cpu()
    shown = shlex.join(command)
    lines = [
        f"# {args.title or shown}",
        "",
        f"Command: `{shown}` (exit status {proc.returncode}, wall time {wall:.1f} s).",
        "",
        (
            f"CPU: {model}, {cpus} CPUs (lscpu); load average (1 min) while it ran "
            f"{min(loads):.2f}-{max(loads):.2f}; {started:%Y-%m-%d %H:%M} UTC; commit {commit()}; "
            f"Python {sys.version.split()[0]}."
        ),
        "",
        "Output:",
        "",
        "```",
        (proc.stdout + proc.stderr).rstrip(),
        "```",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}: wall {wall:.1f} s, exit status {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
