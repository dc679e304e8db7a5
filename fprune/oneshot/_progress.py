"""Progress of the pipeline: a callable, tqdm bars, or lines on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any, ClassVar, NamedTuple


class BlockReport(NamedTuple):
    """One step of :func:`prune`, handed to ``progress`` when it is a callable.

    ``phase`` is ``"capture"`` (a batch run up to the first block: ``number`` counts batches,
    ``total`` is 0 when ``batches`` has no length), ``"norms"`` (OWL's dense pass over one
    block; its time in ``statistics_seconds``) or ``"prune"`` (one block).
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


class Progress:
    """Reports to a callable, to tqdm bars (one per phase) or to stderr lines."""

    _LABELS: ClassVar[dict[str, str]] = {"capture": "capture", "norms": "OWL norms", "prune": "blocks"}

    def __init__(self, progress: Any) -> None:
        self.callback = progress if callable(progress) and not isinstance(progress, bool) else None
        self.on = bool(progress)
        self.tqdm = _tqdm() if progress is True else None
        self.bar: Any = None
        self.started = time.perf_counter()
        self.phase_started = self.started
        self.phase = ""
        self.total = 0

    def start(self, phase: str, total: int) -> None:
        self.close()
        self.phase, self.total, self.phase_started = phase, total, time.perf_counter()
        if self.on and self.tqdm is not None:
            self.bar = self.tqdm(
                total=total or None,
                desc=f"oneshot.prune: {self._LABELS[phase]}",
                file=sys.stderr,
                unit="step",
            )

    def step(
        self, number: int, name: str, layers: int = 0, seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    ) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        done = number + 1
        remaining = (now - self.phase_started) / done * (self.total - done) if self.total else None
        report = BlockReport(
            number,
            self.total,
            name,
            layers,
            *seconds,
            phase=self.phase,
            elapsed_seconds=now - self.started,
            remaining_seconds=remaining,
        )
        if self.callback is not None:
            self.callback(report)
        elif self.bar is not None:
            self.bar.set_postfix_str(name, refresh=False)
            self.bar.update(1)
        else:
            print(_line(report), file=sys.stderr, flush=True)  # noqa: T201 (progress=True, documented)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _line(r: BlockReport) -> str:
    of = f"{r.number + 1}/{r.total}" if r.total else f"{r.number + 1}"
    left = "" if r.remaining_seconds is None else f", ~{r.remaining_seconds:.1f} s left"
    times = f"{r.elapsed_seconds:.1f} s elapsed{left}"
    if r.phase == "capture":
        return f"oneshot.prune: capture of {r.name}'s inputs, batch {of}: {times}"
    if r.phase == "norms":
        return f"oneshot.prune: OWL's dense pass, block {of} {r.name}: {r.statistics_seconds:.1f} s; {times}"
    return (
        f"oneshot.prune: block {of} {r.name}: {r.layers} layers, statistics {r.statistics_seconds:.1f} s, "
        f"pruning {r.pruning_seconds:.1f} s, outputs {r.forward_seconds:.1f} s; {times}"
    )


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]  # optional: plain stderr lines without it
    except ImportError:
        return None
    return tqdm
