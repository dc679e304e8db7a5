"""Private: the :class:`Rows` scope (every index along a dim its own group, with its own count)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _amount, _groups, _inputs, _select
from fprune.distributed import _layout
from fprune.distributed._backend import Call
from fprune.distributed._radix import HIST_BUDGET, POSITION_BUDGET, group_radix, stack_rows
from fprune.select import _local
from fprune.select._scope import Scope


@dataclass(frozen=True)
class Rows(Scope):
    """Per leaf, every index along ``dim`` is its own group (the slice ``leaf.select(dim, r)``).

    Each slice loses ``amount`` of its own remaining entries (a fraction: ``round(amount *
    remaining)``; an int: that count in every slice). One tensor program whatever the path (a
    stable sort per row).
    """

    dim: int = 0

    def local(self, run: _local.Run) -> dict[int, torch.Tensor]:
        inputs, amounts = run.inputs, run.amounts
        flat = inputs.params
        chosen = run.chosen()
        dims = {i: _inputs.check_axis(self.dim, flat.leaves[i], f" at {inputs.name(i)}") for i in chosen}
        # Every leaf's keys as (rows, row size), and how many to prune in each row.
        plans = []
        for i in chosen:
            p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
            moved = p.movedim(d, 0).shape
            shape = (moved[0], p.numel() // moved[0] if moved[0] else 0)
            live = None if prior is None else prior.movedim(d, 0).reshape(shape)
            size = shape[1]
            alive = torch.full(shape[:1], size, device=p.device) if live is None else live.sum(-1)
            k = _amount.count(amounts[i], alive, "parameters", inputs.name(i), size=size) + (size - alive)
            plans.append((i, d, shape, live, alive, k))
        _check_row_counts(inputs, amounts, plans, self)
        new = {}
        for i, d, shape, live, _, k in plans:
            p = flat.leaves[i]
            values = run.score(i)
            dtype = _select.key_dtype([values])
            keys = _select.keys(values.movedim(d, 0).reshape(shape), live, dtype, run.source)
            keep = _groups.lowest_in_groups(keys(0, _local.numel(shape)).view(shape), k)
            new[i] = keep.reshape(p.movedim(d, 0).shape).movedim(0, d).contiguous()
        return new

    def sharded(self, call: Call, source: Any) -> dict[int, torch.Tensor]:
        return _sharded_rows(call, self.dim, source)


def _check_row_counts(inputs: _inputs.Inputs, amounts: list[Any], plans: list, scope: Rows) -> None:
    """An int amount above what a row has left raises (eager code only; one host read)."""
    if inputs.traced:
        return
    checks = [
        (i, alive.min())
        for i, _, _, _, alive, _ in plans
        if isinstance(amounts[i], numbers.Integral) and alive.numel()
    ]
    if not checks:
        return
    smallest = _local.read_each([m for _, m in checks])
    for (i, _), least in zip(checks, smallest, strict=True):
        if amounts[i] > least:
            raise ValueError(
                f"amount={amounts[i]} is more than the {least} parameters left to prune in a "
                f"slice of {inputs.name(i)} along dim {scope.dim}; expected a count of at most "
                f"{least} (or a fraction in [0, 1])."
            )


# ---------------------------------------------------------------------------------------------
# Sharded


def _sharded_rows(call: Call, dim: int, source: Any) -> dict:
    """Every index along ``dim`` its own group, over the mesh.

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
