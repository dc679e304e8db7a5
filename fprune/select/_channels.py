"""Private: the :class:`Channels` scope (whole slices along a dim, ranked per leaf).

Its plan is a :class:`~fprune.select._executor.Grouped` one: each leaf's channels (a
:class:`_Slices` grouping), scored by a norm of their entries' scores (``torch.norm``, or the
callable ``reduce``) or given one score per channel; where a sharded leaf splits its channels
across ranks, a numeric norm order is the sum (or max) of per-entry terms, finished by the root.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch

from fprune.select import _groups, _inputs
from fprune.select._executor import Batch, Executor, Grouped
from fprune.select._groups import Reduce
from fprune.select._scope import Scope

_STRUCTURED_HINT = "leave such leaves out with where=lambda name, p: p.dim() > 1."


@dataclass(frozen=True)
class Channels(Scope):
    """Per leaf, the channels along ``dim`` (slices ``leaf.select(dim, c)``) are pruned whole.

    ``amount`` counts channels: a channel is alive while prior masks keep any of its entries.
    ``rank`` applies to the channel scores (norms are never negative: both ranks agree).

    Args:
        dim: the dim that indexes channels (``0``: output channels of conv/linear weights).
        reduce: how a channel's score comes from its entries' scores: a norm order as
            ``torch.norm``'s ``p`` (a number, ``inf``, ``-inf``, ``'fro'``, ``'nuc'``), or a
            callable ``(scores, other_dims) -> channel_scores``. A score function may also give
            one score per channel directly (a 1-d tensor of length ``leaf.shape[dim]``), which
            is used as it is.
    """

    reduces = True
    group_scores = "one score per channel"

    dim: int
    reduce: Reduce = 2

    def __post_init__(self) -> None:
        reduce = self.reduce
        if reduce is None or callable(reduce) or isinstance(reduce, str):
            if isinstance(reduce, str) and reduce not in ("fro", "nuc"):
                raise ValueError(
                    f"Expected reduce to be a norm order (a number, inf, -inf, 'fro', 'nuc') or a "
                    f"callable, got {reduce!r}."
                )
            return
        if isinstance(reduce, bool) or not isinstance(reduce, numbers.Real):
            raise TypeError(
                f"Expected reduce to be a norm order (a number, inf, -inf, 'fro', 'nuc') or a "
                f"callable, got {reduce!r}."
            )

    def takes_group_scores(self, scores: torch.Tensor, param: torch.Tensor) -> bool:
        return scores.dim() == 1 and param.dim() > 1

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        """Per leaf, its channels ranked by their scores; every leaf's dim is checked first."""
        leaves, params = ex.pruned(), ex.inputs.params.leaves
        by_ndim: dict[int, int] = {}  # the dim, checked once per number of dims (in leaf order)
        dims = []
        for i in leaves:
            ndim = params[i].dim()
            d = by_ndim.get(ndim)
            if d is None:
                d = by_ndim[ndim] = _inputs.check_dim(
                    self.dim, params[i], f" at {ex.name(i)}", _STRUCTURED_HINT
                )
            dims.append(d)
        reduce = self.reduce
        numeric = isinstance(reduce, numbers.Real) and not isinstance(reduce, bool)
        order = 2.0 if reduce == "fro" else float(cast(float, reduce)) if numeric else None
        names = [f"{ex.name(i)} along dim {d}" for i, d in zip(leaves, dims, strict=True)]
        groupings = [_Slices(tuple(params[i].shape), d) for i, d in zip(leaves, dims, strict=True)]
        by_leaf = dict(zip(leaves, zip(dims, names, strict=True), strict=True))

        def score(i: int, values: torch.Tensor, prior: Any, grouping: _Slices) -> torch.Tensor:
            return _groups.channel_scores(values, grouping.shape, grouping.d, reduce, by_leaf[i][1])

        def split(i: int) -> None:  # channels split across ranks: only a numeric norm order
            d = by_leaf[i][0]
            if reduce is None:
                raise ValueError(
                    f"Channels(reduce=None) takes one score per channel, shape "
                    f"({params[i].shape[d]},); got the full shape {tuple(params[i].shape)} for {ex.name(i)}."
                )
            if order is None or reduce == "nuc":
                raise NotImplementedError(
                    f"Channels(reduce={reduce!r}) on DTensors needs whole channels on each rank, but "
                    f"{ex.name(i)} is sharded along a dim other than {d} (placements "
                    f"{tuple(params[i].placements)}): its channels are split across ranks. Shard it "
                    f"along dim {d} (or replicate it), or reduce with a numeric norm order."
                )

        plan = Grouped(
            leaves,
            groupings,
            None if order is None else _term(order),
            "channels",
            names=names,
            reduce="max" if order is not None and math.isinf(order) else "sum",
            finish=None if order is None else _finish(order, reduce),
            score=score,
            given=True,
            split=split,
            ranked=True,
            # A NaN among a channel's entries makes its norm NaN (any order but 0): the NaN check
            # reads the channel scores, not every entry's (a second pass over the weights otherwise).
            nan=reduce is None or reduce == "fro" or (numeric and reduce != 0),
            # Small leaves in runs when their channel scores come from a norm order or directly.
            batch=_batch(params, dict(zip(leaves, dims, strict=True)), reduce)
            if reduce is None or numeric
            else None,
        )
        return ex.grouped(plan)


def _term(order: float) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """A channel's per-entry term for a norm of ``order`` summed (maxed) across ranks."""

    def term(values: torch.Tensor, prior: Any) -> torch.Tensor:
        if math.isinf(order):
            magnitude = values.abs().to(torch.float64)
            return magnitude if order > 0 else -magnitude
        if order == 0:
            return (values != 0).to(torch.float64)
        return values.to(torch.float64).abs().pow(order)

    return term


def _finish(order: float, reduce: Any) -> Callable[[torch.Tensor, torch.dtype], torch.Tensor]:
    """The norm from its summed (maxed) terms, in ``torch.norm``'s dtype for the scores' dtype."""

    def finish(reduced: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if math.isinf(order):
            reduced = reduced if order > 0 else -reduced
        elif order != 0:
            reduced = reduced.pow(1.0 / order)
        return reduced.to(torch.norm(torch.zeros(1, dtype=dtype), p=reduce).dtype)

    return finish


class _Slices(NamedTuple):
    """The channels of a tensor of ``shape`` along ``d`` (a grouping: channel ids in order)."""

    shape: tuple
    d: int

    @property
    def n(self) -> int:
        return self.shape[self.d]

    @property
    def others(self) -> list[int]:
        return [x for x in range(len(self.shape)) if x != self.d]

    def sum(self, terms: torch.Tensor) -> torch.Tensor:
        return terms.sum(dim=self.others)

    def amax(self, terms: torch.Tensor) -> torch.Tensor:
        return terms.amax(dim=self.others)

    def any(self, keep: torch.Tensor) -> torch.Tensor:
        return keep.any(dim=self.others)

    def ids(self, positions: torch.Tensor) -> torch.Tensor:
        return (positions // math.prod(self.shape[self.d + 1 :])) % self.n

    def expand(self, keep: torch.Tensor) -> torch.Tensor:
        view = [1] * len(self.shape)
        view[self.d] = self.n
        return keep.view(view).expand(self.shape)

    def shard(self, shape: tuple, offset: tuple, local_shape: tuple, sharded: set[int]) -> tuple:
        """A shard's channels: its slices along ``d``, whole unless another dim is sharded."""
        ids = torch.arange(offset[self.d], offset[self.d] + local_shape[self.d])
        return _Slices(tuple(local_shape), self.d), ids, not (sharded - {self.d})


def _batch(params: list, dims: dict[int, int], reduce: Any) -> Batch:
    """Runs of small alike leaves: their channel scores by one norm of the stack."""

    def fits(i: int, values: torch.Tensor) -> bool:
        p, d = params[i], dims[i]
        given = values.dim() == 1 and values.shape[0] == p.shape[d]
        return (values.shape == p.shape or given) and (values.dim() == 1 or reduce is not None)

    def scores(indices: list, values: list) -> torch.Tensor:
        stacked = torch.stack(values)
        if values[0].dim() > 1:
            d = dims[indices[0]]
            others = [x + 1 for x in range(values[0].dim()) if x != d]
            stacked = torch.norm(stacked, p=reduce, dim=others)
        return stacked

    def masks(indices: list, keep: torch.Tensor) -> list:
        p, d = params[indices[0]], dims[indices[0]]
        shape = [len(indices)] + [1] * p.dim()
        shape[d + 1] = p.shape[d]
        return list(keep.view(shape).expand(len(indices), *p.shape).contiguous().unbind(0))

    return Batch(fits, scores, masks)
