"""Private: ``layout="auto"``'s choice between a CSR weight and the dense one, from measurements.

The table below is the CPU crossover measured by ``python -m benchmarks.sparse --crossover``
(``benchmarks/results/sparse_crossover.{md,json}``): for each intra-op thread count and number
of rows per call (the batch, times the sequence length for a transformer), the lowest sparsity at
which ``csr @ x.T`` took at most :data:`MARGIN` times the dense ``F.linear`` on every measured
shape, at that sparsity and every higher one. A layer becomes CSR when its sparsity reaches the
crossover of every row count it may see (all of them, unless ``rows=`` says), so that no batch
runs more than about 1.1x slower than dense; otherwise it stays dense.
"""

from __future__ import annotations

import bisect

import torch

__all__ = ["choose", "crossover", "CROSSOVER", "MIN_WEIGHTS", "MARGIN"]

#: The highest csr/dense time ratio that counts as "not slower" when the table is made.
MARGIN = 0.9

#: Weights below this many entries stay dense: the Python dispatch of a sparse weight (~20 us)
#: outweighs what the kernel saves on a small layer.
MIN_WEIGHTS = 1 << 16

#: threads -> {rows per call: lowest sparsity where CSR is at most MARGIN x dense}. 1.01 = never.
CROSSOVER: dict[int, dict[int, float]] = {
    1: {1: 0.80, 8: 0.75, 64: 0.85, 512: 0.90},
    2: {1: 0.80, 8: 0.75, 64: 0.85, 512: 0.90},
}


def crossover(threads: int | None = None, rows: int | None = None) -> float:
    """The lowest sparsity at which ``layout="auto"`` makes a weight CSR.

    Args:
        threads: intra-op threads (default ``torch.get_num_threads()``); the nearest measured
            count is used (more than measured: the highest measured).
        rows: rows per call the layer will see; ``None``: every row count measured (the
            highest crossover). A count between two measured ones takes the higher crossover.
    """
    threads = torch.get_num_threads() if threads is None else threads
    measured = sorted(CROSSOVER)
    table = CROSSOVER[min(measured, key=lambda t: (abs(t - threads), -t))]
    if rows is None:
        return max(table.values())
    counts = sorted(table)
    i = bisect.bisect_left(counts, rows)
    near = counts[max(0, i - 1) : i + 1] or counts[-1:]
    return max(table[c] for c in near)


def choose(numel: int, sparsity: float, device: torch.device, *, threads: int | None = None,
           rows: int | None = None) -> str:
    """``"csr"`` or ``"dense"`` for a float32/float64 weight of ``numel`` entries at ``sparsity``."""
    if device.type != "cpu" or numel < MIN_WEIGHTS:
        return "dense"
    # a count-exact amount of 0.9 leaves a sparsity a rounding below 0.9: it counts as 0.9
    return "csr" if sparsity >= crossover(threads, rows) - 1e-4 else "dense"
