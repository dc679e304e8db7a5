"""Benchmark ``sharded``: global pruning of a sharded model on 1, 2 and 4 gloo processes vs one process.

Usage (from the repository root; it takes a few minutes, best with the cores to itself)::

    python -m benchmarks.sharded                                             # 100M weights
    python -m benchmarks.sharded --size 1M --ranks 1 2 --repeats 1          # a quick look

The weights are the Linear weights of :func:`benchmarks.models.transformer_like` (100M: 84
matrices, 99.1M float32 weights). With ``P`` processes each rank creates only its own rows of
every matrix (``Shard(0)``, as FSDP2 shards them) and calls ``fprune.global_unstructured`` on
the DTensors; the time is the slowest rank's, the median of ``--repeats`` runs after a
warm-up, and the bytes are those the call handed to collectives on one rank
(``fprune.distributed.last_communication``). The baseline is the plain single-process call on
the full tensors, in the 1-process run. ``l1_unstructured`` (one ranking per matrix, all
batched into the same collectives) is measured too. Every process runs one intra-op thread.
Results go to ``benchmarks/results/sharded.md`` and ``.json`` with ``--write``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from benchmarks.models import TRANSFORMER_SIZES  # noqa: E402

AMOUNTS = (0.5, 0.9)


def shapes(size: str):
    d, blocks = TRANSFORMER_SIZES[size]
    per_block = [(d, d)] * 4 + [(4 * d, d), (d, 4 * d)]
    return [shape for _ in range(blocks) for shape in per_block]


def _worker(rank: int, world: int, port: int, size: str, repeats: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import fprune

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    mesh = init_device_mesh("cpu", (world,))
    params, full = {}, {}
    for i, shape in enumerate(shapes(size)):
        rows = -(-shape[0] // world)  # torch.chunk's split, as DTensor shards
        start, stop = min(rank * rows, shape[0]), min((rank + 1) * rows, shape[0])
        g = torch.Generator().manual_seed(i)
        if world == 1:
            full[f"w{i:03d}"] = torch.randn(shape, generator=g)
        local = torch.randn(
            (stop - start, shape[1]), generator=torch.Generator().manual_seed(1000 * i + rank)
        )
        params[f"w{i:03d}"] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=(shape[1], 1)
        )
    results = []

    def timed(label, call):
        call()  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            call()
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank
            times.append(float(elapsed))
        stats = fprune.distributed.last_communication()
        results.append(
            {
                "label": label,
                "ranks": world,
                "seconds": statistics.median(times),
                "times": times,
                "bytes": stats.bytes if "DTensor" in label else 0,
                "collectives": stats.collectives if "DTensor" in label else 0,
                "passes": stats.passes if "DTensor" in label else 0,
            }
        )

    for amount in AMOUNTS:
        if world == 1:
            timed(f"global {amount} plain", lambda *, amount=amount: fprune.global_unstructured(full, amount))
        timed(f"global {amount} DTensor", lambda *, amount=amount: fprune.global_unstructured(params, amount))
    if world == 1:
        timed("l1 0.5 plain", lambda: fprune.l1_unstructured(full, 0.5))
    timed("l1 0.5 DTensor", lambda: fprune.l1_unstructured(params, 0.5))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


LEAF_COUNTS = (84, 1000, 10000, 100000)
LEAF_SHAPE = (16, 16)


def _leaves_worker(rank: int, world: int, port: int, counts, out: str) -> None:
    """Bytes handed to collectives per rank by every method, for many small Shard(0) leaves."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import fprune

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=1200),
    )
    mesh = init_device_mesh("cpu", (world,))
    rows = LEAF_SHAPE[0] // world
    calls = {
        "global_unstructured 0.5": lambda p: fprune.global_unstructured(p, 0.5),
        "l1_unstructured 0.5": lambda p: fprune.l1_unstructured(p, 0.5),
        "random_unstructured 0.5 (seed)": lambda p: fprune.random_unstructured(p, 0.5, generator=0),
        "ln_structured 0.5, n=2, dim=0": lambda p: fprune.ln_structured(p, 0.5, 2, 0),
        "ln_structured 0.5, n=2, dim=1": lambda p: fprune.ln_structured(p, 0.5, 2, 1),
        "random_structured 0.5, dim=0 (seed)": lambda p: fprune.random_structured(p, 0.5, 0, generator=0),
        "n_m 2:4 (dim -1)": lambda p: fprune.n_m(p, 2, 4),
        "rowwise_unstructured 0.5, dim=0": lambda p: fprune.rowwise_unstructured(p, 0.5, dim=0),
        "rowwise_unstructured 0.5, dim=1 (rows split)": lambda p: fprune.rowwise_unstructured(p, 0.5, dim=1),
    }
    results = []
    for count in counts:
        g = torch.Generator().manual_seed(rank)
        params = {
            f"w{i:06d}": DTensor.from_local(
                torch.randn((rows, LEAF_SHAPE[1]), generator=g),
                mesh,
                [Shard(0)],
                run_check=False,
                shape=torch.Size(LEAF_SHAPE),
                stride=(LEAF_SHAPE[1], 1),
            )
            for i in range(count)
        }
        for label, call in calls.items():
            dist.barrier()
            start = time.perf_counter()
            call(params)
            seconds = time.perf_counter() - start
            stats = fprune.distributed.last_communication()
            results.append(
                {
                    "label": label,
                    "leaves": count,
                    "ranks": world,
                    "bytes": stats.bytes,
                    "collectives": stats.collectives,
                    "seconds": seconds,
                }
            )
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def run_leaves(world: int, counts) -> list:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "out.json")
        mp.start_processes(
            _leaves_worker, args=(world, port, list(counts), out), nprocs=world, start_method="spawn"
        )
        with open(out) as f:
            return json.load(f)


def leaves_table(records: list) -> str:
    counts = sorted({r["leaves"] for r in records})
    labels = list(dict.fromkeys(r["label"] for r in records))
    by = {(r["label"], r["leaves"]): r for r in records}
    world = records[0]["ranks"] if records else 0
    lines = [
        (
            f"Bytes handed to collectives per call and per rank, by number of leaves: {LEAF_SHAPE[0]}x"
            f"{LEAF_SHAPE[1]} float32 leaves, Shard(0) over {world} gloo processes (1 intra-op thread "
            f"each); rank 0's time for the call in parentheses (one run, indicative)."
        ),
        "",
        "| call | " + " | ".join(f"{c:,} leaves" for c in counts) + " |",
        "|---|" + "---|" * len(counts),
    ]
    for label in labels:
        cells = []
        for c in counts:
            r = by.get((label, c))
            cells.append("" if r is None else f"{r['bytes']:,} ({r['seconds']:.2f} s)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(world: int, size: str, repeats: int) -> list:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "out.json")
        mp.start_processes(
            _worker, args=(world, port, size, repeats, out), nprocs=world, start_method="spawn"
        )
        with open(out) as f:
            return json.load(f)


def table(records: list, size: str) -> str:
    weights = sum(a * b for a, b in shapes(size))
    base = {r["label"].split(" plain")[0]: r["seconds"] for r in records if r["label"].endswith("plain")}
    lines = [
        (
            f"Sharded selection, {weights / 1e6:.1f}M float32 weights in {len(shapes(size))} matrices "
            f"(Shard(0)), gloo on localhost CPU, 1 intra-op thread per process."
        ),
        "",
        (
            "| call | processes | time (median) | vs one process, plain "
            "| bytes to collectives per rank | collectives | histogram passes |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        key = r["label"].rsplit(" ", 1)[0]
        baseline = base.get(key)
        ratio = "" if baseline is None else f"{r['seconds'] / baseline:.2f}x"
        lines.append(
            f"| {r['label']} | {r['ranks']} | {r['seconds'] * 1e3:.1f} ms | {ratio} | "
            f"{r['bytes']:,} | {r['collectives']} | {r['passes']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="global pruning of a sharded model, 1/2/4 processes")
    parser.add_argument("--size", default="100M", choices=sorted(TRANSFORMER_SIZES))
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--leaves",
        type=int,
        nargs="*",
        default=list(LEAF_COUNTS),
        help="leaf counts of the bytes-by-leaves table (2 processes; none: skip it)",
    )
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/sharded.md and .json")
    args = parser.parse_args(argv)
    records = []
    for world in args.ranks:
        records += run(world, args.size, args.repeats)
    text = table(records, args.size) if records else ""
    leaf_records = run_leaves(2, args.leaves) if args.leaves else []
    if leaf_records:
        text += "\n" + leaves_table(leaf_records)
    print(text)
    if args.write:
        folder = ROOT / "benchmarks" / "results"
        report = {
            "size": args.size,
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "torch": torch.__version__,
            },
            "threads_per_process": 1,
            "command": "python -m benchmarks.sharded " + " ".join(argv if argv is not None else sys.argv[1:]),
            "records": records,
            "leaf_records": leaf_records,
        }
        (folder / "sharded.json").write_text(json.dumps(report, indent=1))
        (folder / "sharded.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
