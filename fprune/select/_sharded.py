"""Private: the sharded executor of the selection layer (``DTensor`` leaves), over the agreement,
collectives and radix selects of :mod:`fprune.distributed`, which knows no scope.

:func:`run` takes a call whose leaves are ``DTensor``s: the scope checks ``amount`` (its
``leaf_amounts``), the ranks agree on what they were called with
(:func:`fprune.distributed._backend.prepare`, where an error of those checks is raised on every
rank), the scope's :meth:`~fprune.select.Scope.masks` runs against an :class:`Executor` over this
rank's shards, and the masks come back as DTensors placed like the params. The
:class:`Executor`'s primitives handle whatever splits a group across ranks:

* :meth:`Executor.grouped`: each rank reduces its entries into their groups (a sum or a max, or
  the scope's own reduction where a rank holds whole groups); one ``all_reduce`` per reduction
  gives every rank every group's score, and each rank ranks the groups as one process does;
* :meth:`Executor.within`: groups held whole by a rank are selected locally with the
  single-process program; slices split across ranks by per-group radix selects over the mesh,
  runs of ``m`` split by a shard boundary by exchanging those groups' keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fprune import _amount
from fprune.distributed import _backend, _layout
from fprune.distributed._radix import HIST_BUDGET, POSITION_BUDGET, group_radix, stack_rows
from fprune.select import _engine, _inputs
from fprune.select._executor import Grouped, Masks, Within
from fprune.select._groups import lowest_in_groups

if TYPE_CHECKING:
    from fprune.select._scope import Scope


def involved(inputs: _inputs.Inputs) -> bool:
    """Whether a call's leaves (params, scores or prior masks) are DTensors: this executor's."""
    return _layout.any_dtensor(inputs.params.leaves, inputs.scores, inputs.prior)


def reject(error: BaseException, *trees: Any) -> None:
    """An error found before the selection: with DTensor leaves in ``trees``, every rank of
    their mesh raises (this rank takes part in the agreement with its error); otherwise the
    caller raises it."""
    if _layout.holds_dtensor(*trees):
        _backend.reject(error, *trees)


def run(
    inputs: _inputs.Inputs, score: Callable[[int], Any], amount: Any, scope: Scope, rank: str, source: Any
) -> Any:
    """The masks of ``scope`` over DTensor leaves (every rank makes the same call)."""
    amounts, error = None, None
    try:
        amounts = scope.leaf_amounts(inputs, amount)
    except _backend.CHECKS as caught:
        error = caught
    call = _backend.prepare(inputs, score, amount, _backend.stable_repr(scope), rank, amounts, error)
    return _backend.finish(call, scope.masks(Executor(call, source)))


class Executor:
    """One sharded call: the :class:`fprune.select._executor.Executor` of this rank's shards
    and the mesh (masks of this rank's shards)."""

    def __init__(self, call: _backend.Call, source: Any) -> None:
        self.call = call
        self.inputs = call.inputs
        self.amount = call.amount
        self.amounts = call.amounts
        self.source = source
        self.traced = False

    def pruned(self) -> list[int]:
        return [i for i, a in enumerate(self.amounts) if a is not None]

    def name(self, i: int) -> str:
        return self.inputs.name(i)

    def per_entry(self, leaves: list[int]) -> Masks:
        """Each leaf's amount of its remaining entries over the whole mesh, its lowest keys."""
        call, items = self.call, []
        for i, n_alive in zip(leaves, call.alive(leaves), strict=True):
            leaf = call.leaves[i]
            k = call.count(i, n_alive, leaf.numel, "parameters") + (leaf.numel - n_alive)
            values = call.values(i)
            dtype = _engine.key_dtype([values])
            items.append((leaf, _engine.keys(values, call.prior(i), dtype, self.source), k, dtype))
        return dict(zip(leaves, call.per_leaf(items), strict=True))

    def grouped(self, plan: Grouped) -> Masks:
        """Each rank reduces its entries into their groups (by global group index), into one
        float64 vector per leaf (and one of the kept entries per group, with prior masks); one
        ``all_reduce`` per reduction over the sharded leaves gives every rank every group's
        score, and each rank ranks the groups as one process does and keeps its part of the
        mask. A rank holding whole groups (channels of a leaf sharded only along their dim)
        scores them with the scope's own reduction, as one process does; groups split across
        ranks combine the term's partial sums (or maxes), which may differ from one process's
        scores in the last bits. Group scores given per group (1-d, on every rank) need no
        exchange."""
        call, comm = self.call, self.call.comm
        vectors: dict[str, list] = {"sum": [], "max": [], "local": []}

        def place(vector: torch.Tensor, kind: str) -> tuple[str, int]:
            vectors[kind].append(vector)
            return kind, len(vectors[kind]) - 1

        entries: list[tuple] = []
        for j, (i, g) in enumerate(zip(plan.leaves, plan.groupings, strict=True)):
            leaf, prior, n = call.leaves[i], call.prior(i), g.n
            exchanged = _layout.sharded(leaf)  # a leaf sharded nowhere is whole here
            contribute = (leaf.owned or not exchanged) and leaf.local_numel > 0
            local, ids, whole = _shard(g, leaf, comm.device)
            alive_at = None
            if prior is not None:
                alive = torch.zeros(n, dtype=torch.float64, device=comm.device)
                if contribute:
                    alive[ids] = local.sum(prior.to(torch.float64)).reshape(-1).to(comm.device)
                alive_at = place(alive, "sum" if exchanged else "local")
            if plan.given:
                raw: Any = call.score(i)
                if isinstance(raw, torch.Tensor) and raw.dim() == 1 and raw.shape[0] == n:
                    given: Any = raw  # one score per group: whole on every rank (a DTensor is gathered)
                    if _layout.is_dtensor(given):
                        given = given.full_tensor()
                        comm.stats.collectives += 1
                        comm.stats.bytes += given.numel() * given.element_size()
                    entries.append((j, i, local, ids, None, given, alive_at, False))
                    continue
                values = _layout.localize(leaf, raw, call.mesh, self.inputs.name(i))
            else:
                values = call.values(i)
            if whole:
                scores = plan.scores(i, values, prior, local)
                partial = torch.zeros(n, dtype=torch.float64, device=comm.device)
                if contribute:
                    partial[ids] = scores.to(torch.float64).reshape(-1).to(comm.device)
                score_at = place(partial, "sum" if exchanged else "local")
                entries.append((j, i, local, ids, score_at, scores.dtype, alive_at, False))
                continue
            if plan.split is not None:
                plan.split(i)
            assert plan.term is not None
            use_max = plan.reduce == "max"
            partial = torch.full((n,), -math.inf if use_max else 0.0, dtype=torch.float64, device=comm.device)
            if contribute:
                terms = plan.term(values, prior)
                reduced = local.amax(terms) if use_max else local.sum(terms)
                partial[ids] = reduced.reshape(-1).to(torch.float64).to(comm.device)
            score_at = place(partial, "max" if use_max else "sum")
            entries.append((j, i, local, ids, score_at, values.dtype, alive_at, True))
        summed = {
            "sum": _all_reduce(comm, vectors["sum"], "sum"),
            "max": _all_reduce(comm, vectors["max"], "max"),
            "local": vectors["local"],
        }
        source = self.source if plan.ranked else None
        new = {}
        for j, i, local, ids, score_at, given_or_dtype, alive_at, split in entries:
            leaf, n = call.leaves[i], plan.groupings[j].n
            if score_at is None:
                scores = given_or_dtype
            else:
                scores = summed[score_at[0]][score_at[1]]
                if not split:
                    scores = scores.to(given_or_dtype)
                elif plan.finish is not None:
                    scores = plan.finish(scores, given_or_dtype)
            live = None if alive_at is None else summed[alive_at[0]][alive_at[1]] > 0
            n_alive = n if live is None else int(live.sum())
            k = call.count(i, n_alive, n, plan.what, plan.name(self, j)) + (n - n_alive)
            live = None if live is None else live.to(scores.device)
            key_fn = _engine.keys(scores, live, _engine.key_dtype([scores]), source)
            (keep,) = _engine.prune_lowest([(n, key_fn)], k, traced=False, device=scores.device)
            mask = local.expand(keep[ids.to(keep.device)].to(leaf.local.device))
            prior = call.prior(i)
            new[i] = mask.contiguous() if prior is None else mask & prior
        return new

    def within(self, plan: Within) -> Masks:
        """Groups held whole by this rank (slices of a leaf not sharded along another dim; runs
        of ``m`` inside the shard) are selected locally with the single-process program, with no
        communication. Slices split across ranks: per-group kept counts (with prior masks) and
        per-group radix histograms of the keys, then of the tie positions, summed over the mesh
        (a few hundred bytes per split slice, never the parameter). Runs of ``m`` split by a
        shard boundary: the keys of those runs' entries summed into one buffer over the mesh, so
        that every rank selects them whole."""
        if plan.size is None:
            return _within_slices(self.call, plan, self.source)
        return _within_runs(self.call, plan, self.source)

    # The global ranking's primitives.

    def alive(self, leaves: list[int]) -> list[int]:
        return self.call.alive(leaves) if leaves else []

    def count(self, amount: Any, remaining: Any, size: Any) -> Any:
        inputs = self.inputs
        return _backend.settle(_amount.count(amount, remaining, "parameters", inputs.argname, size=size))

    def unchanged(self, leaves: list[int], new: Any) -> Masks | None:
        """Nothing more to prune: the prior masks as new tensors, without a collective."""
        if new != 0:
            return None
        out = {}
        for i in leaves:
            prior, leaf = self.call.prior(i), self.call.leaves[i]
            if prior is None:
                prior = torch.ones(leaf.local_shape, dtype=torch.bool, device=leaf.local.device)
            out[i] = prior.clone()
        return out

    def values(self, leaves: list[int]) -> list[torch.Tensor]:
        return [self.call.values(i) for i in leaves]

    def prior(self, i: int) -> torch.Tensor | None:
        return self.call.prior(i)

    def norms(self, leaves: list[int], values: list, priors: list, order: float, norm_of: Any) -> list:
        """Float64: the sum of the ``order``-th powers of each shard, summed over the mesh."""
        partial: list = []
        for i, v, prior in zip(leaves, values, priors, strict=True):
            if not self.call.leaves[i].owned:
                partial.append(0.0)
                continue
            kept = v if prior is None else torch.where(prior, v, torch.zeros((), dtype=v.dtype))
            partial.append(kept.to(torch.float64).abs().pow(order).sum())
        comm = self.call.comm
        stacked = torch.stack([torch.as_tensor(x, dtype=torch.float64) for x in partial]).to(comm.device)
        return list(comm.all_reduce(stacked).pow(1.0 / order).unbind())

    def lowest_each(self, items: list) -> list:
        leaves = self.call.leaves
        return self.call.per_leaf([(leaves[i], key_fn, k, dtype) for i, key_fn, k, dtype in items])

    def rank_all(
        self,
        leaves: list[int],
        values: list,
        priors: list,
        transforms: list,
        protect: list,
        dtype: torch.dtype,
        k: Any,
        plain: bool,
    ) -> list[torch.Tensor]:
        shards = self.call.leaves
        sources = [
            (shards[i], _engine.keys(v, prior, dtype, transform, guard))
            for i, v, prior, transform, guard in zip(leaves, values, priors, transforms, protect, strict=True)
        ]
        return self.call.rank_all(k, sum(shards[i].numel for i in leaves), sources, dtype)

    def emptied(self, alive: list[Any]) -> list[int]:
        return []  # the collapse check reads every rank's masks: left to eager single-process calls


def _all_reduce(comm: Any, parts: list, op: str) -> list:
    if not parts:
        return []
    return list(comm.all_reduce(torch.cat(parts), op).split([t.numel() for t in parts]))


class _Scatter:
    """A shard's entries grouped by their global group ids (any grouping, through its ``ids``)."""

    def __init__(self, ids: torch.Tensor, n: int, shape: tuple) -> None:
        self.ids, self.n, self.shape = ids, n, shape

    def sum(self, terms: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.n, dtype=terms.dtype, device=terms.device)
        return out.index_add_(0, self.ids.to(terms.device), terms.reshape(-1))

    def amax(self, terms: torch.Tensor) -> torch.Tensor:
        out = torch.full((self.n,), -math.inf, dtype=terms.dtype, device=terms.device)
        return out.scatter_reduce_(0, self.ids.to(terms.device), terms.reshape(-1), "amax")

    def expand(self, keep: torch.Tensor) -> torch.Tensor:
        return keep[self.ids.to(keep.device)].reshape(self.shape)


def _shard(grouping: Any, leaf: _layout.Leaf, device: Any) -> tuple[Any, torch.Tensor, bool]:
    """This rank's grouping of its shard of ``leaf``, the global ids of its groups, and whether
    it holds each of them whole (the same answer on every rank)."""
    shard = getattr(grouping, "shard", None)
    if shard is not None:
        local, ids, whole = shard(leaf.shape, leaf.offset, leaf.local_shape, _layout.sharded_dims(leaf))
        return local, ids.to(device), whole
    ids = grouping.ids(leaf.positions(0, leaf.local_numel))
    return _Scatter(ids, grouping.n, leaf.local_shape), torch.arange(grouping.n, device=device), False


# ---------------------------------------------------------------------------------------------
# Within groups: slices along a dim


def _slice_keys(
    leaf: _layout.Leaf,
    values: torch.Tensor,
    prior: torch.Tensor | None,
    d: int,
    dtype: torch.dtype,
    source: Any,
) -> torch.Tensor:
    """This rank's keys of ``values`` as ``(local slices along d, local entries per slice)``, int64."""
    count = leaf.local_shape[d]
    moved_values = values.movedim(d, 0).reshape(count, -1)
    moved_prior = None if prior is None else prior.movedim(d, 0).reshape(count, -1)
    key_fn = _engine.keys(moved_values, moved_prior, dtype, source)
    return key_fn(0, moved_values.numel()).view(count, -1).to(torch.int64)


def _within_slices(call: _backend.Call, plan: Within, source: Any) -> Masks:
    leaves, comm = call.leaves, call.comm
    new: dict = {}
    split: list = []
    least: dict[int, Any] = {}
    for i, d in zip(plan.leaves, plan.dims, strict=True):
        leaf = leaves[i]
        values, prior = call.values(i), call.prior(i)
        dtype = _engine.key_dtype([values])
        keys = _slice_keys(leaf, values, prior, d, dtype, source)
        size = leaf.numel // leaf.shape[d] if leaf.shape[d] else 0
        if _layout.split_along(leaf, d):
            split.append((i, leaf, d, size, keys, prior, dtype))
            continue
        # Whole slices here: the single-process program on this rank's slices.
        count = leaf.local_shape[d]
        if prior is None:
            alive = torch.full((count,), size, dtype=torch.int64)
        else:
            alive = prior.movedim(d, 0).reshape(count, -1).sum(-1)
        k = plan.counts(i, alive, size)
        if i in plan.limited:
            least[i] = int(alive.min()) if alive.numel() else None
        keep = lowest_in_groups(keys, k)
        new[i] = keep.reshape(leaf.local.movedim(d, 0).shape).movedim(0, d).contiguous()
    # The fewest entries kept over every rank's slices (sharded leaves only: one int per leaf).
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
        new.update(_split_slices(call, plan, split, least))
    for i, value in least.items():
        if value is not None and plan.check is not None:
            plan.check(i, value)
    return new


def _split_slices(call: _backend.Call, plan: Within, split: list, least: dict) -> Masks:
    """Slices split across ranks: per-slice radix selects, batched over every such leaf."""
    comm = call.comm
    device = comm.device
    firsts, total = [], 0
    for _i, leaf, d, *_ in split:
        firsts.append(total)
        total += leaf.shape[d]
    # Kept entries per global slice (summed over ranks; only with prior masks).
    if any(entry[5] is not None for entry in split):
        counts = torch.zeros(total, dtype=torch.int64, device=device)
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
        if i in plan.limited:
            least[i] = int(alive.min()) if count else None
        k = plan.counts(i, alive, size)
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


# ---------------------------------------------------------------------------------------------
# Within groups: runs of m consecutive entries along a dim


def _within_runs(call: _backend.Call, plan: Within, source: Any) -> Masks:
    leaves = call.leaves
    m = plan.size
    assert m is not None
    new, exchanges = {}, []
    for i, d in zip(plan.leaves, plan.dims, strict=True):
        leaf = leaves[i]
        values, prior = call.values(i), call.prior(i)
        dtype = _engine.key_dtype([values])
        moved = tuple(leaf.local.movedim(d, -1).shape)
        lines, length = math.prod(moved[:-1]), moved[-1]
        live = None if prior is None else prior.movedim(d, -1).reshape(lines, length)
        key_fn = _engine.keys(values.movedim(d, -1).reshape(lines, length), live, dtype, source)
        keys = key_fn(0, lines * length).view(lines, length)
        keep = torch.ones(lines, length, dtype=torch.bool, device=leaf.local.device)
        start = leaf.offset[d]
        # Whole runs of this shard: the single-process program on them.
        first = -(-start // m) * m - start
        last = max(first, ((start + length) // m) * m - start)
        if last > first:
            block = keys[:, first:last].reshape(lines, -1, m)
            keep[:, first:last] = _runs_keep(plan, i, block).reshape(lines, -1)
        # Runs that shard boundaries along d split (the same set on every rank).
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
        new[i] = (keep, moved, d)
    if exchanges:
        _exchange_runs(call.comm, plan, exchanges)
    return {i: keep.reshape(moved).movedim(-1, d).contiguous() for i, (keep, moved, d) in new.items()}


def _runs_keep(plan: Within, i: int, keys: torch.Tensor) -> torch.Tensor:
    """Keep-masks of whole runs ``keys[..., m]`` as one process selects them (entries prior masks
    pruned hold the pruned key)."""
    m = keys.shape[-1]
    alive = (keys != _engine.pruned_key(torch.int32 if keys.dtype == torch.int32 else torch.int64)).sum(-1)
    return lowest_in_groups(keys, plan.counts(i, alive, m))


def _exchange_runs(comm: Any, plan: Within, exchanges: list) -> None:
    """Runs split by shard boundaries: the keys of their entries, summed over ranks into one buffer."""
    m = plan.size
    assert m is not None
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
    for base, (i, leaf, d, _keys, keep, split, key_dtype), slots in zip(
        layout, exchanges, placed, strict=True
    ):
        full_lines = leaf.numel // leaf.shape[d]
        groups = buffer[base : base + full_lines * len(split) * m].view(-1, m).to(key_dtype)
        decided = _runs_keep(plan, i, groups).reshape(-1)
        for local, index in slots:
            keep[:, local] = decided[index - base].to(keep.device)
