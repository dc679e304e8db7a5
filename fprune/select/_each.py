"""Private: the :class:`Each` scope (every leaf on its own)."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _amount, _inputs, _select
from fprune.distributed._backend import Call
from fprune.select import _local
from fprune.select._scope import Scope


@dataclass(frozen=True)
class Each(Scope):
    """Every leaf on its own: ``amount`` of each leaf's remaining entries are pruned."""

    def local(self, run: _local.Run) -> dict[int, torch.Tensor]:
        inputs, score, amounts, source = run.inputs, run.score, run.amounts, run.source
        leaves, traced = inputs.params.leaves, inputs.traced
        chosen = run.chosen()
        # Small leaves without prior masks and with a Python amount go in runs (see LeafRuns); the
        # others, one by one, to the engine.
        fast = [] if traced else [_local.in_runs(leaves[i], inputs.prior[i], amounts[i]) for i in chosen]
        slow = [i for i, f in zip(chosen, fast or [False] * len(chosen), strict=True) if not f]
        sizes = {i: leaves[i].numel() for i in slow}
        alive = dict(
            zip(
                slow,
                _inputs.remaining_all([inputs.prior[i] for i in slow], list(sizes.values()), traced),
                strict=True,
            )
        )
        ks: dict[int, Any] = {}
        counted: dict[tuple, Any] = {}
        for i in chosen:  # in leaf order, so that the first leaf whose count is wrong is named
            a = amounts[i]
            if i in sizes:
                n, left = sizes[i], alive[i]
                ks[i] = _amount.count(a, left, "parameters", inputs.name(i), size=n) + (n - left)
                continue
            n = leaves[i].numel()
            signature = (isinstance(a, numbers.Integral), a, n)
            k = counted.get(signature)
            if k is None:
                k = counted[signature] = _amount.count(a, n, "parameters", inputs.name(i), size=n)
            ks[i] = k
        new: dict[int, torch.Tensor] = {}
        rows = _local.LeafRuns(_each_keys(source), _each_masks(new))
        # Pass the leaves to the engine in batches as their scores are made, so that scores made
        # on the fly are dropped once their batch is selected.
        keeps: list = []
        pending: list = []
        done: list = []
        pending_size = 0
        for i in chosen:
            values = score(i)
            if i not in sizes and values.shape == leaves[i].shape:
                rows.add(i, values, ks[i])
                continue
            n = leaves[i].numel()
            key_fn = _select.keys(values, inputs.prior[i], _select.key_dtype([values]), source)
            pending.append((n, key_fn, ks[i], leaves[i].device, values))
            done.append(i)
            pending_size += n
            if pending_size >= _local.BATCH:
                keeps += _local.prune_each(pending, traced)
                pending, pending_size = [], 0
        keeps += _local.prune_each(pending, traced)
        for i, values in rows.finish():  # scores that a transform batched: the traced path
            key_fn = _select.keys(values, None, _select.key_dtype([values]), source)
            keeps += _local.prune_each([(leaves[i].numel(), key_fn, ks[i], leaves[i].device, values)], True)
            done.append(i)
        new.update((i, keep.view(leaves[i].shape)) for i, keep in zip(done, keeps, strict=True))
        return new

    def sharded(self, call: Call, source: Any) -> dict[int, torch.Tensor]:
        """Each chosen leaf's count over the whole mesh, then its ``k`` lowest."""
        chosen = [i for i, a in enumerate(call.amounts) if a is not None]
        items = []
        for i, n_alive in zip(chosen, call.alive(chosen), strict=True):
            leaf = call.leaves[i]
            k = call.count(i, n_alive, leaf.numel, "parameters") + (leaf.numel - n_alive)
            values = call.values(i)
            dtype = _select.key_dtype([values])
            items.append((leaf, _select.keys(values, call.prior(i), dtype, source), k, dtype))
        return dict(zip(chosen, call.per_leaf(items), strict=True))


#: The per-leaf scope.
EACH = Each()


def _each_keys(source: Any) -> Callable[[list, list], torch.Tensor]:
    def make(indices: list, values: list) -> torch.Tensor:
        stacked = torch.stack(values).reshape(len(values), -1)
        dtype = _select.key_dtype(values[:1])
        key = torch.empty(stacked.shape, dtype=dtype, device=stacked.device)
        _select.keys(stacked, None, dtype, source).into(0, stacked.numel(), key.view(-1))
        return key

    return make


def _each_masks(new: dict) -> Callable[[list, list, torch.Tensor], None]:
    def masks(indices: list, values: list, keep: torch.Tensor) -> None:
        new.update(zip(indices, keep.view(len(indices), *values[0].shape).unbind(0), strict=True))

    return masks
