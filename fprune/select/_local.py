"""Private: the local executor of the selection layer (the tensors of one process), over the
engine of :mod:`fprune.select._engine`.

:class:`Executor` implements :class:`fprune.select._executor.Executor` with:

* :func:`prune_each`: per-leaf selections handed to the engine in batches (by device, at most
  ``BATCH`` entries), the traced path wherever a score tensor is traced;
* :class:`LeafRuns`: many small alike leaves selected together, a row of keys per leaf (at most
  ``RUN_MAX`` entries a leaf, ``RUN_ENTRIES`` a batch: module constants, tunable here);
* the engine's streaming select for the global ranking (it never concatenates the scores) and
  the per-group program :func:`fprune.select._groups.lowest_in_groups` for ``Rows`` and ``NM``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fprune import _amount
from fprune.select import _engine, _inputs
from fprune.select._executor import Grouped, Masks, Within
from fprune.select._groups import lowest_in_groups, lowest_in_groups_of_one_count

# Per-leaf selections are handed to the engine in batches of at most this many entries (or one
# leaf), so that scores made on the fly (random draws) are not all held at once.
BATCH = 1 << 24


def prune_each(items: list, traced: bool) -> list:
    """``_engine.prune_lowest_each`` over ``(numel, key_fn, k, device, scores)`` items, batched
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
        keeps += _engine.prune_lowest_each(
            [(numel, key_fn) for numel, key_fn, _, _, _ in batch],
            [k for _, _, k, _, _ in batch],
            traced=traced or _engine.is_traced([values for *_, values in batch]),
            device=device,
        )
        start = stop
    return keeps


# Leaves of at most RUN_MAX entries, without prior masks and with a Python amount, are selected
# in runs of alike leaves (one shape, score dtype and device, one count): their scores stacked
# (at most RUN_ENTRIES entries per batch), their keys made, selected along rows and the masks
# split off in one op each. The masks and the tie-break are the engine's. Both limits are read at
# each call, so that tests can tune them here.
RUN_MAX = 1 << 14
RUN_ENTRIES = 1 << 18


def in_runs(leaf: torch.Tensor, prior: torch.Tensor | None, amount: Any) -> bool:
    return (
        prior is None
        and isinstance(amount, numbers.Real)
        and not isinstance(amount, torch.Tensor)
        and 0 < leaf.numel() <= RUN_MAX
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
                max(1, RUN_ENTRIES // max(1, values.numel())),
            ]
        run[0].append(i)
        run[1].append(values)
        if len(run[0]) >= run[3]:
            self._flush(run)
            del self.runs[signature]

    def _flush(self, run: list) -> None:
        indices, values, k, _ = run
        if _engine.is_traced(values):
            self.traced += zip(indices, values, strict=True)
            return
        key = self.make_keys(indices, values)
        keep = torch.empty(key.shape, dtype=torch.bool, device=key.device)
        threshold, split = _engine.lowest_in_rows(key, k, keep)
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
                _engine.split_rows(self.make_keys(indices, values), threshold, k, keep)
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
# The executor


class _Ranking:
    """The global ranking's primitives of the local executor (``Global`` ranks with them)."""

    inputs: _inputs.Inputs
    score: Callable[[int], torch.Tensor]
    source: Any
    traced: bool
    _spans: list
    _keeps: list

    def alive(self, leaves: list[int]) -> list[Any]:
        params = self.inputs.params.leaves
        return _inputs.remaining_all(
            [self.inputs.prior[i] for i in leaves], [params[i].numel() for i in leaves], self.traced
        )

    def count(self, amount: Any, remaining: Any, size: Any) -> Any:
        return _amount.count(amount, remaining, "parameters", self.inputs.argname, size=size)

    def unchanged(self, leaves: list[int], new: Any) -> Masks | None:
        return None  # the engine selects a count of 0 without a pass over the scores

    def values(self, leaves: list[int]) -> list[torch.Tensor]:
        values = [self.score(i) for i in leaves]
        self.traced = self.traced or _engine.is_traced(values)
        return values

    def prior(self, i: int) -> torch.Tensor | None:
        return self.inputs.prior[i]

    def norms(self, leaves: list[int], values: list, priors: list, order: float, norm_of: Any) -> list:
        return [norm_of(v, prior, order) for v, prior in zip(values, priors, strict=True)]

    def lowest_each(self, items: list) -> list:
        leaves = self.inputs.params.leaves
        return _engine.prune_lowest_each(
            [(leaves[i].numel(), key_fn) for i, key_fn, _, _ in items],
            [k for _, _, k, _ in items],
            traced=self.traced,
            device=leaves[items[0][0]].device,
        )

    def rank_all(
        self,
        leaves: list[int],
        values: list[torch.Tensor],
        priors: list,
        transforms: list,
        protect: list,
        dtype: torch.dtype,
        k: Any,
        plain: bool,
    ) -> list[torch.Tensor]:
        """The engine's streaming select, with consecutive small alike leaves stacked into one
        source when ``plain``."""
        params = self.inputs.params.leaves
        sizes = [params[i].numel() for i in leaves]
        if self.traced or not plain:
            spans = [(j, j + 1) for j in range(len(leaves))]
        else:
            spans = _stackable(values, priors)
        sources = []
        for a, b in spans:
            if b - a == 1:
                sources.append(
                    (sizes[a], _engine.keys(values[a], priors[a], dtype, transforms[a], protect[a]))
                )
            else:  # consecutive alike small leaves: one source over their stacked scores
                stacked = torch.stack(values[a:b])
                sources.append((sizes[a] * (b - a), _engine.keys(stacked, None, dtype, self.source)))
        device = params[leaves[0]].device
        keeps = _engine.prune_lowest(sources, k, traced=self.traced, device=device)
        self._spans, self._keeps = spans, keeps
        out: list[torch.Tensor] = []
        for (a, b), keep in zip(spans, keeps, strict=True):
            if b - a == 1:
                out.append(keep.view(params[leaves[a]].shape))
            else:
                out += keep.view(b - a, *values[a].shape).unbind(0)
        return out

    def emptied(self, alive: list[Any]) -> list[int]:
        """One host read, two at most."""
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


class Executor(_Ranking):
    """One local call: the :class:`fprune.select._executor.Executor` of the tensors of one
    process. ``score`` is the method's score function (a :class:`~fprune.select._inputs.NaNWatch`
    over it, which warns once if the ranked scores hold NaN)."""

    def __init__(
        self,
        inputs: _inputs.Inputs,
        score: Callable[[int], torch.Tensor],
        amount: Any,
        amounts: list,
        source: Any,
    ) -> None:
        self.inputs = inputs
        self.score = score
        self.amount = amount
        self.amounts = amounts
        self.source = source
        self.traced = inputs.traced
        self._spans: list = []
        self._keeps: list = []

    def pruned(self) -> list[int]:
        return [i for i, a in enumerate(self.amounts) if a is not None]

    def name(self, i: int) -> str:
        return self.inputs.name(i)

    def per_entry(self, leaves: list[int]) -> Masks:
        """Each leaf's amount of its remaining entries, its lowest keys. Small leaves without
        prior masks and with a Python amount go in runs (:class:`LeafRuns`); the others, in leaf
        order, to the engine in batches as their scores are made (:func:`prune_each`), so that
        scores made on the fly are dropped once their batch is selected."""
        inputs, score, amounts, source = self.inputs, self.score, self.amounts, self.source
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
            key_fn = _engine.keys(values, inputs.prior[i], _engine.key_dtype([values]), source)
            pending.append((n, key_fn, ks[i], params[i].device, values))
            done.append(i)
            pending_size += n
            if pending_size >= BATCH:
                keeps += prune_each(pending, traced)
                pending, pending_size = [], 0
        keeps += prune_each(pending, traced)
        for i, values in rows.finish():  # scores that a transform batched: the traced path
            key_fn = _engine.keys(values, None, _engine.key_dtype([values]), source)
            keeps += prune_each([(params[i].numel(), key_fn, ks[i], params[i].device, values)], True)
            done.append(i)
        new.update((i, keep.view(params[i].shape)) for i, keep in zip(done, keeps, strict=True))
        return new

    def grouped(self, plan: Grouped) -> Masks:
        """The masks of a :class:`~fprune.select._executor.Grouped` plan: every count first
        (live groups from the prior masks, one host read), then per leaf its group scores and
        their ``k`` lowest (:func:`prune_each`, the traced path where a score is batched); small
        alike leaves in runs where the plan has a ``batch``."""
        inputs, traced, amounts = self.inputs, self.traced, self.amounts
        params, priors = inputs.params.leaves, inputs.prior
        fast = set()
        if plan.batch is not None and not traced:
            fast = {i for i in plan.leaves if in_runs(params[i], priors[i], amounts[i])}
        slow = [(i, g) for i, g in zip(plan.leaves, plan.groupings, strict=True) if i not in fast]
        lives: dict[int, torch.Tensor | None] = {}
        for i, g in slow:
            prior = priors[i]
            lives[i] = None if prior is None else g.any(prior)
        left = _inputs.remaining_all([lives[i] for i, _ in slow], [g.n for _, g in slow], traced)
        alive = dict(zip([i for i, _ in slow], left, strict=True))
        ks: dict[int, Any] = {}
        counted: dict[tuple, Any] = {}
        for j, (i, g) in enumerate(zip(plan.leaves, plan.groupings, strict=True)):  # in leaf order
            a, n = amounts[i], g.n
            if i in alive:
                ks[i] = _amount.count(a, alive[i], plan.what, plan.name(self, j), size=n) + (n - alive[i])
                continue
            signature = (isinstance(a, numbers.Integral), a, n)
            k = counted.get(signature)
            if k is None:
                k = counted[signature] = _amount.count(a, n, plan.what, plan.name(self, j), size=n)
            ks[i] = k
        # With plan.nan, the NaN check reads the group scores, not every entry's.
        watch = self.score if plan.nan and isinstance(self.score, _inputs.NaNWatch) else None
        note, raw = (watch.note, watch.raw) if watch is not None else (None, self.score)
        source = self.source if plan.ranked else None
        new: dict[int, torch.Tensor] = {}
        rows = None
        if plan.batch is not None:
            rows = LeafRuns(_group_keys(plan.batch.scores, source, note), _group_masks(plan.batch.masks, new))
        pending: list = []
        for i, g in zip(plan.leaves, plan.groupings, strict=True):
            values = raw(i)
            if i in fast and plan.batch is not None and rows is not None and plan.batch.fits(i, values):
                rows.add(i, values, ks[i], params[i].shape)
                continue
            scores = plan.scores(i, values, priors[i], g)
            if note is not None:
                note([i], scores)
            key_fn = _engine.keys(scores, lives.get(i), _engine.key_dtype([scores]), source)
            pending.append((i, g, (g.n, key_fn, ks[i], scores.device, scores)))
        keeps = prune_each([item for _, _, item in pending], traced)
        for (i, g, _), keep in zip(pending, keeps, strict=True):
            new[i] = _expand(g, keep, priors[i])
        for i, values in rows.finish() if rows is not None else ():  # batched by a transform: traced
            g = plan.groupings[list(plan.leaves).index(i)]
            scores = plan.scores(i, values, None, g)
            key_fn = _engine.keys(scores, None, _engine.key_dtype([scores]), source)
            (keep,) = prune_each([(g.n, key_fn, ks[i], scores.device, scores)], True)
            new[i] = _expand(g, keep, None)
        return new

    def within(self, plan: Within) -> Masks:
        """The masks of a :class:`~fprune.select._executor.Within` plan: every leaf's keys as
        ``(groups, group size)`` and the counts first (the checks of ``plan`` with one host read),
        then per leaf the per-group program (a stable sort per group: one tensor program whatever
        the path)."""
        inputs, priors = self.inputs, self.inputs.prior
        params = inputs.params.leaves
        plans = []
        for i, d in zip(plan.leaves, plan.dims, strict=True):
            p, prior = params[i], priors[i]
            shape = _within_shape(p.shape, d, plan.size)
            live = None if prior is None else _arrange(prior, d, plan.size, shape)
            size = shape[-1]
            alive = torch.full(shape[:-1], size, device=p.device) if live is None else live.sum(-1)
            plans.append((i, d, shape, live, alive, plan.counts(i, alive, size)))
        if plan.check is not None and not self.traced:
            limited = [
                (i, alive.min()) for i, _, _, _, alive, _ in plans if i in plan.limited and alive.numel()
            ]
            for (i, _), least in zip(limited, read_each([m for _, m in limited]), strict=True):
                plan.check(i, least)
        # Eager calls of Rows read whether every row of a leaf prunes one count (always so without
        # prior masks): a selection then replaces the sort (NM's groups of a few entries sort faster).
        one_count: list = [None] * len(plans)
        if not self.traced and plan.size is None:
            counts = [torch.as_tensor(k) for *_, k in plans]
            spans = [torch.stack([k.amin(), k.amax()]) if k.numel() else k.new_zeros(2) for k in counts]
            for j, (least, most) in enumerate(read_each(spans)):
                one_count[j] = least if least == most else None
        new = {}
        for (i, d, shape, live, _, k), count in zip(plans, one_count, strict=True):
            values = self.score(i)
            dtype = _engine.key_dtype([values])
            keys = _engine.keys(_arrange(values, d, plan.size, shape), live, dtype, self.source)
            grouped = keys(0, numel(shape)).view(shape)
            if count is None:
                keep = lowest_in_groups(grouped, k)
            else:
                keep = lowest_in_groups_of_one_count(grouped, int(count))
            new[i] = _restore(keep, params[i].shape, d, plan.size)
        return new


def _expand(grouping: Any, keep: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor:
    mask = grouping.expand(keep)
    return mask.contiguous() if prior is None else mask & prior


def _within_shape(shape: Sequence[int], d: int, size: int | None) -> tuple:
    """A leaf's entries as ``(..., groups, group size)`` (see :class:`Within`)."""
    if size is None:  # every index along d a group: (rows, row size)
        rows = shape[d]
        return (rows, numel(shape) // rows if rows else 0)
    moved = [s for x, s in enumerate(shape) if x != d] + [shape[d]]
    return (*moved[:-1], moved[-1] // size, size)


def _arrange(t: torch.Tensor, d: int, size: int | None, shape: tuple) -> torch.Tensor:
    return (t.movedim(d, 0) if size is None else t.movedim(d, -1)).reshape(shape)


def _restore(keep: torch.Tensor, shape: Sequence[int], d: int, size: int | None) -> torch.Tensor:
    """The inverse of :func:`_arrange` (a contiguous mask of ``shape``)."""
    if size is None:
        moved = [shape[d]] + [s for x, s in enumerate(shape) if x != d]
        return keep.reshape(moved).movedim(0, d).contiguous()
    moved = [s for x, s in enumerate(shape) if x != d] + [shape[d]]
    return keep.reshape(moved).movedim(-1, d).contiguous()


def _group_keys(
    scores: Callable[[list, list], torch.Tensor],
    source: Any,
    note: Callable[[list, torch.Tensor], None] | None,
) -> Callable[[list, list], torch.Tensor]:
    """Keys of a run's group scores ``(leaves, n)`` (``note`` sees the scores first, when given)."""

    def make(indices: list, values: list) -> torch.Tensor:
        stacked = scores(indices, values)
        if note is not None:
            note(indices, stacked)
        dtype = _engine.key_dtype([stacked])
        return _engine.keys(stacked, None, dtype, source)(0, stacked.numel()).view(stacked.shape)

    return make


def _group_masks(
    masks: Callable[[list, torch.Tensor], list], new: dict
) -> Callable[[list, list, torch.Tensor], None]:
    def write(indices: list, values: list, keep: torch.Tensor) -> None:
        new.update(zip(indices, masks(indices, keep), strict=True))

    return write


def _stackable(values: list[torch.Tensor], prior: list[torch.Tensor | None]) -> list:
    """Spans ``(a, b)`` of the chosen leaves: runs of consecutive small leaves alike (shape, score
    dtype, device, no prior mask), or single leaves. A run is ranked as one source over its
    stacked scores, which keeps the order of the entries (the tie-break) and costs a copy of the
    scores of those small leaves (at most ``RUN_MAX`` entries each) for the call."""
    spans, j, count = [], 0, len(values)
    limit = RUN_MAX
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
        dtype = _engine.key_dtype(values[:1])
        key = torch.empty(stacked.shape, dtype=dtype, device=stacked.device)
        _engine.keys(stacked, None, dtype, source).into(0, stacked.numel(), key.view(-1))
        return key

    return make


def _entry_masks(new: dict) -> Callable[[list, list, torch.Tensor], None]:
    def masks(indices: list, values: list, keep: torch.Tensor) -> None:
        new.update(zip(indices, keep.view(len(indices), *values[0].shape).unbind(0), strict=True))

    return masks
