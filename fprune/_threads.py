"""Private: torch's intra-op threads lowered to one around a region of small operations.

Every multi-threaded torch operation ends at a barrier where its threads wait for each other.
When other processes share the cores, one of them is often descheduled and the operation lasts
until the scheduler runs it again (milliseconds), however small the operation; the waiting
threads spin meanwhile (OpenMP's default wait policy), taking CPU time from the rest. A loop of
many small operations (a layer's solve in :func:`fprune.oneshot.prune`: SparseGPT's column
sweep, a selection's passes over one layer) then runs many times slower on two threads than on
one, while on free cores a second thread gains little on operations that small. :func:`serial`
runs such a region on one thread and restores the count after, also when the region raises.

``torch.set_num_threads`` is process-wide: torch operations that other Python threads run
during the region run on one thread too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fprune import _torch

# Regions whose work is of at most this many entries (a layer's weight) run on one thread.
SERIAL_ENTRIES = 1 << 22


@contextlib.contextmanager
def serial(entries: int) -> Iterator[bool]:
    """One intra-op thread inside the ``with`` when ``entries <= SERIAL_ENTRIES``; the count the
    caller had is restored on exit. Yields whether the count was lowered: not when it is one
    already, for larger work, while tracing (``torch.compile``), or where torch refuses to set it."""
    before = torch.get_num_threads()
    lowered = False
    if before > 1 and entries <= SERIAL_ENTRIES and not _torch.is_compiling():
        try:
            torch.set_num_threads(1)
            lowered = True
        except RuntimeError:  # a build that cannot change it: the region runs as it is
            lowered = False
    try:
        yield lowered
    finally:
        if lowered:
            torch.set_num_threads(before)
