"""Run a function on N gloo processes on localhost CPU, with a hard timeout (nothing can hang CI).

``launch(world, target, *args)`` starts ``world`` processes, each running ``target(rank, world,
*args)`` after ``init_process_group("gloo")``, and returns what each rank's ``target`` returned
(pickled through a file), or raises if a rank failed, exited badly or a timeout hit. The
``timeout`` counts from when every rank has joined the process group, so that it measures the
target alone and not how long a loaded machine takes to start the processes (importing torch);
the start itself has its own limit (``_START``).

The processes are forked from a fork server (``multiprocessing``'s "forkserver"), one per test
process, which imported torch, its distributed packages (DTensor, FSDP, and dynamo, which
DTensor's constructor imports) and fprune once: a rank starts in milliseconds instead of importing
them again (seconds each). The fork server is a single thread, so forking it is safe; a rank has
the environment variables of the test process when the fork server started. A rank's standard
output and error go to a file, shown in the report of a rank that failed, crashed or hung.

The ranks meet through a ``FileStore`` in a fresh temporary folder, not a TCP port, so launches
in parallel test processes (pytest-xdist) cannot collide. A rank that succeeded ends its process
group (a barrier, so that no rank tears gloo down while another still talks, then
``destroy_process_group``) and leaves with ``os._exit``: torch keeps the gloo backend, and its
threads, alive after ``destroy_process_group`` once a DTensor was made, and finalizing the
interpreter under running gloo threads can abort the process ("terminate called without an
active exception", SIGABRT). A hang is reported with every rank's Python stacks
(``faulthandler``) and the last collectives each rank entered (a trace of every
``torch.distributed`` collective with its tensor's shape and its callers), from the first one where
the ranks' sequences differ: ranks that took different paths wait in different collectives, and
the trace names where they parted.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pathlib
import pickle
import sys
import tempfile
import threading
import time
import traceback

import torch
import torch.multiprocessing as mp

# What the fork server imports once, for every rank it forks.
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch._dynamo",
    "fprune",
    "tests.distributed.launch",
]

# Seconds from the start until every rank has joined the process group (importing torch and the
# target's module; ``init_process_group`` waits 60 s for the other ranks).
_START = 120.0

# The most seconds between the timeout and the parent's kill, while a rank that hung writes its
# stacks (``faulthandler``, at the timeout on the rank's own clock): the parent waits until each
# hung rank's file of stacks is written, at most this long.
_GRACE = 5.0

# The collectives of torch.distributed that the trace records (each rank's file: one line each).
_TRACED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "barrier",
    "reduce_scatter_tensor",
)


def _trace_collectives(path: str) -> None:
    """Write a line per collective this process enters (name, tensor shape and dtype, the three
    innermost callers outside torch) to ``path``, line-buffered so that a killed rank's file
    holds everything up to the collective it hung in."""
    import torch.distributed as dist

    log = open(path, "w", buffering=1)  # noqa: SIM115 (open until exit)

    def traced(name, original):
        def call(*args, **kwargs):
            tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
            what = f"{tuple(tensor.shape)} {tensor.dtype}" if tensor is not None else ""
            frames, frame = [], sys._getframe(1)
            while frame is not None and len(frames) < 3:
                if "torch" + os.sep not in frame.f_code.co_filename:
                    where = os.path.basename(frame.f_code.co_filename)
                    frames.append(f"{where}:{frame.f_lineno} {frame.f_code.co_name}")
                frame = frame.f_back
            log.write(f"{name} {what} | {' < '.join(frames)}\n")
            return original(*args, **kwargs)

        return call

    for name in _TRACED:
        setattr(dist, name, traced(name, getattr(dist, name)))


def _divergence(folder: str, ranks: list[int]) -> str:
    """Where the ranks' traces of collectives first differ (by name and shape), and each rank's
    collectives from there (at most 6 each)."""
    traces = {}
    for rank in ranks:
        path = os.path.join(folder, f"{rank}.collectives")
        traces[rank] = pathlib.Path(path).read_text().splitlines() if os.path.exists(path) else []
    keys = {r: [line.split(" | ")[0] for line in t] for r, t in traces.items()}
    first = 0
    while all(first < len(k) for k in keys.values()) and len({k[first] for k in keys.values()}) == 1:
        first += 1
    lines = [f"--- collectives: the ranks agree on the first {first} ---"]
    for rank, trace in traces.items():
        shown = trace[first : first + 6] or ["(none after those)"]
        lines.append(f"rank {rank} ({len(trace)} in all), from collective {first}:")
        lines.extend(f"  {line}" for line in shown)
    return "\n".join(lines)


def end_process_group(barrier: bool = True) -> None:
    """End this process's process groups: a barrier (unless ``barrier=False``: after an error the
    other ranks may never reach it), then ``destroy_process_group``."""
    import torch.distributed as dist

    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def leave(code: int, *files) -> None:
    """Exit now, without finalizing the interpreter: torch keeps gloo's threads running after
    ``destroy_process_group`` (once a DTensor was made; no public API stops them), and the
    interpreter's teardown under them can abort the process. Output is flushed first."""
    for f in (sys.stdout, sys.stderr, *files):
        f.flush()
    os._exit(code)


def _without_deps(paths: list[str]) -> list[str]:
    """``paths`` without the .deps/ folder that the zoo tests may have appended to the test
    process's sys.path (torchvision, for benchmarks.zoo alone), which a rank inherits:
    transformers would import that torchvision, which fails beside this torch ("operator
    torchvision::nms does not exist")."""
    return [p for p in paths if pathlib.Path(p).name != ".deps"]


def _fork_server(context) -> None:
    """Start the fork server unless it runs (it imports ``_PRELOAD`` with the test process's
    sys.path at that time, less .deps/)."""
    from multiprocessing import forkserver

    context.set_forkserver_preload(_PRELOAD)
    kept = sys.path[:]
    sys.path[:] = _without_deps(kept)
    try:
        forkserver.ensure_running()
    finally:
        sys.path[:] = kept


def _entry(rank, world, folder, target, args, started, timeout):
    import torch.distributed as dist

    output = os.open(os.path.join(folder, f"{rank}.output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(output, 1)
    os.dup2(output, 2)
    sys.path[:] = _without_deps(sys.path)
    torch.set_num_threads(1)
    stacks = open(os.path.join(folder, f"{rank}.stacks"), "w")  # noqa: SIM115 (open until exit)
    faulthandler.enable(stacks)  # a crash (SIGABRT, SIGSEGV) writes the Python stacks
    faulthandler.dump_traceback_later(max(started - time.time(), 0.1), file=stacks)  # so does a hang
    _trace_collectives(os.path.join(folder, f"{rank}.collectives"))
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{os.path.join(folder, 'store')}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        # Joined: the timeout of the target starts now (the parent waits for every rank's file).
        faulthandler.dump_traceback_later(timeout, file=stacks)
        pathlib.Path(folder, f"{rank}.ready").touch()
        result = ("ok", target(rank, world, *args))
    except BaseException:  # report everything to the parent
        result = ("error", traceback.format_exc())
    if result[0] == "ok":
        try:
            end_process_group()
        except BaseException:
            result = ("error", "ending the process group:\n" + traceback.format_exc())
    with open(os.path.join(folder, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    faulthandler.cancel_dump_traceback_later()
    # A rank that failed skips the barrier (its peers may be blocked in a collective it will never
    # join) and leaves at once; its traceback is saved. Either way, leave without finalizing.
    leave(0 if result[0] == "ok" else 1, stacks)


def _wait_for_stacks(folder: str, ranks: list[int]) -> None:
    """Wait (at most ``_GRACE`` s) until each of ``ranks`` has written its stacks: its file is not
    empty and no longer grows."""
    paths = [os.path.join(folder, f"{rank}.stacks") for rank in ranks]
    size = lambda path: os.path.getsize(path) if os.path.exists(path) else 0
    end = time.monotonic() + _GRACE
    before = [size(path) for path in paths]
    while time.monotonic() < end:
        time.sleep(0.05)
        now = [size(path) for path in paths]
        if all(now) and now == before:
            return
        before = now


def _start(processes) -> None:
    """Start ``processes``, or raise if the fork server does not fork them within ``_START`` s
    (``Process.start`` waits for it, and it imports ``_PRELOAD`` first)."""
    errors = []

    def start():
        try:
            for process in processes:
                process.start()
        except BaseException as error:
            errors.append(error)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    starter.join(_START)
    if errors:
        raise errors[0]
    if starter.is_alive():
        for process in processes:
            if process.pid is not None:
                process.kill()
        raise TimeoutError(f"the fork server did not start the ranks within {_START} s")


def launch(world: int, target, *args, timeout: float = 240.0) -> list:
    """``target(rank, world, *args)`` on ``world`` processes; the per-rank results, rank order.
    ``timeout``: seconds for the target, from when every rank has joined the process group."""
    name = getattr(target, "__qualname__", repr(target))
    context = mp.get_context("forkserver")
    _fork_server(context)
    with tempfile.TemporaryDirectory() as folder:
        started = time.time() + _START  # when ranks still starting write their stacks
        processes = [
            context.Process(
                target=_entry, args=(rank, world, folder, target, args, started, timeout), daemon=True
            )
            for rank in range(world)
        ]
        _start(processes)
        ready = lambda rank: os.path.exists(os.path.join(folder, f"{rank}.ready"))
        deadline = time.monotonic() + _START
        try:
            # Until every rank has joined (or ended, or the start took too long) ...
            while time.monotonic() < deadline and not all(
                ready(rank) or not p.is_alive() for rank, p in enumerate(processes)
            ):
                time.sleep(0.02)
            starting = [rank for rank, p in enumerate(processes) if p.is_alive() and not ready(rank)]
            if not starting:
                # ... then the timeout of the target.
                deadline = time.monotonic() + timeout
                for process in processes:
                    process.join(max(deadline - time.monotonic(), 0.0))
        finally:
            hung = [rank for rank, p in enumerate(processes) if p.is_alive()]
            if hung:
                _wait_for_stacks(folder, hung)
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join(10.0)

        def stacks(rank: int) -> str:
            path = os.path.join(folder, f"{rank}.stacks")
            text = pathlib.Path(path).read_text() if os.path.exists(path) else ""
            return f"--- rank {rank} stacks ---\n{text.strip() or '(none written)'}" + output(rank)

        def output(rank: int) -> str:
            path = os.path.join(folder, f"{rank}.output")
            text = pathlib.Path(path).read_text(errors="replace").strip() if os.path.exists(path) else ""
            return f"\n--- rank {rank} output (its end) ---\n{text[-3000:]}" if text else ""

        if hung:
            what = f"did not start within {_START} s" if starting else f"did not finish within {timeout} s"
            raise TimeoutError(
                f"{name} on {world} gloo processes: ranks {hung} {what} "
                f"(killed); their Python stacks at the timeout:\n"
                + "\n".join(stacks(r) for r in hung)
                + "\n"
                + _divergence(folder, list(range(world)))
            )
        results, failures = [], []
        for rank, process in enumerate(processes):
            path = os.path.join(folder, f"{rank}.pkl")
            if not os.path.exists(path):
                failures.append(f"rank {rank} exited with code {process.exitcode}, no result\n{stacks(rank)}")
                continue
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status != "ok":
                failures.append(f"rank {rank} failed:\n{value}{output(rank)}")
            elif process.exitcode != 0:
                failures.append(f"rank {rank} exited with code {process.exitcode}\n{stacks(rank)}")
            results.append(value)
        if failures:
            raise AssertionError(f"{name} on {world} gloo processes:\n" + "\n".join(failures))
        return results
