"""Private: the sharded executor of the selection layer, over :mod:`fprune.distributed`.

:func:`run` takes a call whose leaves are ``DTensor``s: the ranks agree on what they were called
with (:func:`fprune.distributed._backend.prepare`, which runs the scope's checks of ``amount``),
the scope selects this rank's part with the :class:`~fprune.distributed._backend.Call` it gets
(:meth:`~fprune.select.Scope.sharded`), and the masks come back as DTensors placed like the
params. The collectives and radix selects stay in :mod:`fprune.distributed`, which knows no scope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fprune import _amount, _inputs, _select
from fprune.distributed import _backend, _layout
from fprune.select import _local

if TYPE_CHECKING:
    from fprune.select._scope import Grouped, Scope

#: Whether a tree, or lists of leaves, hold a DTensor (what selects this executor).
holds_dtensor = _backend.holds_dtensor
any_dtensor = _backend.any_dtensor
reject = _backend.reject


def run(
    inputs: _inputs.Inputs, score: Callable[[int], Any], amount: Any, scope: Scope, rank: str, source: Any
) -> Any:
    """The masks of ``scope`` over DTensor leaves (every rank makes the same call)."""
    call = _backend.prepare(
        inputs,
        score,
        amount,
        _backend.stable_repr(scope),
        rank,
        lambda checked: scope.leaf_amounts(checked, amount),
    )
    return _backend.finish(call, scope.sharded(call, source))


class Executor:
    """One sharded call as a scope written for both executors sees it (:class:`Global`): the
    members of :class:`fprune.select._local.Executor`, over this rank's shards and the mesh."""

    def __init__(self, call: _backend.Call, source: Any) -> None:
        self.call = call
        self.amount = call.amount
        self.amounts = call.amounts
        self.inputs = call.inputs
        self.source = source
        self.traced = False

    def chosen(self) -> list[int]:
        return [i for i, c in enumerate(self.call.inputs.chosen) if c]

    def pruned(self) -> list[int]:
        """The leaves with an amount (the scope's ``leaf_amounts``), in leaf order."""
        return [i for i, a in enumerate(self.call.amounts) if a is not None]

    def name(self, i: int) -> str:
        return self.call.inputs.name(i)

    def per_entry(self, leaves: list[int]) -> dict[int, torch.Tensor]:
        """Each leaf's amount of its remaining entries over the whole mesh, its lowest keys."""
        call, items = self.call, []
        for i, n_alive in zip(leaves, call.alive(leaves), strict=True):
            leaf = call.leaves[i]
            k = call.count(i, n_alive, leaf.numel, "parameters") + (leaf.numel - n_alive)
            values = call.values(i)
            dtype = _select.key_dtype([values])
            items.append((leaf, _select.keys(values, call.prior(i), dtype, self.source), k, dtype))
        return dict(zip(leaves, call.per_leaf(items), strict=True))

    def grouped(self, plan: Grouped) -> dict[int, torch.Tensor]:
        """The masks of a :class:`~fprune.select._scope.Grouped` plan. Each rank adds its
        entries' terms into their groups by global position; one ``all_reduce`` of those sums
        (and of the kept entries per group, with prior masks) over the sharded leaves gives every
        rank every group's score, and each rank ranks the groups as one process does (sums of a
        group split across ranks may differ from one process's in the last bits) and keeps its
        own part of the mask."""
        call, comm = self.call, self.call.comm
        parts: list = []
        sums: list[tuple[bool, torch.Tensor]] = []
        for i, g in zip(plan.leaves, plan.groupings, strict=True):
            leaf, prior = call.leaves[i], call.prior(i)
            ids = g.ids(leaf.positions(0, leaf.local_numel))
            terms = plan.term(call.values(i), prior).reshape(-1)
            group_sums = torch.zeros(g.n, dtype=terms.dtype, device=terms.device)
            count = torch.zeros(g.n, dtype=terms.dtype, device=terms.device)
            if leaf.owned or not _layout.sharded(leaf):  # each entry counted once over the mesh
                group_sums.index_add_(0, ids, terms)
                if prior is not None:
                    count.index_add_(0, ids, prior.reshape(-1).to(terms.dtype))
            parts.append((i, g.n, ids, prior, len(sums)))
            sums.append((_layout.sharded(leaf), torch.cat([group_sums, count])))
        shared = [t for exchanged, t in sums if exchanged]
        if shared:
            total = comm.all_reduce(torch.cat(shared).to(comm.device)).split([t.numel() for t in shared])
            summed = iter(total)
            sums = [(x, next(summed).to(t.device) if x else t) for x, t in sums]
        new = {}
        for i, n, ids, prior, at in parts:
            scores, count = sums[at][1][:n], sums[at][1][n:]
            live = None if prior is None else count > 0
            left = n if live is None else int(live.sum())
            k = call.count(i, left, n, plan.what) + (n - left)
            key_fn = _select.keys(scores, live, _select.key_dtype([scores]))
            (keep,) = _local.prune_each([(n, key_fn, k, scores.device, scores)], False)
            local = keep[ids].reshape(call.leaves[i].local_shape)
            new[i] = local if prior is None else local & prior
        return new

    def sizes(self, chosen: list[int]) -> list[int]:
        return [self.call.leaves[i].numel for i in chosen]

    def alive(self, chosen: list[int], sizes: list[int]) -> list[int]:
        return self.call.alive(chosen) if chosen else []

    def count(self, amount: Any, remaining: Any, size: Any) -> Any:
        inputs = self.call.inputs
        return _backend.settle(_amount.count(amount, remaining, "parameters", inputs.argname, size=size))

    def unchanged(self, chosen: list[int], new: Any) -> dict | None:
        """Nothing more to prune: the prior masks as new tensors, without a collective."""
        if new != 0:
            return None
        out = {}
        for i in chosen:
            prior, leaf = self.call.prior(i), self.call.leaves[i]
            if prior is None:
                prior = torch.ones(leaf.local_shape, dtype=torch.bool, device=leaf.local.device)
            out[i] = prior.clone()
        return out

    def values(self, chosen: list[int]) -> list[torch.Tensor]:
        return [self.call.values(i) for i in chosen]

    def prior(self, i: int) -> torch.Tensor | None:
        return self.call.prior(i)

    def norm_scales(self, chosen: list[int], values: list, priors: list, norm: float, norm_of: Any) -> list:
        """Each leaf's norm over its kept entries and every rank (float64): the sum of the
        ``norm``-th powers of each shard, summed over the mesh."""
        partial: list = []
        for i, v, prior in zip(chosen, values, priors, strict=True):
            if not self.call.leaves[i].owned:
                partial.append(0.0)
                continue
            kept = v if prior is None else torch.where(prior, v, torch.zeros((), dtype=v.dtype))
            partial.append(kept.to(torch.float64).abs().pow(norm).sum())
        comm = self.call.comm
        stacked = torch.stack([torch.as_tensor(x, dtype=torch.float64) for x in partial]).to(comm.device)
        return list(comm.all_reduce(stacked).pow(1.0 / norm).unbind())

    def each(self, items: list) -> list:
        """Keep-masks of ``(leaf index, key_fn, k, key dtype)`` items, each its ``k`` lowest."""
        leaves = self.call.leaves
        return self.call.per_leaf([(leaves[i], key_fn, k, dtype) for i, key_fn, k, dtype in items])

    def rank_all(
        self,
        chosen: list[int],
        values: list,
        priors: list,
        transforms: list,
        protect: list,
        dtype: torch.dtype,
        k: Any,
        plain: bool,
    ) -> list[torch.Tensor]:
        leaves = self.call.leaves
        sources = [
            (leaves[i], _select.keys(v, prior, dtype, transform, guard))
            for i, v, prior, transform, guard in zip(chosen, values, priors, transforms, protect, strict=True)
        ]
        return self.call.rank_all(k, sum(leaves[i].numel for i in chosen), sources, dtype)

    def emptied(self, alive: list[Any]) -> list[int]:
        return []  # the collapse check reads every rank's masks: left to eager single-process calls
