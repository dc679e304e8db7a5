"""Private: the local executor of the selection layer, over the engine of :mod:`fprune._select`.

A scope's :meth:`~fprune.select.Scope.local` gets a :class:`Run` (the checked inputs, the score
function, one amount per leaf, the score source) and selects with the routines here:

* :func:`prune_each`: per-leaf selections handed to the engine in batches (by device, at most
  ``BATCH`` entries), the traced path wherever a score tensor is traced;
* :class:`LeafRuns`: many small alike leaves selected together, a row of keys per leaf;
* :func:`lowest`, :func:`lowest_in_rows`: the "k lowest, ties by position" rule on one tensor,
  for code outside the selection layer that holds its scores whole (``fprune.reconstruct``):
  the engine's :func:`fprune._select.prune_lowest` and the per-group program
  :func:`fprune._groups.lowest_in_groups` (``Rows``, ``NM``), not a copy of either.

The global ranking itself is :func:`fprune._select.prune_lowest` (a streaming select that never
concatenates the scores).
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from fprune import _amount, _inputs, _select
from fprune._groups import lowest_in_groups

if TYPE_CHECKING:
    from fprune.select._scope import Grouped


class Run(NamedTuple):
    """One local selection, as a scope's :meth:`~fprune.select.Scope.local` gets it."""

    inputs: _inputs.Inputs
    score: Callable[[int], torch.Tensor]  # a NaNWatch over the method's score function
    amount: Any  # as the caller gave it
    amounts: list  # one per leaf (None: not pruned), from the scope's leaf_amounts
    source: Any  # None (signed values) or fprune._select.MAGNITUDE

    @property
    def traced(self) -> bool:
        return self.inputs.traced

    def chosen(self) -> list[int]:
        """The leaves to prune, in leaf order."""
        return [i for i, a in enumerate(self.amounts) if a is not None]


# Per-leaf selections are handed to the engine in batches of at most this many entries (or one
# leaf), so that scores made on the fly (random draws) are not all held at once.
BATCH = 1 << 24


def prune_each(items: list, traced: bool) -> list:
    """``_select.prune_lowest_each`` over ``(numel, key_fn, k, device, scores)`` items, batched
    by device; the traced path wherever the call is traced or a score tensor is (a score
    function may make batched scores from unbatched params: a batched seed under ``vmap``)."""
    keeps: list = []
    start = 0
    while start < len(items):
        device = items[start][3]
        stop, total = start, 0
        while (
            stop < len(items)
            and items[stop][3] == device
            and (stop == start or total + items[stop][0] <= BATCH)
        ):
            total += items[stop][0]
            stop += 1
        batch = items[start:stop]
        keeps += _select.prune_lowest_each(
            [(numel, key_fn) for numel, key_fn, _, _, _ in batch],
            [k for _, _, k, _, _ in batch],
            traced=traced or _select.is_traced([values for *_, values in batch]),
            device=device,
        )
        start = stop
    return keeps


# Leaves of at most RUN_MAX entries, without prior masks and with a Python amount, are selected
# in runs of alike leaves (one shape, score dtype and device, one count): their scores stacked
# (at most RUN_ENTRIES entries per batch), their keys made, selected along rows and the masks
# split off in one op each. The masks and the tie-break are the engine's. Both limits are read
# from fprune.select (its _RUN_MAX and _RUN_ENTRIES) at each call, where they can be tuned.
RUN_MAX = 1 << 14
RUN_ENTRIES = 1 << 18


def _limit(name: str, default: int) -> int:
    return getattr(sys.modules.get("fprune.select"), name, default)


def in_runs(leaf: torch.Tensor, prior: torch.Tensor | None, amount: Any) -> bool:
    return (
        prior is None
        and isinstance(amount, numbers.Real)
        and not isinstance(amount, torch.Tensor)
        and 0 < leaf.numel() <= _limit("_RUN_MAX", RUN_MAX)
    )


class LeafRuns:
    """Per-leaf selections of many small leaves, batched: a row of keys per leaf.

    ``make_keys(values)`` turns a batch's score tensors (alike) into a ``(rows, n)`` key tensor;
    ``masks(indices, values, keep)`` makes the leaves' masks of the ``(rows, n)`` keep-mask once
    it is final. Rows whose ties at the threshold must be split by position are found with one
    host read for the whole call (:meth:`finish`), and only their batches are computed again.
    """

    def __init__(
        self,
        make_keys: Callable[[list, list], torch.Tensor],
        masks: Callable[[list, list, torch.Tensor], None],
    ) -> None:
        self.make_keys = make_keys
        self.masks = masks
        self.runs: dict[Any, list] = {}
        self.pending: list = []
        self.traced: list = []

    def add(self, i: int, values: torch.Tensor, k: int, shape: torch.Size | None = None) -> None:
        signature = (values.shape, values.dtype, values.device, k, shape)
        run = self.runs.get(signature)
        if run is None:
            run = self.runs[signature] = [
                [],
                [],
                k,
                max(1, _limit("_RUN_ENTRIES", RUN_ENTRIES) // max(1, values.numel())),
            ]
        run[0].append(i)
        run[1].append(values)
        if len(run[0]) >= run[3]:
            self._flush(run)
            del self.runs[signature]

    def _flush(self, run: list) -> None:
        indices, values, k, _ = run
        if _select.is_traced(values):
            self.traced += zip(indices, values, strict=True)
            return
        key = self.make_keys(indices, values)
        keep = torch.empty(key.shape, dtype=torch.bool, device=key.device)
        threshold, split = _select.lowest_in_rows(key, k, keep)
        self.pending.append((indices, values, k, keep, threshold, split))

    def finish(self) -> list:
        """Select every run still open and settle the ties; returns the ``(index, values)`` of
        leaves whose scores a transform batched (for the traced path)."""
        for run in self.runs.values():
            self._flush(run)
        self.runs = {}
        splits = [p[5] for p in self.pending if p[5] is not None]
        flags = iter(torch.stack(splits).tolist() if splits else [])
        for indices, values, k, keep, threshold, split in self.pending:
            if split is not None and next(flags):
                _select.split_rows(self.make_keys(indices, values), threshold, k, keep)
            self.masks(indices, values, keep)
        self.pending = []
        return self.traced


def any_each(tensors: list[torch.Tensor]) -> list[bool]:
    """``[bool(t.any()) for t in tensors]`` with one host read per device."""
    return [bool(found) for found in read_each([t.any() for t in tensors])]


def read_each(scalars: list[torch.Tensor]) -> list:
    """The values of 0-dim tensors as Python numbers, with one host read per device."""
    result: list = [None] * len(scalars)
    by_device: dict[Any, list[int]] = {}
    for j, t in enumerate(scalars):
        by_device.setdefault(t.device, []).append(j)
    for indices in by_device.values():
        for j, value in zip(indices, torch.stack([scalars[j] for j in indices]).tolist(), strict=True):
            result[j] = value
    return result


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------
# The rule on one tensor held whole


def lowest(scores: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """True at the ``k`` lowest ``scores`` (real, any shape; ties: the earlier entry in row-major
    order first), the rule of every scope. ``k`` an int or a 0-dim integer tensor (traced path)."""
    flat = scores.reshape(-1)
    traced = isinstance(k, torch.Tensor) or _select.is_traced([flat])
    dtype = _select.key_dtype([flat])
    (keep,) = _select.prune_lowest(
        [(flat.numel(), _select.keys(flat, None, dtype))], k, traced=traced, device=flat.device
    )
    return ~keep.view(scores.shape)


def lowest_in_rows(scores: torch.Tensor, k: Any) -> torch.Tensor:
    """True at the ``k`` lowest scores of every row (the last dim) of ``scores``; ``k`` an int or
    an integer tensor shaped like ``scores`` without its last dim. Ties: the earlier first."""
    flat = scores.reshape(-1, scores.shape[-1]) if scores.dim() else scores.reshape(1, 1)
    dtype = _select.key_dtype([flat])
    keys = _select.keys(flat, None, dtype)(0, flat.numel()).view(flat.shape)
    k = k.reshape(-1) if isinstance(k, torch.Tensor) and k.dim() else k
    return ~lowest_in_groups(keys, k).view(scores.shape)


# ---------------------------------------------------------------------------------------------
# The executor of a scope written once for both (Global)


class Executor:
    """One local call as a scope written for both executors sees it (:class:`Global`); the
    sharded counterpart is :class:`fprune.select._sharded.Executor`, with the same members."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.inputs = run.inputs
        self.amount = run.amount
        self.source = run.source
        self.amounts = run.amounts
        self.traced = run.inputs.traced
        self._spans: list = []
        self._keeps: list = []

    def chosen(self) -> list[int]:
        return [i for i, c in enumerate(self.inputs.chosen) if c]

    def pruned(self) -> list[int]:
        """The leaves with an amount (the scope's ``leaf_amounts``), in leaf order."""
        return self.run.chosen()

    def name(self, i: int) -> str:
        return self.inputs.name(i)

    def per_entry(self, leaves: list[int]) -> dict[int, torch.Tensor]:
        """Each leaf's amount of its remaining entries, its lowest keys. Small leaves without
        prior masks and with a Python amount go in runs (:class:`LeafRuns`); the others, in leaf
        order, to the engine in batches as their scores are made (:func:`prune_each`), so that
        scores made on the fly are dropped once their batch is selected."""
        inputs, score, amounts, source = self.inputs, self.run.score, self.amounts, self.source
        params, traced = inputs.params.leaves, self.traced
        fast = [] if traced else [in_runs(params[i], inputs.prior[i], amounts[i]) for i in leaves]
        slow = [i for i, f in zip(leaves, fast or [False] * len(leaves), strict=True) if not f]
        sizes = {i: params[i].numel() for i in slow}
        alive = dict(
            zip(
                slow,
                _inputs.remaining_all([inputs.prior[i] for i in slow], list(sizes.values()), traced),
                strict=True,
            )
        )
        ks: dict[int, Any] = {}
        counted: dict[tuple, Any] = {}
        for i in leaves:  # in leaf order, so that the first leaf whose count is wrong is named
            a = amounts[i]
            if i in sizes:
                n, left = sizes[i], alive[i]
                ks[i] = _amount.count(a, left, "parameters", inputs.name(i), size=n) + (n - left)
                continue
            n = params[i].numel()
            signature = (isinstance(a, numbers.Integral), a, n)
            k = counted.get(signature)
            if k is None:
                k = counted[signature] = _amount.count(a, n, "parameters", inputs.name(i), size=n)
            ks[i] = k
        new: dict[int, torch.Tensor] = {}
        rows = LeafRuns(_entry_keys(source), _entry_masks(new))
        keeps: list = []
        pending: list = []
        done: list = []
        pending_size = 0
        for i in leaves:
            values = score(i)
            if i not in sizes and values.shape == params[i].shape:
                rows.add(i, values, ks[i])
                continue
            n = params[i].numel()
            key_fn = _select.keys(values, inputs.prior[i], _select.key_dtype([values]), source)
            pending.append((n, key_fn, ks[i], params[i].device, values))
            done.append(i)
            pending_size += n
            if pending_size >= BATCH:
                keeps += prune_each(pending, traced)
                pending, pending_size = [], 0
        keeps += prune_each(pending, traced)
        for i, values in rows.finish():  # scores that a transform batched: the traced path
            key_fn = _select.keys(values, None, _select.key_dtype([values]), source)
            keeps += prune_each([(params[i].numel(), key_fn, ks[i], params[i].device, values)], True)
            done.append(i)
        new.update((i, keep.view(params[i].shape)) for i, keep in zip(done, keeps, strict=True))
        return new

    def grouped(self, plan: Grouped) -> dict[int, torch.Tensor]:
        """The masks of a :class:`~fprune.select._scope.Grouped` plan: every count first (live
        groups from the prior masks, one host read), then per leaf its scores, the groups' sums
        and their ``k`` lowest (:func:`prune_each`, the traced path where a score is batched)."""
        inputs = self.inputs
        lives: list[torch.Tensor | None] = []
        for i, g in zip(plan.leaves, plan.groupings, strict=True):
            prior = inputs.prior[i]
            lives.append(None if prior is None else g.any(prior))
        alive = _inputs.remaining_all(lives, [g.n for g in plan.groupings], self.traced)
        ks = [
            _amount.count(self.amounts[i], left, plan.what, inputs.name(i), size=g.n) + (g.n - left)
            for i, g, left in zip(plan.leaves, plan.groupings, alive, strict=True)
        ]
        new = {}
        for i, g, live, k in zip(plan.leaves, plan.groupings, lives, ks, strict=True):
            prior = inputs.prior[i]
            sums = g.sum(plan.term(self.run.score(i), prior))
            key_fn = _select.keys(sums, live, _select.key_dtype([sums]))
            (keep,) = prune_each([(g.n, key_fn, k, sums.device, sums)], self.traced)
            mask = g.expand(keep)
            new[i] = mask.contiguous() if prior is None else mask & prior
        return new

    def sizes(self, chosen: list[int]) -> list[int]:
        return [self.inputs.params.leaves[i].numel() for i in chosen]

    def alive(self, chosen: list[int], sizes: list[int]) -> list[Any]:
        return _inputs.remaining_all([self.inputs.prior[i] for i in chosen], sizes, self.traced)

    def count(self, amount: Any, remaining: Any, size: Any) -> Any:
        return _amount.count(amount, remaining, "parameters", self.inputs.argname, size=size)

    def unchanged(self, chosen: list[int], new: Any) -> dict | None:
        return None  # the engine selects a count of 0 without a pass over the scores

    def values(self, chosen: list[int]) -> list[torch.Tensor]:
        values = [self.run.score(i) for i in chosen]
        self.traced = self.traced or _select.is_traced(values)
        return values

    def prior(self, i: int) -> torch.Tensor | None:
        return self.inputs.prior[i]

    def norm_scales(self, chosen: list[int], values: list, priors: list, norm: float, norm_of: Any) -> list:
        """Each leaf's norm over its kept entries: ``norm_of(values, keep, norm)``."""
        return [norm_of(v, prior, norm) for v, prior in zip(values, priors, strict=True)]

    def each(self, items: list) -> list:
        """Flat keep-masks of ``(leaf index, key_fn, k, key dtype)`` items, each its ``k`` lowest."""
        leaves = self.inputs.params.leaves
        return _select.prune_lowest_each(
            [(leaves[i].numel(), key_fn) for i, key_fn, _, _ in items],
            [k for _, _, k, _ in items],
            traced=self.traced,
            device=leaves[items[0][0]].device,
        )

    def rank_all(
        self,
        chosen: list[int],
        values: list[torch.Tensor],
        priors: list,
        transforms: list,
        protect: list,
        dtype: torch.dtype,
        k: Any,
        plain: bool,
    ) -> list[torch.Tensor]:
        """The masks of the ``k`` lowest keys over every chosen leaf: the engine's streaming
        select, with consecutive small alike leaves stacked into one source when ``plain`` (no
        transform but the ranking's, no protected entries)."""
        leaves = self.inputs.params.leaves
        sizes = [leaves[i].numel() for i in chosen]
        if self.traced or not plain:
            spans = [(j, j + 1) for j in range(len(chosen))]
        else:
            spans = _stackable(values, priors)
        sources = []
        for a, b in spans:
            if b - a == 1:
                sources.append(
                    (sizes[a], _select.keys(values[a], priors[a], dtype, transforms[a], protect[a]))
                )
            else:  # consecutive alike small leaves: one source over their stacked scores
                stacked = torch.stack(values[a:b])
                sources.append((sizes[a] * (b - a), _select.keys(stacked, None, dtype, self.source)))
        device = leaves[chosen[0]].device
        keeps = _select.prune_lowest(sources, k, traced=self.traced, device=device)
        self._spans, self._keeps = spans, keeps
        out: list[torch.Tensor] = []
        for (a, b), keep in zip(spans, keeps, strict=True):
            if b - a == 1:
                out.append(keep.view(leaves[chosen[a]].shape))
            else:
                out += keep.view(b - a, *values[a].shape).unbind(0)
        return out

    def emptied(self, alive: list[Any]) -> list[int]:
        """Positions (in ``chosen``) of the leaves the last :meth:`rank_all` pruned whole, that
        had entries left; eager only (one host read, two at most)."""
        if self.traced:
            return []
        candidates, rows = [], []
        for (a, b), keep in zip(self._spans, self._keeps, strict=True):
            if b - a > 1:  # any(1) of a stack, through a uint8 view (a faster reduction than bool's)
                rows.append((a, keep.view(b - a, -1).view(torch.uint8).amax(1)))
            elif alive[a] > 0:
                candidates.append((a, keep))
        emptied, parts = [], [r for _, r in rows]
        if candidates:
            # A prefix of each leaf first: almost always it holds a kept entry, which settles it.
            parts.append(torch.stack([keep[:4096].any() for _, keep in candidates]))
        if parts:
            found = torch.cat(parts).tolist()
            at = 0
            for a, r in rows:
                n = r.numel()
                emptied += [a + x for x, hit in enumerate(found[at : at + n]) if not hit]
                at += n
            suspects = [(j, keep) for (j, keep), hit in zip(candidates, found[at:], strict=True) if not hit]
            if suspects:
                whole = any_each([keep for _, keep in suspects])
                emptied += [j for (j, _), hit in zip(suspects, whole, strict=True) if not hit]
        return sorted(emptied)


def _stackable(values: list[torch.Tensor], prior: list[torch.Tensor | None]) -> list:
    """Spans ``(a, b)`` of the chosen leaves: runs of consecutive small leaves alike (shape, score
    dtype, device, no prior mask), or single leaves. A run is ranked as one source over its
    stacked scores, which keeps the order of the entries (the tie-break) and costs a copy of the
    scores of those small leaves (at most ``RUN_MAX`` entries each) for the call."""
    spans, j, count = [], 0, len(values)
    limit = _limit("_RUN_MAX", RUN_MAX)
    while j < count:
        v, stop = values[j], j + 1
        if prior[j] is None and 0 < v.numel() <= limit:
            shape, dtype, device = v.shape, v.dtype, v.device
            while (
                stop < count
                and prior[stop] is None
                and values[stop].shape == shape
                and values[stop].dtype == dtype
                and values[stop].device == device
            ):
                stop += 1
        spans.append((j, stop))
        j = stop
    return spans


def _entry_keys(source: Any) -> Callable[[list, list], torch.Tensor]:
    def make(indices: list, values: list) -> torch.Tensor:
        stacked = torch.stack(values).reshape(len(values), -1)
        dtype = _select.key_dtype(values[:1])
        key = torch.empty(stacked.shape, dtype=dtype, device=stacked.device)
        _select.keys(stacked, None, dtype, source).into(0, stacked.numel(), key.view(-1))
        return key

    return make


def _entry_masks(new: dict) -> Callable[[list, list, torch.Tensor], None]:
    def masks(indices: list, values: list, keep: torch.Tensor) -> None:
        new.update(zip(indices, keep.view(len(indices), *values[0].shape).unbind(0), strict=True))

    return masks
