"""Run a function on N gloo processes on localhost CPU, with a hard timeout (nothing can hang CI).

``launch(world, target, *args)`` spawns ``world`` processes, each running ``target(rank, world,
*args)`` after ``init_process_group("gloo")`` on a free port, and returns what each rank's
``target`` returned (pickled through a file), or raises if a rank failed or the timeout hit.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, folder, target, args):
    import torch.distributed as dist

    torch.set_num_threads(1)
    result = None
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        result = ("ok", target(rank, world, *args))
    except BaseException:  # report everything to the parent
        result = ("error", traceback.format_exc())
    with open(os.path.join(folder, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    # Exit at once: tearing gloo down while another rank still talks can abort the process
    # ("terminate called without an active exception"), which would fail a passing test.
    os._exit(0)


def launch(world: int, target, *args, timeout: float = 240.0) -> list:
    """``target(rank, world, *args)`` on ``world`` processes; the per-rank results, rank order."""
    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(
            _entry,
            args=(world, free_port(), folder, target, args),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} processes did not finish within {timeout} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        results = []
        for rank in range(world):
            with open(os.path.join(folder, f"{rank}.pkl"), "rb") as f:
                status, value = pickle.load(f)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results.append(value)
        return results
