"""Private: ``layout="auto"``'s choice between a CSR weight and the dense one.

By default the choice is measured on the machine that converts: for each distinct (weight
shape, dtype, sparsity to the percent, rows per call, intra-op threads) :func:`choose` times
``F.linear`` with the dense weight, with its CSR form and with the dense weight again, for a
few milliseconds each, and caches the answer for the process, as
``torch.backends.cudnn.benchmark`` does for convolutions. CSR wins a timing below
:data:`MARGIN` times the faster dense timing, in its fastest call and in the median round (a
tie stays dense); it is chosen after two wins, since a wrong CSR choice costs several times the
dense time and a wrong dense one only the speed-up left unused, and one timing it does not win
keeps the weight dense. A timing whose two dense timings differ by more than :data:`NOISE` (the
machine too busy to tell) is taken again; after :data:`ATTEMPTS` timings without a verdict the
table answers. With timing off
(``to_sparse(..., measure=False)``) it reads :data:`CROSSOVER`, a
table measured once by ``python -m benchmarks.sparse --crossover`` (the figures and the machine
are in docs/sparse.md and ``benchmarks/results/sparse_crossover.md``).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "CROSSOVER",
    "MARGIN",
    "NEVER",
    "ROWS",
    "TIMER",
    "choose",
    "clear_measurements",
    "crossover",
    "time_calls",
]

#: CSR is chosen when its time is below this fraction of the dense time (ties stay dense).
MARGIN = 0.95

#: The rows per call ``layout="auto"`` chooses for when ``rows`` is not given: decode (1 row)
#: up to a long prefill.
ROWS = (1, 8, 64, 512)

#: Two timings of the dense weight further apart than this factor: too noisy to tell.
NOISE = 1.5

#: A crossover above any sparsity: CSR is never chosen.
NEVER = 1.01

#: Timings of one weight and row count at most: CSR must win two, dense one; noisy ones are retaken.
ATTEMPTS = 3

#: Seconds of timing per variant and row count (at least :data:`_REPEATS` calls each).
BUDGET_S = 0.004
_REPEATS = 5

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


def time_calls(fns: dict[str, Callable[[], Any]], budget_s: float, *, rows: int) -> dict[str, list[float]]:
    """The seconds of each call of each function, the functions called in turn, round after round,
    until every function has had ``budget_s`` and at least 5 calls: a change in the machine's load
    hits them alike. ``rows`` says what they run; this timer does not need it."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    spent, n = 0.0, 0
    while n < _REPEATS or spent < budget_s * len(fns):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            took = time.perf_counter() - start
            times[name].append(took)
            spent += took
        n += 1
    return times


#: The timer :func:`choose` calls: ``TIMER(fns, budget_s, rows=)`` -> each name's seconds per
#: round (tests replace it). The names: ``"dense"``, ``"csr"`` and ``"dense again"`` (the noise check).
TIMER: Callable[..., dict[str, list[float]]] = time_calls


def _key(matrix: torch.Tensor, sparsity: float, rows: int) -> tuple:
    return (*matrix.shape, matrix.dtype, round(sparsity * 100), rows, torch.get_num_threads())


def _timed(matrix: torch.Tensor, csr: torch.Tensor, rows: int) -> str | None:
    """``"csr"`` / ``"dense"`` by timing; None where the timing cannot tell.

    A wrong CSR choice costs up to several times the dense time, a wrong dense one only the
    speed-up left unused, so CSR must win two timings (:func:`_timed_once`) and a timing that
    finds dense at least as fast ends it; a timing too noisy to tell is taken again, up to
    :data:`ATTEMPTS` in all.
    """
    from fprune.sparse._weight import SparseWeight  # _weight imports nothing of this module

    weight = SparseWeight(csr)
    x = torch.randn(rows, matrix.shape[1], dtype=matrix.dtype, generator=torch.Generator().manual_seed(0))
    fns = {
        "dense": lambda: F.linear(x, matrix),
        "csr": lambda: F.linear(x, weight),
        "dense again": lambda: F.linear(x, matrix),
    }
    wins = 0
    for _ in range(ATTEMPTS):
        with torch.no_grad():
            verdict = _timed_once(TIMER(fns, BUDGET_S, rows=rows))
        if verdict == "dense":
            return "dense"
        if verdict == "csr":
            wins += 1
            if wins == 2:
                return "csr"
    return None


def _timed_once(t: dict[str, list[float]]) -> str | None:
    """One timing's verdict; None where the two dense timings differ by more than :data:`NOISE`
    (the machine's other work, not the kernels, set them)."""
    low, high = sorted((min(t["dense"]), min(t["dense again"])))
    if high > NOISE * low:
        return None
    # CSR must win on both the fastest calls and the median round (a call of each, back to back):
    # one quiet moment of a busy machine does not make it faster
    paired = statistics.median(
        c / min(d, e) for c, d, e in zip(t["csr"], t["dense"], t["dense again"], strict=True)
    )
    return "csr" if min(t["csr"]) < MARGIN * low and paired < MARGIN else "dense"


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
        return _from_table(matrix.numel(), sparsity, [None] if rows is None else rows)
    csr: torch.Tensor | None = None
    for r in ROWS if rows is None else rows:
        key = _key(matrix, sparsity, r)
        choice = _CACHE.get(key)
        if choice is None:
            csr = make_csr() if csr is None else csr
            timed = _timed(matrix, csr, r)
            # too noisy to tell: the table's answer for this count
            choice = _CACHE[key] = timed or _from_table(matrix.numel(), sparsity, [r])
        if choice == "dense":
            return "dense"
    return "csr"


def _from_table(numel: int, sparsity: float, rows: Sequence[int | None]) -> str:
    # a count-exact amount of 0.9 leaves a sparsity a rounding below 0.9: it counts as 0.9
    return "csr" if sparsity >= max(crossover(numel, rows=r) for r in rows) - 1e-4 else "dense"
