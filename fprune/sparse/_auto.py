"""Private: ``layout="auto"``'s choice between a CSR weight and the dense one, from measurements.

:data:`CROSSOVER` is the CPU crossover measured by ``python -m benchmarks.sparse --crossover``
(``benchmarks/results/sparse_crossover.{md,json}``): ``F.linear`` with a CSR weight against
the dense one on a grid of shapes (256x256 to 4096x1024), sparsities (50-98%) and rows per call
(1, 8, 64, 512), at 1 intra-op thread. For each size class (the weight counts of the measured
shapes) and row count it holds the lowest sparsity at which CSR took at most :data:`MARGIN`
times the dense time on every measured shape of at least that size, at that sparsity and every
higher one. Small layers need more sparsity: the sparse path costs a few microseconds of Python
per call, which a small dense layer does not take.

A weight becomes CSR when its sparsity reaches the crossover of its size class for every row
count it may see (all of them, unless ``rows=`` names one); otherwise it stays dense. The table
is keyed by thread count, and the nearest measured count serves: today only 1 thread is in it,
so it serves every count (docs/sparse.md says why: on the shared machine it was measured on, a
2-thread grid measured the scheduler's wake-ups, not the kernels; ``--crossover-threads 1 2`` on
an idle machine adds a 2-thread table). Why the choice is made once, at conversion, rather than
per call: see docs/sparse.md.
"""

from __future__ import annotations

import bisect

import torch

__all__ = ["CROSSOVER", "MARGIN", "NEVER", "choose", "crossover"]

#: The highest csr/dense time ratio that counts as "faster" when the table is made.
MARGIN = 0.9

#: A crossover above any sparsity: CSR is never chosen.
NEVER = 1.01

#: threads -> smallest weight count of the size class -> rows per call -> crossover sparsity.
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


def crossover(numel: int, *, threads: int | None = None, rows: int | None = None) -> float:
    """The lowest sparsity at which ``layout="auto"`` makes a weight of ``numel`` entries CSR.

    Args:
        numel: the weight's number of entries; it takes the crossover of the largest measured
            size class it reaches (below the smallest: never CSR).
        threads: intra-op threads (default ``torch.get_num_threads()``); the nearest measured
            count is used (more than measured: the highest measured).
        rows: rows per call the layer will see; ``None``: every measured row count (the highest
            crossover). A count between two measured ones takes the higher of their crossovers,
            one beyond them the nearest's.

    Returns:
        A sparsity in [0, 1], or 1.01 (:data:`NEVER`) where CSR never measured faster.

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


def choose(
    numel: int, sparsity: float, device: torch.device, *, threads: int | None = None, rows: int | None = None
) -> str:
    """``"csr"`` or ``"dense"`` for a float32/float64 weight of ``numel`` entries at ``sparsity``."""
    if device.type != "cpu":
        return "dense"
    # a count-exact amount of 0.9 leaves a sparsity a rounding below 0.9: it counts as 0.9
    return "csr" if sparsity >= crossover(numel, threads=threads, rows=rows) - 1e-4 else "dense"
