"""Private: the :class:`Blocks` scope (the lowest-norm tiles of each matrix), the worked example
of a new scope in docs/selection.md."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch

from fprune import _torch
from fprune.select import _inputs
from fprune.select._executor import Executor, Grouped
from fprune.select._scope import Scope


@dataclass(frozen=True)
class Blocks(Scope):
    """Per leaf, whole tiles of ``shape`` are pruned: the tiles whose scores have the lowest norm.

    A leaf is a matrix: a 2-d leaf as it is, a leaf of more dims as ``(shape[0], rest)`` (a conv
    weight as its ``out_channels x (in_channels * kernel)`` matrix); a leaf of fewer dims raises
    (leave it out with ``where=``). The matrix is cut into tiles of ``shape`` from its top-left
    corner; where a dim is not a multiple of the tile's, the last tiles along it are smaller
    (they hold fewer entries, so their norm tends to be lower); a tile larger than the whole
    matrix, which would prune all of it or nothing, raises ``ValueError``. A tile's score is the
    ``p``-norm of its entries' scores (entries that prior masks pruned count as zero), summed in
    float64 where the device has it; ``amount`` counts tiles (a tile is alive while prior masks
    keep any of its entries), and ties go to the first tile in row-major order.

    Args:
        shape: the tile, ``(rows, columns)``, two positive ints.
        p: the order of the norm, a positive number (``2``: Frobenius).
    """

    reduces = True

    shape: tuple[int, int]
    p: float = 2

    def __post_init__(self) -> None:
        shape = self.shape
        if not isinstance(shape, tuple) or len(shape) != 2:
            raise TypeError(f"Expected shape to be a tuple of two ints (rows, columns), got {shape!r}.")
        for size in shape:
            if isinstance(size, bool) or not isinstance(size, numbers.Integral):
                raise TypeError(f"Expected shape to be a tuple of two ints (rows, columns), got {shape!r}.")
            if size < 1:
                raise ValueError(f"Expected the tile's sizes to be positive, got shape={shape!r}.")
        p = self.p
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise TypeError(f"Expected p to be a positive number (the order of the norm), got {p!r}.")
        if not 0 < p < math.inf:
            raise ValueError(f"Expected p to be a positive finite number, got {p!r}.")

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        """Per leaf, its tiles ranked by the sum of their entries' ``|score| ** p``; every leaf
        is checked before any is scored."""
        leaves = ex.pruned()
        tilings = [self._tiling(ex.inputs, i) for i in leaves]
        return ex.grouped(Grouped(leaves, tilings, self._powers, "tiles"))

    def _tiling(self, inputs: _inputs.Inputs, i: int) -> _Tiling:
        """Leaf ``i`` as a matrix cut into tiles."""
        shape = inputs.params.leaves[i].shape
        if len(shape) < 2:
            raise ValueError(
                f"{self!r} prunes tiles of matrices, but {inputs.name(i)} has shape "
                f"{tuple(shape)}; leave such leaves out with where=lambda name, p: p.dim() > 1."
            )
        rows, cols = shape[0], math.prod(shape[1:])
        bh, bw = self.shape
        if bh >= rows and bw >= cols and (bh, bw) != (rows, cols):
            # One tile larger than the whole matrix: every amount prunes all of it or nothing.
            raise ValueError(
                f"Expected shape (the tile) to fit in {inputs.name(i)} ({rows} x {cols} as a "
                f"matrix), got shape={self.shape!r}: one tile larger than the matrix prunes all "
                f"of it or nothing. Pass a smaller tile, or leave such leaves out with where=lambda "
                f"name, p: p.dim() > 1 and (p.shape[0] > {bh} or p[0].numel() > {bw})."
            )
        return _Tiling(shape, rows, cols, bh, bw)

    def _powers(self, values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """``|score| ** p`` of every entry (0 where ``keep`` is False), in the work dtype."""
        work = torch.float64 if _torch.has_float64(values.device) else torch.float32
        powers = values.to(work).abs()
        powers = powers.square() if self.p == 2 else powers if self.p == 1 else powers.pow(self.p)
        return powers if keep is None else torch.where(keep, powers, torch.zeros((), dtype=work))


class _Tiling(NamedTuple):
    """A leaf of ``shape`` as a ``rows x cols`` matrix cut into ``bh x bw`` tiles from its
    top-left corner (a :class:`~fprune.select._executor.Grouping`; tile ids in row-major order)."""

    shape: torch.Size
    rows: int
    cols: int
    bh: int
    bw: int

    @property
    def tr(self) -> int:
        return -(-self.rows // self.bh)

    @property
    def tc(self) -> int:
        return -(-self.cols // self.bw)

    @property
    def n(self) -> int:
        return self.tr * self.tc

    def sum(self, terms: torch.Tensor) -> torch.Tensor:
        return _tiles(terms.reshape(self.rows, self.cols), self.bh, self.bw, self.tr, self.tc)

    def any(self, keep: torch.Tensor) -> torch.Tensor:
        return _tiles(keep.reshape(self.rows, self.cols), self.bh, self.bw, self.tr, self.tc, any_=True)

    def ids(self, positions: torch.Tensor) -> torch.Tensor:
        return (positions // self.cols // self.bh) * self.tc + (positions % self.cols) // self.bw

    def expand(self, keep: torch.Tensor) -> torch.Tensor:
        tr, tc, bh, bw = self.tr, self.tc, self.bh, self.bw
        full = keep.view(tr, 1, tc, 1).expand(tr, bh, tc, bw).reshape(tr * bh, tc * bw)
        return full[: self.rows, : self.cols].reshape(self.shape)


def _tiles(matrix: torch.Tensor, bh: int, bw: int, tr: int, tc: int, any_: bool = False) -> torch.Tensor:
    """Per tile of ``matrix``: the sum of its entries (``any`` with ``any_``), ``(tr, tc)``; the
    matrix is padded with zeros (False) up to whole tiles."""
    rows, cols = matrix.shape
    padded = torch.nn.functional.pad(
        matrix.to(torch.uint8) if any_ else matrix, (0, tc * bw - cols, 0, tr * bh - rows)
    )
    tiles = padded.reshape(tr, bh, tc, bw)
    return tiles.amax(dim=(1, 3)).bool() if any_ else tiles.sum(dim=(1, 3))
