"""Private: the :class:`Blocks` scope (the lowest-norm tiles of each matrix), the worked example
of a new scope in docs/selection.md."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _amount, _inputs, _select, _torch
from fprune.distributed import _layout
from fprune.distributed._backend import Call
from fprune.select import _local
from fprune.select._scope import Scope


@dataclass(frozen=True)
class Blocks(Scope):
    """Per leaf, whole tiles of ``shape`` are pruned: the tiles whose scores have the lowest norm.

    A leaf is a matrix: a 2-d leaf as it is, a leaf of more dims as ``(shape[0], rest)`` (a conv
    weight as its ``out_channels x (in_channels * kernel)`` matrix); a leaf of fewer dims raises
    (leave it out with ``where=``). The matrix is cut into tiles of ``shape`` from its top-left
    corner; where a dim is not a multiple of the tile's, the last tiles along it are smaller
    (they hold fewer entries, so their norm tends to be lower). A tile's score is the ``p``-norm
    of its entries' scores (entries that prior masks pruned count as zero), summed in float64
    where the device has it; ``amount`` counts tiles (a tile is alive while prior masks keep any
    of its entries), and ties go to the first tile in row-major order.

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

    def _matrix(self, inputs: _inputs.Inputs, i: int) -> tuple[int, int, int, int]:
        """Leaf ``i`` as a matrix: its rows and columns, and its tiles along each."""
        shape = inputs.params.leaves[i].shape
        if len(shape) < 2:
            raise ValueError(
                f"{self!r} prunes tiles of matrices, but {inputs.name(i)} has shape "
                f"{tuple(shape)}; leave such leaves out with where=lambda name, p: p.dim() > 1."
            )
        rows = shape[0]
        cols = math.prod(shape[1:])
        return rows, cols, -(-rows // self.shape[0]), -(-cols // self.shape[1])

    def _powers(self, values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """``|score| ** p`` of every entry (0 where ``keep`` is False), in the work dtype."""
        work = torch.float64 if _torch.has_float64(values.device) else torch.float32
        powers = values.to(work).abs()
        powers = powers.square() if self.p == 2 else powers if self.p == 1 else powers.pow(self.p)
        return powers if keep is None else torch.where(keep, powers, torch.zeros((), dtype=work))

    def local(self, run: _local.Run) -> dict[int, torch.Tensor]:
        inputs, chosen, (bh, bw) = run.inputs, run.chosen(), self.shape
        plans = []
        for i in chosen:  # every check and count first, in leaf order
            rows, cols, tr, tc = self._matrix(inputs, i)
            prior = inputs.prior[i]
            live = None if prior is None else _tiles(prior.reshape(rows, cols), bh, bw, tr, tc, any_=True)
            plans.append((i, rows, cols, tr, tc, live))
        alive = _inputs.remaining_all([plan[-1] for plan in plans], [p[3] * p[4] for p in plans], run.traced)
        items = []
        for (i, rows, cols, tr, tc, live), left in zip(plans, alive, strict=True):
            n = tr * tc
            name = inputs.name(i)
            k = _amount.count(run.amounts[i], left, "tiles", name, size=n) + (n - left)
            items.append((i, rows, cols, tr, tc, live, k))
        new = {}
        for i, rows, cols, tr, tc, live, k in items:
            prior = inputs.prior[i]
            values = run.score(i).reshape(rows, cols)
            scores = _tiles(
                self._powers(values, None if prior is None else prior.reshape(rows, cols)), bh, bw, tr, tc
            )
            key_fn = _select.keys(scores, live, _select.key_dtype([scores]))
            (keep,) = _local.prune_each([(tr * tc, key_fn, k, scores.device, scores)], run.traced)
            full = keep.view(tr, 1, tc, 1).expand(tr, bh, tc, bw).reshape(tr * bh, tc * bw)[:rows, :cols]
            mask = full.reshape(inputs.params.leaves[i].shape)
            new[i] = mask.contiguous() if prior is None else mask & prior
        return new

    def sharded(self, call: Call, source: Any) -> dict[int, torch.Tensor]:
        """Each rank sums the ``p``-th powers of its entries into their tiles; one ``all_reduce``
        of those sums (and of the kept entries per tile, with prior masks) over the sharded
        leaves gives every rank every tile's score, and each rank ranks the tiles as one process
        does (sums of a tile split across ranks may differ from one process's in the last bits)."""
        inputs, comm, (bh, bw) = call.inputs, call.comm, self.shape
        chosen = [i for i, a in enumerate(call.amounts) if a is not None]
        plans: list = []
        sums: list[tuple[bool, torch.Tensor]] = []
        for i in chosen:
            _, cols, tr, tc = self._matrix(inputs, i)
            leaf, prior = call.leaves[i], call.prior(i)
            positions = leaf.positions(0, leaf.local_numel)
            tile = (positions // cols // bh) * tc + (positions % cols) // bw
            contribute = leaf.owned or not _layout.sharded(leaf)
            powers = self._powers(call.values(i), prior).reshape(-1)
            tile_sums = torch.zeros(tr * tc, dtype=powers.dtype, device=powers.device)
            count = torch.zeros(tr * tc, dtype=powers.dtype, device=powers.device)
            if contribute:
                tile_sums.index_add_(0, tile, powers)
                if prior is not None:
                    count.index_add_(0, tile, prior.reshape(-1).to(powers.dtype))
            plans.append((i, tr, tc, tile, prior, len(sums)))
            sums.append((_layout.sharded(leaf), torch.cat([tile_sums, count])))
        shared = [t for exchanged, t in sums if exchanged]
        if shared:
            total = comm.all_reduce(torch.cat(shared).to(comm.device)).split([t.numel() for t in shared])
            summed = iter(total)
            sums = [(x, next(summed).to(t.device) if x else t) for x, t in sums]
        new = {}
        for i, tr, tc, tile, prior, at in plans:
            n = tr * tc
            scores, count = sums[at][1][:n], sums[at][1][n:]
            live = None if prior is None else count > 0
            left = n if live is None else int(live.sum())
            k = call.count(i, left, n, "tiles") + (n - left)
            key_fn = _select.keys(scores, live, _select.key_dtype([scores]))
            (keep,) = _select.prune_lowest([(n, key_fn)], k, traced=False, device=scores.device)
            local = keep[tile].reshape(call.leaves[i].local_shape)
            new[i] = local if prior is None else local & prior
        return new


def _tiles(matrix: torch.Tensor, bh: int, bw: int, tr: int, tc: int, any_: bool = False) -> torch.Tensor:
    """Per tile of ``matrix``: the sum of its entries (``any`` with ``any_``), ``(tr, tc)``; the
    matrix is padded with zeros (False) up to whole tiles."""
    rows, cols = matrix.shape
    padded = torch.nn.functional.pad(
        matrix.to(torch.uint8) if any_ else matrix, (0, tc * bw - cols, 0, tr * bh - rows)
    )
    tiles = padded.reshape(tr, bh, tc, bw)
    return tiles.amax(dim=(1, 3)).bool() if any_ else tiles.sum(dim=(1, 3))
