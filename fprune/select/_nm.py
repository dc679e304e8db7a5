"""Private: the :class:`NM` scope (``n`` of every ``m`` consecutive entries kept)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _groups, _inputs, _select
from fprune.distributed import _layout
from fprune.distributed._backend import Call
from fprune.distributed._comm import Comm
from fprune.select import _local
from fprune.select._scope import Scope


@dataclass(frozen=True)
class NM(Scope):
    """Per leaf, every group of ``m`` consecutive entries along ``dim`` keeps its ``n`` highest.

    Entries that prior masks pruned stay pruned: a group keeps ``min(n, alive)``. The size of
    a leaf along ``dim`` must be a multiple of ``m``. Takes no ``amount`` (pass ``None``).
    One tensor program whatever the path (a stable sort per group).
    """

    fractional = False

    n: int
    m: int
    dim: int = -1

    def __post_init__(self) -> None:
        for name, value in (("n", self.n), ("m", self.m)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"Expected {name} to be an int, got {value!r}.")
        if self.m < 1:
            raise ValueError(f"Expected m >= 1 (the group size), got m={self.m}.")
        if not 0 <= self.n <= self.m:
            raise ValueError(
                f"Expected 0 <= n <= m (n entries kept in every group of m), got n={self.n}, m={self.m}."
            )

    def leaf_amounts(self, inputs: Any, amount: Any) -> list[Any]:
        if amount is not None:
            raise ValueError(
                f"The NM scope keeps n={self.n} of every {self.m} entries and takes no amount; "
                f"expected amount=None, got {amount!r}."
            )
        return [0 if c else None for c in inputs.chosen]

    def local(self, run: _local.Run) -> dict[int, torch.Tensor]:
        inputs, flat, m = run.inputs, run.inputs.params, self.m
        chosen = run.chosen()
        dims = {i: _inputs.check_axis(self.dim, flat.leaves[i], f" at {inputs.name(i)}") for i in chosen}
        _check_sizes(inputs, chosen, dims, self)
        new = {}
        for i in chosen:
            p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
            moved = p.movedim(d, -1).shape
            shape = (*moved[:-1], moved[-1] // m, m)
            live = None if prior is None else prior.movedim(d, -1).reshape(shape)
            alive = torch.full(shape[:-1], m, device=p.device) if live is None else live.sum(-1)
            k = m - torch.clamp(alive, max=self.n)
            values = run.score(i)
            dtype = _select.key_dtype([values])
            keys = _select.keys(values.movedim(d, -1).reshape(shape), live, dtype, run.source)
            keep = _groups.lowest_in_groups(keys(0, _local.numel(shape)).view(shape), k)
            new[i] = keep.reshape(moved).movedim(-1, d).contiguous()
        return new

    def sharded(self, call: Call, source: Any) -> dict[int, torch.Tensor]:
        return _sharded_n_m(call, self, source)


def _check_sizes(inputs: _inputs.Inputs, chosen: list[int], dims: dict, scope: NM) -> None:
    for i in chosen:
        size = inputs.params.leaves[i].shape[dims[i]]
        if size % scope.m:
            raise ValueError(
                f"Expected the size of {inputs.name(i)} along dim {scope.dim}, {size}, to be a "
                f"multiple of m={scope.m} (groups of m consecutive entries)."
            )


# ---------------------------------------------------------------------------------------------
# Sharded


def _sharded_n_m(call: Call, scope: NM, source: Any) -> dict:
    """``n`` of every ``m`` consecutive entries along ``dim`` kept, over the mesh.

    Groups that lie inside one rank's shard (every group, unless ``dim`` is sharded with shard
    boundaries that are not multiples of ``m``) are selected locally, as in one process, with no
    communication. Where a boundary along ``dim`` splits groups, the keys of those groups'
    entries (``m`` per split group and line, the boundary entries only) are summed into one
    buffer over the mesh, so every rank has the whole split groups and selects them as one
    process would.
    """
    inputs, leaves, n, m = call.inputs, call.leaves, scope.n, scope.m
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    dims = {
        i: _inputs.check_axis(scope.dim, inputs.params.leaves[i], f" at {inputs.name(i)}") for i in chosen
    }
    _check_sizes(inputs, chosen, dims, scope)
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
