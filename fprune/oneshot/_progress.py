"""Progress of the pipeline: a callable, tqdm bars, or lines on stderr.

Besides the times, the report watches the time per block for a jump: a block whose time per
weight entry of its pruned layers (the forwards, the statistics and the solves all grow with
it) is over :data:`SLOW_FACTOR` times the median of the blocks before it, once
:data:`SLOW_AFTER` blocks have been seen, is most often a block that ran while other jobs took
the cores. With more than one torch thread, the report says once what to set on a shared
machine (``BlockReport.hint``; a line on stderr, or under the tqdm bar).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch

# A block is slow when its seconds per weight entry exceed SLOW_FACTOR x the median of the
# blocks before it, and at least SLOW_AFTER blocks came before it.
SLOW_FACTOR = 2.0
SLOW_AFTER = 3


class BlockReport(NamedTuple):
    """One step of :func:`prune`, handed to ``progress`` when it is a callable.

    ``phase`` is ``"capture"`` (a batch run up to the first block: ``number`` counts batches,
    ``total`` is 0 when ``batches`` has no length), ``"norms"`` (OWL's dense pass over one
    block; its time in ``statistics_seconds``) or ``"prune"`` (one block). ``hint`` is ``None``
    but on the one block (at most one per call) whose time per weight entry jumped above twice
    the median of at least three blocks before it while torch runs more than one thread: then
    it says what to set on a machine shared with other jobs (one torch thread, OpenMP's
    passive wait policy).
    """

    number: int  # the step's position in its phase, 0-based
    total: int  # steps in the phase (0: unknown)
    name: str  # the block's module name
    layers: int  # layers pruned in it
    statistics_seconds: float  # running the block on its inputs with hooks (hessians, norms)
    pruning_seconds: float  # masks and weight updates
    forward_seconds: float  # running the pruned block for the next block's inputs
    phase: str = "prune"
    elapsed_seconds: float = 0.0  # since prune was called
    remaining_seconds: float | None = None  # estimate for the rest of the phase (None: unknown)
    hint: str | None = None  # what to set on a shared machine, once, when a block's time jumped


class Progress:
    """Reports to a callable, to tqdm bars (one per phase) or to stderr lines.

    ``clock`` (``time.perf_counter`` by default) is the clock of the report and of the
    pipeline's step times, so that a test can drive both.
    """

    _LABELS: ClassVar[dict[str, str]] = {"capture": "capture", "norms": "OWL norms", "prune": "blocks"}

    def __init__(self, progress: Any, clock: Callable[[], float] | None = None) -> None:
        self.callback = progress if callable(progress) and not isinstance(progress, bool) else None
        self.on = bool(progress)
        self.tqdm = _tqdm() if progress is True else None
        self.bar: Any = None
        self.clock = clock if clock is not None else time.perf_counter
        self.started = self.clock()
        self.phase_started = self.started
        self.phase = ""
        self.total = 0
        self.rates: list[float] = []  # seconds per weight entry of the blocks pruned so far
        self.hinted = False

    def start(self, phase: str, total: int) -> None:
        self.close()
        self.phase, self.total, self.phase_started = phase, total, self.clock()
        if self.on and self.tqdm is not None:
            self.bar = self.tqdm(
                total=total or None,
                desc=f"oneshot.prune: {self._LABELS[phase]}",
                file=sys.stderr,
                unit="step",
            )

    def step(
        self,
        number: int,
        name: str,
        layers: int = 0,
        seconds: tuple[float, float, float] = (0.0, 0.0, 0.0),
        entries: int = 0,
    ) -> None:
        """Report one step; ``entries``: the weight entries of the layers it pruned (0: none)."""
        if not self.on:
            return
        now = self.clock()
        done = number + 1
        remaining = (now - self.phase_started) / done * (self.total - done) if self.total else None
        hint = self.watch(sum(seconds), entries) if self.phase == "prune" else None
        report = BlockReport(
            number,
            self.total,
            name,
            layers,
            *seconds,
            phase=self.phase,
            elapsed_seconds=now - self.started,
            remaining_seconds=remaining,
            hint=hint,
        )
        if self.callback is not None:
            self.callback(report)
        elif self.bar is not None:
            self.bar.set_postfix_str(name if hint is None else f"{name}, {_SHORT}", refresh=False)
            if hint is not None:
                self.bar.write(f"oneshot.prune: {hint}", file=sys.stderr)
            self.bar.update(1)
        else:
            print(_line(report), file=sys.stderr, flush=True)  # noqa: T201 (progress=True, documented)

    def watch(self, seconds: float, entries: int) -> str | None:
        """The hint, the first time a block's seconds per entry jump (see the module's docstring)."""
        if entries <= 0 or seconds <= 0:
            return None
        rate = seconds / entries
        earlier, self.rates = self.rates, [*self.rates, rate]
        if self.hinted or len(earlier) < SLOW_AFTER:
            return None
        factor = rate / statistics.median(earlier)
        if factor <= SLOW_FACTOR:
            return None
        hint = shared_machine_hint(factor, torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY"))
        self.hinted = hint is not None
        return hint

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


_SHORT = "slow: shared machine? see the note above"


def shared_machine_hint(factor: float, threads: int, wait_policy: str | None) -> str | None:
    """What to set when a block ran ``factor`` times slower per entry (None with one thread:
    nothing of torch's to set)."""
    if threads <= 1:
        return None
    settings = ["torch.set_num_threads(1) (or OMP_NUM_THREADS=1 in the environment)"]
    if (wait_policy or "").strip().upper() != "PASSIVE":
        settings.append("OMP_WAIT_POLICY=PASSIVE in the environment before Python starts")
    return (
        f"this block took {factor:.1f}x the time per weight of the blocks before it, on {threads} "
        f"torch threads. If other jobs share these cores, torch's threads wait for each other "
        f"at every operation; set {' and '.join(settings)} (docs/posttrain.md, On a shared machine)."
    )


def _line(r: BlockReport) -> str:
    of = f"{r.number + 1}/{r.total}" if r.total else f"{r.number + 1}"
    left = "" if r.remaining_seconds is None else f", ~{r.remaining_seconds:.1f} s left"
    times = f"{r.elapsed_seconds:.1f} s elapsed{left}"
    if r.phase == "capture":
        return f"oneshot.prune: capture of {r.name}'s inputs, batch {of}: {times}"
    if r.phase == "norms":
        return f"oneshot.prune: OWL's dense pass, block {of} {r.name}: {r.statistics_seconds:.1f} s; {times}"
    line = (
        f"oneshot.prune: block {of} {r.name}: {r.layers} layers, statistics {r.statistics_seconds:.1f} s, "
        f"pruning {r.pruning_seconds:.1f} s, outputs {r.forward_seconds:.1f} s; {times}"
    )
    return line if r.hint is None else f"{line}\noneshot.prune: {r.hint}"


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]  # optional: plain stderr lines without it
    except ImportError:
        return None
    return tqdm
