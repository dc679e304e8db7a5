"""Private: ``layout="auto"``'s choice between a CSR weight and the dense one.

By default the choice is measured on the machine that converts: for each distinct (weight
shape, dtype, sparsity to the percent, rows per call, intra-op threads) :func:`choose` times
``F.linear`` with the dense weight and with its CSR form for a few milliseconds each, keeps the
faster (CSR only below :data:`MARGIN` times the dense time, so a tie stays dense), and caches
the answer for the process, as ``torch.backends.cudnn.benchmark`` does for convolutions. With
timing off (``to_sparse(..., measure=False)``) it reads :data:`CROSSOVER`, a
table measured once by ``python -m benchmarks.sparse --crossover`` (the figures and the machine
are in docs/sparse.md and ``benchmarks/results/sparse_crossover.md``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["CROSSOVER", "MARGIN", "NEVER", "ROWS", "TIMER", "choose", "clear_measurements", "crossover", "time_call"]

#: CSR is chosen when its time is below this fraction of the dense time (ties stay dense).
MARGIN = 0.95

#: The rows per call ``layout="auto"`` chooses for when ``rows`` is not given: decode (1 row)
#: up to a long prefill.
ROWS = (1, 8, 64, 512)

#: A crossover above any sparsity: CSR is never chosen.
NEVER = 1.01

#: Seconds of timing per variant and row count (at least :data:`_REPEATS` calls each).
BUDGET_S = 0.004
_REPEATS = 3

#: threads -> smallest weight count of the size class -> rows per call -> crossover sparsity.
#: The lowest sparsity at which CSR took at most 0.9x the dense time on every measured shape of
#: at least that size, at that sparsity and every higher one (docs/sparse.md has the grid).
CROSSOVER: dict[int, dict[int, dict[int, float]]] = {
    1: {
        65536: {1: 1.01, 8: 1.01, 64: 0.9, 512: 0.9},
        262144: {1: 0.95, 8: 0.85, 64: 0.85, 512: 0.9},
        589824: {1: 0.9, 8: 0.8, 64: 0.85, 512: 0.9},
        1769472: {1: 0.85, 8: 0.75, 64: 0.85, 512: 0.9},
        2359296: {1: 0.85, 8: 0.75, 64: 0.85, 512: 0.9},
        4194304: {1: 0.75, 8: 0.7, 64: 0.8, 512: 0.9},
    },
}

# (out, in, dtype, sparsity in percent, rows, threads) -> "csr" / "dense": the measured choices.
_CACHE: dict[tuple, str] = {}


def clear_measurements() -> None:
    """Forgets every measured choice of ``layout="auto"`` (the next conversion times again)."""
    _CACHE.clear()


def crossover(numel: int, *, threads: int | None = None, rows: int | None = None) -> float:
    """The lowest sparsity at which ``layout="auto"`` with timing off makes a weight CSR.

    Reads the table measured by ``python -m benchmarks.sparse --crossover`` (docs/sparse.md);
    with timing on (the default), ``layout="auto"`` times each layer on the running machine
    instead.

    Args:
        numel: the weight's number of entries; it takes the crossover of the largest measured
            size class it reaches (below the smallest: never CSR).
        threads: intra-op threads (default ``torch.get_num_threads()``); the nearest measured
            count is used (more than measured: the highest measured).
        rows: rows per call the layer will see; ``None``: every measured row count (the highest
            crossover). A count between two measured ones takes the higher of their crossovers,
            one beyond them the nearest's.

    Returns:
        A sparsity in [0, 1], or 1.01 where CSR never measured faster.

    Example:
        >>> from fprune.sparse import crossover
        >>> crossover(4096 * 1024, threads=2, rows=8) <= crossover(4096 * 1024, threads=2)
        True
        >>> crossover(64 * 64)
        1.01
    """
    threads = torch.get_num_threads() if threads is None else threads
    by_threads = CROSSOVER[min(CROSSOVER, key=lambda t: (abs(t - threads), -t))]
    sizes = sorted(by_threads)
    i = bisect.bisect_right(sizes, numel)
    if i == 0:
        return NEVER
    table = by_threads[sizes[i - 1]]
    if rows is None:
        return max(table.values())
    if rows in table:
        return table[rows]
    counts = sorted(table)
    j = bisect.bisect_left(counts, rows)
    return max(table[c] for c in counts[max(0, j - 1) : j + 1])


def time_call(fn: Callable[[], Any], budget_s: float, *, name: str, rows: int) -> float:
    """The fastest of the calls of ``fn`` that fit in ``budget_s`` (at least 3, after one warm-up).

    ``name`` (``"dense"`` or ``"csr"``) and ``rows`` say what ``fn`` runs; this timer does not
    need them (a timer put in :data:`TIMER` by a test does).
    """
    fn()
    best, spent, n = float("inf"), 0.0, 0
    while n < _REPEATS or spent < budget_s:
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent, n = min(best, took), spent + took, n + 1
    return best


#: The timer :func:`choose` calls: ``TIMER(fn, budget_s, name=, rows=)`` -> seconds (tests replace it).
TIMER: Callable[..., float] = time_call


def _key(matrix: torch.Tensor, sparsity: float, rows: int) -> tuple:
    return (*matrix.shape, matrix.dtype, round(sparsity * 100), rows, torch.get_num_threads())


def _timed(matrix: torch.Tensor, csr: torch.Tensor, rows: int) -> str:
    from fprune.sparse._weight import SparseWeight  # _weight imports nothing of this module

    weight = SparseWeight(csr)
    x = torch.randn(rows, matrix.shape[1], dtype=matrix.dtype, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense_s = TIMER(lambda: F.linear(x, matrix), BUDGET_S, name="dense", rows=rows)
        csr_s = TIMER(lambda: F.linear(x, weight), BUDGET_S, name="csr", rows=rows)
    return "csr" if csr_s < MARGIN * dense_s else "dense"


def choose(
    matrix: torch.Tensor,
    sparsity: float,
    make_csr: Callable[[], torch.Tensor],
    *,
    rows: Sequence[int] | None,
    measure: bool,
) -> str:
    """``"csr"`` or ``"dense"`` for the ``(out, in)`` CPU float32/float64 ``matrix`` (pruned entries zero).

    CSR only where it is faster at every count of ``rows`` (default :data:`ROWS`): timed on this
    machine and cached (``measure``), or read from :data:`CROSSOVER`.
    ``make_csr`` builds the CSR form, called only when a count must be timed.
    """
    if not measure:
        counts: Sequence[int | None] = [None] if rows is None else rows
        # a count-exact amount of 0.9 leaves a sparsity a rounding below 0.9: it counts as 0.9
        need = max(crossover(matrix.numel(), rows=r) for r in counts)
        return "csr" if sparsity >= need - 1e-4 else "dense"
    csr: torch.Tensor | None = None
    for r in ROWS if rows is None else rows:
        key = _key(matrix, sparsity, r)
        choice = _CACHE.get(key)
        if choice is None:
            csr = make_csr() if csr is None else csr
            choice = _CACHE[key] = _timed(matrix, csr, r)
        if choice == "dense":
            return "dense"
    return "csr"
