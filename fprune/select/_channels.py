"""Private: the :class:`Channels` scope (whole slices along a dim, ranked per leaf)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _amount, _groups, _inputs, _select
from fprune._groups import Reduce
from fprune.distributed import _layout
from fprune.distributed._backend import Call, stable_repr
from fprune.select import _local
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

    def local(self, run: _local.Run) -> dict[int, torch.Tensor]:
        return _channels(run.inputs, run.score, run.amounts, self, run.source)

    def sharded(self, call: Call, source: Any) -> dict[int, torch.Tensor]:
        return _sharded_channels(call, self.dim, self.reduce, source)


def _channels(
    inputs: _inputs.Inputs,
    score: Callable[[int], torch.Tensor],
    amounts: list[Any],
    scope: Channels,
    source: Any,
) -> dict[int, torch.Tensor]:
    flat = inputs.params
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    by_ndim: dict[int, int] = {}  # the dim, checked once per number of dims (in leaf order)
    dims = {}
    for i in chosen:
        ndim = flat.leaves[i].dim()
        d = by_ndim.get(ndim)
        if d is None:
            d = by_ndim[ndim] = _inputs.check_dim(
                scope.dim,
                flat.leaves[i],
                f" at {inputs.name(i)}",
                "leave such leaves out with where=lambda name, p: p.dim() > 1.",
            )
        dims[i] = d
    # Leaves in runs (see LeafRuns) when their channel scores come from a norm order or directly.
    reduce = scope.reduce
    batched = not inputs.traced and (
        reduce is None or (isinstance(reduce, numbers.Real) and not isinstance(reduce, bool))
    )
    fast = {i for i in chosen if batched and _local.in_runs(flat.leaves[i], inputs.prior[i], amounts[i])}
    slow = [i for i in chosen if i not in fast]
    alive_channels, sizes = [], []
    for i in slow:
        p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
        others = [x for x in range(p.dim()) if x != d]
        alive_channels.append(None if prior is None else prior.any(dim=others))
        sizes.append(p.shape[d])
    alive = dict(zip(slow, _inputs.remaining_all(alive_channels, sizes, inputs.traced), strict=True))
    live_of = dict(zip(slow, alive_channels, strict=True))
    ks: dict[int, Any] = {}
    counted: dict[tuple, Any] = {}
    for i in chosen:  # in leaf order, so that the first leaf whose count is wrong is named
        channels = flat.leaves[i].shape[dims[i]]
        if i in alive:
            a = alive[i]
            name = f"{inputs.name(i)} along dim {dims[i]}"
            ks[i] = _amount.count(amounts[i], a, "channels", name, size=channels) + (channels - a)
            continue
        signature = (isinstance(amounts[i], numbers.Integral), amounts[i], channels)
        k = counted.get(signature)
        if k is None:
            name = f"{inputs.name(i)} along dim {dims[i]}"
            k = counted[signature] = _amount.count(amounts[i], channels, "channels", name, size=channels)
        ks[i] = k
    new: dict[int, torch.Tensor] = {}
    # A NaN among a channel's entries makes its norm NaN (any order but 0), so the NaN check reads
    # the channel scores, not every entry's (a second pass over the weights otherwise).
    propagates = (
        reduce is None
        or reduce == "fro"
        or (isinstance(reduce, numbers.Real) and not isinstance(reduce, bool) and reduce != 0)
    )
    watch = score if isinstance(score, _inputs.NaNWatch) and propagates else None
    note, raw = (watch.note, watch.raw) if watch is not None else (None, score)
    rows = _local.LeafRuns(
        _channel_keys(flat.leaves, dims, reduce, source, note), _channel_masks(new, flat.leaves, dims)
    )
    pending: list = []
    for i in chosen:
        p, d = flat.leaves[i], dims[i]
        values = raw(i)
        if (
            i in fast
            and (values.shape == p.shape or (values.dim() == 1 and values.shape[0] == p.shape[d]))
            and (values.dim() == 1 or reduce is not None)
        ):
            rows.add(i, values, ks[i], p.shape)
            continue
        values = _groups.channel_scores(values, p, d, reduce, inputs.name(i))
        if note is not None:
            note([i], values)
        live = live_of.get(i)
        key_fn = _select.keys(values, live, _select.key_dtype([values]), source)
        pending.append((i, (p.shape[d], key_fn, ks[i], p.device, values)))
    keeps = _local.prune_each([item for _, item in pending], inputs.traced)
    for (i, _), keep in zip(pending, keeps, strict=True):
        new[i] = _expand_channels(keep, flat.leaves[i], dims[i], inputs.prior[i])
    for i, values in rows.finish():  # scores that a transform batched: the traced path
        p, d = flat.leaves[i], dims[i]
        values = _groups.channel_scores(values, p, d, reduce, inputs.name(i))
        key_fn = _select.keys(values, None, _select.key_dtype([values]), source)
        (keep,) = _local.prune_each([(p.shape[d], key_fn, ks[i], p.device, values)], True)
        new[i] = _expand_channels(keep, p, d, None)
    return new


def _expand_channels(keep: torch.Tensor, p: torch.Tensor, d: int, prior: torch.Tensor | None) -> torch.Tensor:
    shape = [1] * p.dim()
    shape[d] = p.shape[d]
    keep = keep.view(shape).expand(p.shape)
    return keep.contiguous() if prior is None else keep & prior


def _channel_keys(
    leaves: list[torch.Tensor],
    dims: dict[int, int],
    reduce: Any,
    source: Any,
    note: Callable[[list, torch.Tensor], None] | None = None,
) -> Callable[[list, list], torch.Tensor]:
    """Keys of a batch of leaves' channel scores: ``(leaves, channels)``, by one norm of the stack
    (``note(indices, channel scores)`` sees the scores first, when given)."""

    def make(indices: list, values: list) -> torch.Tensor:
        first = values[0]
        stacked = torch.stack(values)
        if first.dim() > 1:
            d = dims[indices[0]]
            others = [x + 1 for x in range(first.dim()) if x != d]
            stacked = torch.norm(stacked, p=reduce, dim=others)
        if note is not None:
            note(indices, stacked)
        dtype = _select.key_dtype([stacked])
        return _select.keys(stacked, None, dtype, source)(0, stacked.numel()).view(stacked.shape)

    return make


def _channel_masks(
    new: dict, leaves: list[torch.Tensor], dims: dict[int, int]
) -> Callable[[list, list, torch.Tensor], None]:
    def masks(indices: list, values: list, keep: torch.Tensor) -> None:
        p, d = leaves[indices[0]], dims[indices[0]]
        shape = [len(indices)] + [1] * p.dim()
        shape[d + 1] = p.shape[d]
        full = keep.view(shape).expand(len(indices), *p.shape).contiguous()
        new.update(zip(indices, full.unbind(0), strict=True))

    return masks


# ---------------------------------------------------------------------------------------------
# Sharded


def _sharded_channels(call: Call, dim: int, reduce: Any, source: Any) -> dict:
    """Whole channels along ``dim``, ranked by per-channel scores.

    Each rank computes the channel scores of its own shard and one ``all_reduce`` of the channel
    vectors (float64, one value per channel of the sharded leaves; one more per channel with
    prior masks: the kept entries) gives every rank every channel's score; each rank then ranks
    the channels as one process does. Scores given per channel (a 1-d tensor, made on every
    rank) need no exchange. Channels held whole by each rank (a leaf sharded only along ``dim``,
    or replicated) are scored locally exactly as in one process (a norm order, or a callable
    ``reduce``); split channels (sharded along another dim) take the norm of the summed partial
    powers (max or min for ``inf``/``-inf``), which may differ from ``torch.norm`` in the last
    bits; a callable ``reduce`` or ``'nuc'`` cannot be split that way and raises.
    """
    inputs, leaves, comm = call.inputs, call.leaves, call.comm
    chosen = [i for i, a in enumerate(call.amounts) if a is not None]
    dims = {
        i: _inputs.check_dim(dim, inputs.params.leaves[i], f" at {inputs.name(i)}", _STRUCTURED_HINT)
        for i in chosen
    }
    sums: list = []
    maxes: list = []
    locals_: list = []

    def place(vector: torch.Tensor, kind: str) -> tuple[str, int]:  # summed, maxed, or kept here
        target = {"sum": sums, "max": maxes, "local": locals_}[kind]
        target.append(vector)
        return kind, len(target) - 1

    plans: list = []
    for i in chosen:
        leaf, d = leaves[i], dims[i]
        name = f"{inputs.name(i)} along dim {d}"
        channels_, start, local_count = leaf.shape[d], leaf.offset[d], leaf.local_shape[d]
        others = [x for x in range(len(leaf.shape)) if x != d]
        prior = call.prior(i)
        exchanged = _layout.sharded(leaf)  # a leaf sharded nowhere is whole here
        contribute = (leaf.owned or not exchanged) and leaf.local_numel > 0
        alive_at = None
        if prior is not None:
            alive = torch.zeros(channels_, dtype=torch.float64, device=comm.device)
            if contribute:
                alive[start : start + local_count] = prior.sum(dim=others).to(torch.float64).to(comm.device)
            alive_at = place(alive, "sum" if exchanged else "local")
        raw: Any = call.score(i)
        if isinstance(raw, torch.Tensor) and raw.dim() == 1 and raw.shape[0] == channels_:
            # One score per channel, given: whole on every rank (a DTensor is gathered).
            given: Any = raw
            if _layout.is_dtensor(given):
                given = given.full_tensor()
                comm.stats.collectives += 1
                comm.stats.bytes += given.numel() * given.element_size()
            plans.append((i, d, None, given, alive_at, None, False))
            continue
        values = _layout.localize(leaf, raw, call.mesh, inputs.name(i))
        if reduce is None:
            raise ValueError(
                f"Channels(reduce=None) takes one score per channel, shape ({channels_},); got "
                f"the full shape {leaf.shape} for {inputs.name(i)}."
            )
        whole = not _layout.split_along(leaf, d)
        order = None
        if whole:
            if callable(reduce):
                local = _groups.check_reduced(reduce(values, others), local_count, name)
            else:
                local = torch.norm(values, p=reduce, dim=others)
            score_dtype = local.dtype
            partial = torch.zeros(channels_, dtype=torch.float64, device=comm.device)
            if contribute:
                partial[start : start + local_count] = local.to(torch.float64).to(comm.device)
            score_at = place(partial, "sum" if exchanged else "local")
        else:
            if callable(reduce) or reduce == "nuc":
                raise NotImplementedError(
                    f"Channels(reduce={stable_repr(reduce)}) on DTensors needs whole channels on "
                    f"each rank, but {inputs.name(i)} is sharded along a dim other than {d} "
                    f"(placements {leaf.placements}): its channels are split across ranks. "
                    f"Shard it along dim {d} (or replicate it), or reduce with a numeric norm "
                    f"order."
                )
            order = 2.0 if reduce == "fro" else float(reduce)
            score_dtype = torch.norm(torch.zeros(1, dtype=values.dtype), p=reduce).dtype
            use_max = math.isinf(order)
            partial = torch.full(
                (channels_,), -math.inf if use_max else 0.0, dtype=torch.float64, device=comm.device
            )
            if contribute:
                if use_max:
                    magnitude = values.abs().to(torch.float64)
                    local = magnitude.amax(dim=others) if order > 0 else -magnitude.amin(dim=others)
                elif order == 0:
                    local = (values != 0).sum(dim=others).to(torch.float64)
                else:
                    local = values.to(torch.float64).abs().pow(order).sum(dim=others)
                partial[start : start + local_count] = local.to(comm.device)
            score_at = place(partial, "max" if use_max else "sum")
        plans.append((i, d, score_at, score_dtype, alive_at, order, not whole))
    vectors = {
        "sum": comm.all_reduce(torch.cat(sums)).split([t.numel() for t in sums]) if sums else [],
        "max": comm.all_reduce(torch.cat(maxes), "max").split([t.numel() for t in maxes]) if maxes else [],
        "local": locals_,
    }
    new = {}
    for i, d, score_at, given_or_dtype, alive_at, order, split in plans:
        leaf = leaves[i]
        channels_ = leaf.shape[d]
        if score_at is None:  # given per channel
            scores = given_or_dtype
        else:
            scores = vectors[score_at[0]][score_at[1]]
            if split:
                if math.isinf(order):
                    scores = scores if order > 0 else -scores
                elif order != 0:
                    scores = scores.pow(1.0 / order)
            scores = scores.to(given_or_dtype)
        live = None if alive_at is None else vectors[alive_at[0]][alive_at[1]] > 0
        n_alive = channels_ if live is None else int(live.sum())
        where = f"{inputs.name(i)} along dim {d}"
        k = call.count(i, n_alive, channels_, "channels", where) + (channels_ - n_alive)
        dtype = _select.key_dtype([scores])
        (keep,) = _select.prune_lowest(
            [
                (
                    channels_,
                    _select.keys(scores, None if live is None else live.to(scores.device), dtype, source),
                )
            ],
            k,
            traced=False,
            device=scores.device,
        )
        start, local_count = leaf.offset[d], leaf.local_shape[d]
        shape = [1] * len(leaf.shape)
        shape[d] = local_count
        local = keep[start : start + local_count].to(leaf.local.device).view(shape).expand(leaf.local_shape)
        prior = call.prior(i)
        new[i] = local.contiguous() if prior is None else local & prior
    return new
