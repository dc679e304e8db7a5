"""Private: the selection layer's backend for ``DTensor`` leaves, one entry per scope.

:func:`fprune.select.select_inputs` hands its call here when the params (or scores, or prior
masks) are DTensors, with the scope unpacked: :func:`each`, :func:`global_`, :func:`channels`,
:func:`rows`, :func:`n_m`. Every rank holds its own shard of each leaf and makes the same call;
no parameter is gathered, and the masks are those of the same call on the full tensors in one
process, ties included:

1. **Agreement** (:func:`prepare`). Every rank checks its inputs (every leaf a DTensor on one
   mesh, ``Shard``/``Replicate`` placements, scores and masks placed like the params, the
   scope's checks of ``amount``) and hashes what it was called with (the scope, ``rank``,
   ``amount``, the tree structure, global shapes, dtypes, placements, ``where``'s choice, and
   what a score function says it depends on: ``score.fingerprint()``, a generator's state);
   one tiny ``all_reduce`` compares the hashes. Ranks called differently, or where one rank's
   inputs are invalid, all raise at once instead of waiting in different collectives.
2. **Counts.** The entries (channels, row entries) prior masks keep, summed over the ranks
   where a leaf is sharded: each count is computed from them as in one process
   (:func:`fprune._amount.count`, count rules included).
3. **Scores.** ``score(i)`` is called once per selected leaf, in leaf order, as in one process;
   a DTensor result placed like the leaf gives its local shard, a plain tensor of the full shape
   (draws made on every rank) its slice, and ``score.at(i, positions)`` (where the score
   function has it) the scores of this rank's entries only.
4. **Select** (:mod:`fprune.distributed._radix`). Radix selects over the same integer keys as
   the single-process engine, their histograms summed over the mesh; ties at the threshold are
   split by global row-major position. Rows and N:M groups held whole by a rank, and leaves
   replicated everywhere, are selected locally with the single-process program.
5. **Masks.** Each rank writes its own part and returns DTensors with the params' mesh and
   placements; what the call handed to collectives is kept for
   :func:`fprune.distributed.last_communication`.

docs/distributed.md has what crosses the network, per scope.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from fprune import _amount, _groups, _inputs, _select
from fprune.distributed import _layout
from fprune.distributed._comm import Comm, agree, comm_of, record
from fprune.distributed._radix import (
    HIST_BUDGET,
    POSITION_BUDGET,
    group_radix,
    keep_masks,
    make_ranking,
    per_leaf,
    select_all,
    stack_rows,
)

#: Whether a tree or lists of leaves hold a DTensor (what fprune.select dispatches on).
holds_dtensor = _layout.holds_dtensor
any_dtensor = _layout.any_dtensor

_CHECKS = (TypeError, ValueError, IndexError, NotImplementedError)
_STRUCTURED_HINT = "leave such leaves out with where=lambda name, p: p.dim() > 1."


def stable_repr(value: Any) -> str:
    """``repr(value)`` without memory addresses (the same on every rank for the same value);
    tensors with their values in full (a tensor's own repr rounds them)."""
    if isinstance(value, torch.Tensor):
        return f"tensor({value.tolist()!r}, {value.dtype})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {stable_repr(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}(" + ", ".join(stable_repr(v) for v in value) + ")"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def reject(error: BaseException, *trees: Any) -> None:
    """Raise ``error`` on this rank and make every other rank of the DTensors' mesh raise too.

    For an error found before the selection's own agreement (in the checks of a mask function's
    arguments): this rank takes part in the agreement's collective with its error, which the
    other ranks' :func:`prepare` reads as "another rank rejected its inputs".
    """
    mesh = _layout.first_mesh(*trees)
    agree(comm_of(mesh), "", error, "fprune's selection")


@dataclass
class Call:
    """One sharded selection after the agreement: what every scope's entry needs."""

    mesh: Any
    comm: Comm
    inputs: _inputs.Inputs
    leaves: list  # a _layout.Leaf per leaf of params
    amounts: list  # one amount per leaf, None where the leaf is not pruned
    score: Callable[[int], Any]

    def values(self, i: int) -> torch.Tensor:
        """This rank's part of leaf ``i``'s scores (``score(i)``, or ``score.at`` where given)."""
        leaf = self.leaves[i]
        at = getattr(self.score, "at", None)
        if callable(at):
            positions = leaf.positions(0, leaf.local_numel)
            return at(i, positions).reshape(leaf.local_shape)
        return _layout.localize(leaf, self.score(i), self.mesh, self.inputs.name(i))

    def prior(self, i: int) -> torch.Tensor | None:
        return _layout.local_bool(self.inputs.prior[i])


def prepare(
    inputs: _inputs.Inputs,
    score: Callable[[int], Any],
    amount: Any,
    scope: str,
    rank: str,
    leaf_amounts: Callable[[_inputs.Inputs], list],
) -> Call:
    """Check a sharded call on every rank and compare the ranks' inputs (one collective).

    ``scope`` describes the scope (its ``repr``) and ``rank`` the ranking, for the comparison;
    ``leaf_amounts(inputs)`` runs the scope's checks of ``amount`` and returns one amount per
    leaf. Every error of these checks is raised on every rank.
    """
    flat = inputs.params
    mesh = _layout.first_mesh(flat.leaves, inputs.scores, inputs.prior)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"fprune's selection: this rank is not part of the DTensors' mesh {mesh}.")
    comm = comm_of(mesh)
    error, call, description = None, None, ""
    try:
        _layout.check_leaves(
            flat, {"importance_scores": inputs.scores, "masks": inputs.prior}, mesh, inputs.argname
        )
        if inputs.traced:
            raise NotImplementedError(
                "fprune's selection on DTensors runs eagerly only (not under vmap, grad or torch.compile)."
            )
        amounts = leaf_amounts(inputs)
        layouts: dict = {}
        leaves = [_layout.Leaf(i, p, mesh, coordinate, layouts) for i, p in enumerate(flat.leaves)]
        fingerprint = getattr(score, "fingerprint", None)
        parts = [
            scope,
            rank,
            stable_repr(amount),
            fingerprint() if callable(fingerprint) else "",
            str(flat.spec),
        ]
        for i, p in enumerate(flat.leaves):
            parts.append(
                f"{tuple(p.shape)}|{p.dtype}|{tuple(p.placements)}|{inputs.chosen[i]}|"
                f"{inputs.scores[i] is not None}|{inputs.prior[i] is not None}"
            )
        description = ";".join(parts)
        call = Call(mesh, comm, inputs, leaves, amounts, score)
    except _CHECKS as caught:
        error = caught
    agree(comm, description, error, "fprune's selection")
    assert call is not None
    return call


def finish(call: Call, keeps: dict) -> Any:
    """The mask tree: this rank's keep-masks as DTensors placed like the params."""
    new = {i: call.leaves[i].dtensor(keep, call.mesh) for i, keep in keeps.items()}
    record(call.comm.stats)
    return _inputs.finish(call.inputs, new)


def _int(x: Any) -> Any:
    return int(x) if isinstance(x, torch.Tensor) and x.dim() == 0 else x


def _count(call: Call, i: int, remaining: Any, size: Any, what: str, where: str = "") -> Any:
    """Leaf ``i``'s count to prune among ``remaining`` (as in one process), an int where it is one."""
    name = where or call.inputs.name(i)
    return _int(_amount.count(call.amounts[i], remaining, what, name, size=size))


def _alive_each(call: Call, indices: Sequence[int]) -> list[int]:
    """Entries the prior masks keep, per leaf: summed over ranks only for sharded leaves with a
    prior mask (int32 counts while they fit); the others are known without communication."""
    counts: list = []
    exchanged = []
    for i in indices:
        prior, leaf = call.prior(i), call.leaves[i]
        if prior is None:
            counts.append(leaf.numel)
        elif not _layout.sharded(leaf):
            counts.append(int(prior.sum()))
        else:
            counts.append(None)
            exchanged.append((len(counts) - 1, int(prior.sum()) if leaf.owned else 0, leaf.numel))
    if exchanged:
        dtype = torch.int32 if max(n for *_, n in exchanged) < 2**31 else torch.int64
        sent = torch.tensor([c for _, c, _ in exchanged], dtype=dtype, device=call.comm.device)
        for (j, _, _), value in zip(exchanged, call.comm.all_reduce(sent).tolist(), strict=True):
            counts[j] = int(value)
    return counts


# ----------------------------------------------------------------------------- EACH


def each(call: Call, source: Any) -> dict:
    """The ``EACH`` scope: each chosen leaf's count over the whole mesh, then its ``k`` lowest."""
    amounts = call.amounts
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    alive = _alive_each(call, chosen) if chosen else []
    items = []
    for i, n_alive in zip(chosen, alive, strict=True):
        leaf = call.leaves[i]
        k = _count(call, i, n_alive, leaf.numel, "parameters") + (leaf.numel - n_alive)
        values = call.values(i)
        dtype = _select.key_dtype([values])
        items.append((leaf, _select.keys(values, call.prior(i), dtype, source), k, dtype))
    return dict(zip(chosen, per_leaf(call.comm, items), strict=True))


# ----------------------------------------------------------------------------- Global


def global_(call: Call, amount: Any, norm: float | None, min_keep: Any, source: Any) -> dict:
    """The ``Global`` scope: one ranking over every chosen leaf (``norm``: the order of
    ``normalize``, checked; ``min_keep``: the floors, checked)."""
    inputs, leaves = call.inputs, call.leaves
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    sizes = [leaves[i].numel for i in chosen]
    alive = _alive_each(call, chosen) if chosen else []
    total_alive = sum(alive)
    # Counted even over no leaf at all, as in one process.
    new = _int(_amount.count(amount, total_alive, "parameters", inputs.argname, size=sum(sizes)))
    if not chosen:
        return {}
    if new == 0:  # nothing more to prune: the prior masks, new tensors (no collective)
        out = {}
        for i in chosen:
            prior = call.prior(i)
            if prior is None:
                prior = torch.ones(leaves[i].local_shape, dtype=torch.bool, device=leaves[i].local.device)
            out[i] = prior.clone()
        return out
    k = new + (sum(sizes) - total_alive)
    values = [call.values(i) for i in chosen]
    dtype = _select.key_dtype(values)
    priors = [call.prior(i) for i in chosen]
    scales = _norm_scales(call, [leaves[i] for i in chosen], values, priors, norm)
    transforms = [source if norm is None else _scaled(scale, dtype, source) for scale in scales]
    protect: list = [None] * len(chosen)
    if min_keep is not None:
        protect, k = _floors(
            call, chosen, sizes, alive, values, priors, transforms, dtype, k, min_keep, new, amount
        )
    sources = [
        (leaves[i], _select.keys(v, prior, dtype, transform, guard))
        for i, v, prior, transform, guard in zip(chosen, values, priors, transforms, protect, strict=True)
    ]
    ranking = make_ranking(k, sum(sizes), sources, dtype)
    select_all(call.comm, [ranking])
    return dict(zip(chosen, keep_masks(ranking), strict=True))


def _floors(
    call: Call,
    chosen: list[int],
    sizes: list[int],
    alive: list[int],
    values: list[torch.Tensor],
    priors: list[torch.Tensor | None],
    transforms: list[Any],
    dtype: torch.dtype,
    k: int,
    min_keep: int | float,
    new: int,
    amount: Any,
) -> tuple[list[torch.Tensor | None], int]:
    """``min_keep`` over the mesh, as :mod:`fprune.select` computes it in one process: the
    entries among each leaf's own ``n - floor`` lowest are those that may be pruned (per-leaf
    rankings over the mesh); the others are protected."""
    floors = [
        cast(int, min_keep) if isinstance(min_keep, numbers.Integral) else _amount.round_count(min_keep, n)
        for n in sizes
    ]
    prunable = [n - min(a, f) for n, a, f in zip(sizes, alive, floors, strict=True)]
    room = sum(prunable)
    if k > room:
        raise ValueError(
            f"amount={amount} asks for {new} entries but min_keep={min_keep} lets at most "
            f"{room - (sum(sizes) - sum(alive))} of the remaining {sum(alive)} be pruned."
        )
    limited = [j for j, (n, f) in enumerate(zip(sizes, floors, strict=True)) if f > 0 and n > 0]
    items = [
        (call.leaves[chosen[j]], _select.keys(values[j], priors[j], dtype, transforms[j]), prunable[j], dtype)
        for j in limited
    ]
    by_leaf = dict(zip(limited, per_leaf(call.comm, items), strict=True)) if items else {}
    return [by_leaf.get(j) for j in range(len(chosen))], k  # True where kept by its own leaf


def _norm_scales(
    call: Call,
    leaves: list[_layout.Leaf],
    values: list[torch.Tensor],
    priors: list[torch.Tensor | None],
    norm: float | None,
) -> list:
    """Per-leaf norms of the kept scores over the whole mesh (float64), or None without normalize."""
    if norm is None:
        return [None] * len(leaves)
    partial: list = []
    for leaf, v, prior in zip(leaves, values, priors, strict=True):
        if not leaf.owned:
            partial.append(0.0)
            continue
        kept = v if prior is None else torch.where(prior, v, torch.zeros((), dtype=v.dtype))
        partial.append(kept.to(torch.float64).abs().pow(norm).sum())
    stacked = torch.stack([torch.as_tensor(x, dtype=torch.float64) for x in partial]).to(call.comm.device)
    return list(call.comm.all_reduce(stacked).pow(1.0 / norm).unbind())


def _scaled(
    scale: torch.Tensor, key_dtype: torch.dtype, source: Any
) -> Callable[[torch.Tensor], torch.Tensor]:
    # As fprune.select's normalized scores: the same work dtype, clamp and division.
    work = torch.float32 if key_dtype == torch.int32 else torch.float64
    scale = torch.clamp(scale, min=torch.finfo(work).tiny).to(work)
    if source is None:
        return lambda chunk: chunk.to(work) / scale
    return lambda chunk: chunk.to(work).abs() / scale


# ----------------------------------------------------------------------------- Channels


def channels(call: Call, dim: int, reduce: Any, source: Any) -> dict:
    """The ``Channels`` scope: whole channels along ``dim``, ranked by per-channel scores.

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
        k = _count(call, i, n_alive, channels_, "channels", where) + (channels_ - n_alive)
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


# ----------------------------------------------------------------------------- Rows


def rows(call: Call, dim: int, source: Any) -> dict:
    """The ``Rows`` scope: every index along ``dim`` its own group.

    A leaf sharded only along ``dim`` (or replicated) holds whole rows on each rank: they are
    selected locally, as in one process, with no communication. A leaf sharded along another
    dim has rows split across ranks: per-row kept counts (with prior masks) and per-row radix
    histograms of the keys, then of the tie positions, are summed over the mesh (a few hundred
    bytes per split row, never the parameter).
    """
    inputs, leaves, comm, amounts = call.inputs, call.leaves, call.comm, call.amounts
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    dims = {i: _inputs.check_axis(dim, inputs.params.leaves[i], f" at {inputs.name(i)}") for i in chosen}
    new: dict = {}
    split: list = []
    least: dict[int, Any] = {}
    for i in chosen:
        leaf, d = leaves[i], dims[i]
        values = call.values(i)
        prior = call.prior(i)
        dtype = _select.key_dtype([values])
        keys = _row_keys(leaf, values, prior, d, dtype, source)
        size = leaf.numel // leaf.shape[d] if leaf.shape[d] else 0
        if _layout.split_along(leaf, d):
            split.append((i, leaf, d, size, keys, prior, dtype))
            continue
        # Whole rows here: the single-process program on this rank's rows.
        count = leaf.local_shape[d]
        if prior is None:
            alive = torch.full((count,), size, dtype=torch.int64)
        else:
            alive = prior.movedim(d, 0).reshape(count, -1).sum(-1)
        k = _amount.count(amounts[i], alive, "parameters", inputs.name(i), size=size) + (size - alive)
        if isinstance(amounts[i], numbers.Integral):
            least[i] = int(alive.min()) if alive.numel() else None
        keep = _groups.lowest_in_groups(keys, k)
        new[i] = keep.reshape(leaf.local.movedim(d, 0).shape).movedim(0, d).contiguous()
    # The int-amount check over every rank's rows (sharded leaves only: one int per leaf).
    sharded_least = [i for i in least if _layout.sharded(leaves[i])]
    if sharded_least:
        sent = torch.tensor(
            [-(least[i] if least[i] is not None else 2**62) for i in sharded_least],
            dtype=torch.int64,
            device=comm.device,
        )
        for i, v in zip(sharded_least, comm.all_reduce(sent, "max").tolist(), strict=True):
            least[i] = None if -v == 2**62 else -v
    if split:
        new.update(_split_rows(call, split, least))
    for i, value in least.items():
        if value is not None and amounts[i] > value:
            raise ValueError(
                f"amount={amounts[i]} is more than the {value} parameters left to prune in a "
                f"slice of {inputs.name(i)} along dim {dim}; expected a count of at most "
                f"{value} (or a fraction in [0, 1])."
            )
    return new


def _row_keys(
    leaf: _layout.Leaf,
    values: torch.Tensor,
    prior: torch.Tensor | None,
    d: int,
    dtype: torch.dtype,
    source: Any,
) -> torch.Tensor:
    """This rank's keys of ``values`` as ``(local rows along d, local entries per row)``, int64."""
    count = leaf.local_shape[d]
    moved_values = values.movedim(d, 0).reshape(count, -1)
    moved_prior = None if prior is None else prior.movedim(d, 0).reshape(count, -1)
    key_fn = _select.keys(moved_values, moved_prior, dtype, source)
    return key_fn(0, moved_values.numel()).view(count, -1).to(torch.int64)


def _split_rows(call: Call, split: list, least: dict) -> dict:
    """Rows split across ranks: per-row radix selects, batched over every such leaf."""
    inputs, comm, amounts = call.inputs, call.comm, call.amounts
    device = comm.device
    firsts, total_rows = [], 0
    for _i, leaf, d, *_ in split:
        firsts.append(total_rows)
        total_rows += leaf.shape[d]
    # Kept entries per global row (summed over ranks; only with prior masks).
    any_prior = any(entry[5] is not None for entry in split)
    if any_prior:
        counts = torch.zeros(total_rows, dtype=torch.int64, device=device)
        for first, (_i, leaf, d, _size, keys, prior, _) in zip(firsts, split, strict=True):
            start, count = first + leaf.offset[d], leaf.local_shape[d]
            if prior is None:
                if leaf.owned:
                    counts[start : start + count] += keys.shape[1]
            elif leaf.owned and count:
                counts[start : start + count] += prior.movedim(d, 0).reshape(count, -1).sum(-1).to(device)
        count_dtype = torch.int32 if max(entry[3] for entry in split) < 2**31 else torch.int64
        alive_all = comm.all_reduce(counts.to(count_dtype)).to(torch.int64)
    else:
        alive_all = None
    ks, sizes = [], []
    for first, (i, leaf, d, size, _keys, _prior, _) in zip(firsts, split, strict=True):
        count = leaf.shape[d]
        if alive_all is not None:
            alive = alive_all[first : first + count]
        else:
            alive = torch.full((count,), size, dtype=torch.int64, device=device)
        if isinstance(amounts[i], numbers.Integral):
            least[i] = int(alive.min()) if count else None
        k = _amount.count(amounts[i], alive, "parameters", inputs.name(i), size=size) + (size - alive)
        ks.append(torch.as_tensor(k, dtype=torch.int64, device=device).expand(count))
        sizes.append(torch.full((count,), size, dtype=torch.int64, device=device))
    k = torch.cat(ks) if ks else torch.zeros(0, dtype=torch.int64)
    size = torch.cat(sizes)
    k = torch.minimum(k, size)
    keep_all, prune_all = k <= 0, k >= size
    width = 64 if any(entry[6] == torch.int64 for entry in split) else 32
    parts = stack_rows(
        [
            (first + entry[1].offset[entry[2]], entry[4])
            for first, entry in zip(firsts, split, strict=True)
            if entry[1].owned
        ],
        device,
    )
    threshold, below, equal = group_radix(
        comm, parts, k.clamp(min=1), -(1 << (width - 1)), width, HIST_BUDGET, int(size.max()), size
    )
    ties = k - below  # ties to prune, in [1, equal] where selecting
    partial = ~keep_all & ~prune_all & (ties < equal)
    split_position = torch.where(ties >= equal, size, -1)
    if bool(partial.any()):
        pbits = max(1, int(size.max() - 1).bit_length())
        position_parts = []
        for first, (_i, leaf, d, _, keys, *_) in zip(firsts, split, strict=True):
            if not leaf.owned:
                continue
            start, count = first + leaf.offset[d], leaf.local_shape[d]
            positions = _layout.other_positions(leaf, d).unsqueeze(0).expand(count, -1)
            tie = keys == threshold[start : start + count].unsqueeze(1)
            position_parts.append((start, torch.where(tie, positions, 1 << pbits)))
        found, _, _ = group_radix(
            comm,
            stack_rows(position_parts, device),
            ties.clamp(min=1),
            0,
            pbits,
            POSITION_BUDGET,
            int(size.max()),
            equal,
        )
        split_position = torch.where(partial, found, split_position)
    new = {}
    for first, (i, leaf, d, _, keys, *_) in zip(firsts, split, strict=True):
        start, count = first + leaf.offset[d], leaf.local_shape[d]
        sl = slice(start, start + count)
        positions = _layout.other_positions(leaf, d).unsqueeze(0)
        thr = threshold[sl].unsqueeze(1)
        keep = (keys > thr) | ((keys == thr) & (positions > split_position[sl].unsqueeze(1)))
        keep = torch.where(
            keep_all[sl].unsqueeze(1), True, torch.where(prune_all[sl].unsqueeze(1), False, keep)
        )
        new[i] = keep.reshape(leaf.local.movedim(d, 0).shape).movedim(0, d).contiguous()
    return new


# ----------------------------------------------------------------------------- NM


def n_m(call: Call, n: int, m: int, dim: int, source: Any) -> dict:
    """The ``NM`` scope: ``n`` of every ``m`` consecutive entries along ``dim`` kept.

    Groups that lie inside one rank's shard (every group, unless ``dim`` is sharded with shard
    boundaries that are not multiples of ``m``) are selected locally, as in one process, with no
    communication. Where a boundary along ``dim`` splits groups, the keys of those groups'
    entries (``m`` per split group and line, the boundary entries only) are summed into one
    buffer over the mesh, so every rank has the whole split groups and selects them as one
    process would.
    """
    inputs, leaves = call.inputs, call.leaves
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    dims = {i: _inputs.check_axis(dim, inputs.params.leaves[i], f" at {inputs.name(i)}") for i in chosen}
    for i in chosen:
        size = leaves[i].shape[dims[i]]
        if size % m:
            raise ValueError(
                f"Expected the size of {inputs.name(i)} along dim {dim}, {size}, to be a "
                f"multiple of m={m} (groups of m consecutive entries)."
            )
    new, exchanges = {}, []
    for i in chosen:
        leaf, d = leaves[i], dims[i]
        values = call.values(i)
        prior = call.prior(i)
        dtype = _select.key_dtype([values])
        moved = tuple(leaf.local.movedim(d, -1).shape)
        lines, length = math.prod(moved[:-1]), moved[-1]
        live = None if prior is None else prior.movedim(d, -1).reshape(lines, length)
        key_fn = _select.keys(values.movedim(d, -1).reshape(lines, length), live, dtype, source)
        keys = key_fn(0, lines * length).view(lines, length)
        keep = torch.ones(lines, length, dtype=torch.bool, device=leaf.local.device)
        start = leaf.offset[d]
        # Whole groups of this shard: the single-process program on them.
        first = -(-start // m) * m - start
        last = max(first, ((start + length) // m) * m - start)
        if last > first:
            block = keys[:, first:last].reshape(lines, -1, m)
            keep[:, first:last] = _nm_keep(block, n, m).reshape(lines, -1)
        # Groups that shard boundaries along dim split (the same set on every rank).
        bounds = _layout.shards_along(leaf, call.mesh, d)
        split = sorted(
            {
                b // m
                for offset, size in bounds
                if size
                for b in (offset, offset + size)
                if b % m and 0 < b < leaf.shape[d]
            }
        )
        if split:
            exchanges.append((i, leaf, d, keys, keep, split, dtype))
        new[i] = (keep, moved)
    if exchanges:
        _exchange_groups(call.comm, exchanges, n, m)
    return {i: keep.reshape(moved).movedim(-1, dims[i]).contiguous() for i, (keep, moved) in new.items()}


def _nm_keep(keys: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep-masks of whole groups ``keys[..., m]`` as one process selects them (prior masks: the
    entries with the pruned key are pruned first and a group keeps ``min(n, alive)``)."""
    alive = (keys != _select.pruned_key(torch.int32 if keys.dtype == torch.int32 else torch.int64)).sum(-1)
    return _groups.lowest_in_groups(keys, m - torch.clamp(alive, max=n))


def _exchange_groups(comm: Comm, exchanges: list, n: int, m: int) -> None:
    """Split N:M groups: the keys of their entries, summed over ranks into one buffer."""
    device = comm.device
    layout, total = [], 0
    for _i, leaf, d, _keys, _keep, split, _dtype in exchanges:
        full_lines = leaf.numel // leaf.shape[d]
        layout.append(total)
        total += full_lines * len(split) * m
    dtype = torch.int64 if any(e[6] == torch.int64 for e in exchanges) else torch.int32
    buffer = torch.zeros(total, dtype=dtype, device=device)
    placed = []
    for base, (_i, leaf, d, keys, _keep, split, _) in zip(layout, exchanges, strict=True):
        lines = _layout.other_positions(leaf, d).to(device)  # global line of each local line
        start, length = leaf.offset[d], leaf.local_shape[d]
        slots = []
        for s, g in enumerate(split):
            lo, hi = max(start, g * m), min(start + length, (g + 1) * m)
            if lo >= hi:
                continue
            local = slice(lo - start, hi - start)
            index = (
                base
                + (lines.unsqueeze(1) * len(split) + s) * m
                + torch.arange(lo - g * m, hi - g * m, device=device)
            )
            slots.append((local, index))
            if leaf.owned:
                buffer[index.reshape(-1)] = keys[:, local].reshape(-1).to(device, dtype)
        placed.append(slots)
    buffer = comm.all_reduce(buffer)
    for base, (_i, leaf, d, _keys, keep, split, key_dtype), slots in zip(
        layout, exchanges, placed, strict=True
    ):
        full_lines = leaf.numel // leaf.shape[d]
        groups = buffer[base : base + full_lines * len(split) * m].view(-1, m).to(key_dtype)
        decided = _nm_keep(groups, n, m).reshape(-1)
        for local, index in slots:
            keep[:, local] = decided[index - base].to(keep.device)
