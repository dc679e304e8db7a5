"""Private: the radix selects of the distributed selection, their histograms summed over the mesh.

The same radix select as the single-process engine (:mod:`fprune.select._engine`), on the same
order-preserving integer keys (:func:`fprune.select._engine.keys`), with each pass's histograms summed
over the mesh by one ``all_reduce``: every rank finds the same threshold key, how many keys lie
below it and how many equal it, then writes its own part of the masks.

* :func:`select_all`: rankings over several leaves (the ``Global`` scope: one ranking), their
  tie split found by a second select over the ties' global flat positions;
* :func:`group_radix`: many rankings side by side, one histogram row each (per leaf, per row);
* :func:`per_leaf`: a ranking per leaf, batched: ``Replicate()``-only leaves locally, small
  sharded leaves by exchanging their keys, the others by :func:`group_radix`.

The digit width of each select is the widest whose passes fit the histogram budget
(:data:`HIST_BUDGET`, :data:`POSITION_BUDGET` for positions) for all its rankings together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fprune.distributed import _layout
from fprune.distributed._comm import Comm
from fprune.select import _engine, _groups, _stream

# Histogram bytes handed to collectives per call (score select + position select): the digit
# width per pass is the widest that keeps every pass of every ranking within it.
HIST_BUDGET = 4 << 20
POSITION_BUDGET = 2 << 20
_MAX_DIGIT = 16
_MIN_DIGIT = 1


@dataclass
class Ranking:
    """One selection problem: prune the ``k`` lowest keys over some sources."""

    k: int
    total: int
    sources: list  # (leaf, key_fn) in tie-break order, every local leaf (owned or not)
    width: int  # key bits: 32 or 64
    dtype: torch.dtype = torch.int32  # the keys' dtype
    threshold: int = 0
    below: int = 0
    ties: int = 0
    split_leaf: int | None = None  # index into sources where the tie split falls
    split_position: int = -1  # ties at global positions <= this are pruned in split_leaf
    mode: str = "select"  # "keep" (k <= 0), "prune" (k >= total) or "select"


def _bits_for(rankings_widths: Sequence[int], budget: int, element: int) -> int:
    count = len(rankings_widths)
    width = max(rankings_widths)
    for bits in range(_MAX_DIGIT, _MIN_DIGIT - 1, -1):
        passes = -(-width // bits)
        if passes * count * ((1 << bits) + 2) * element <= budget:
            return bits
    return _MIN_DIGIT


def _radix_select(
    comm: Comm,
    problems: list[dict],
    budget: int,
    hist_dtype: torch.dtype,
) -> list[tuple]:
    """``(key, below, equal)`` of the ``k``-th lowest key of each problem, over all ranks.

    Each problem is ``dict(k, low, shift, chunks)`` where ``chunks()`` yields this rank's
    keys (integer tensors; entries outside ``[low, low + 2**shift)`` are ignored) and ``k``
    is 1-based. All problems advance together, one ``all_reduce`` per pass.
    """
    element = torch.empty((), dtype=hist_dtype).element_size()
    bits = _bits_for([p["shift"] for p in problems], budget, element)
    comm.stats.digit_bits.append(bits)
    state = [{"low": p["low"], "shift": p["shift"], "k": p["k"], "below": 0, "equal": 0} for p in problems]
    work: dict = {}

    def buffer_like(key: torch.Tensor) -> torch.Tensor:
        held = work.get(key.dtype)
        if held is None or held.numel() < key.numel():
            held = work[key.dtype] = torch.empty(
                max(key.numel(), _stream.CHUNK), dtype=key.dtype, device=key.device
            )
        return held[: key.numel()]

    while any(s["shift"] > 0 for s in state):
        width = 1 << bits
        hist = torch.zeros(len(problems), width + 2, dtype=torch.int64, device=comm.device)
        firsts = []
        for row, (problem, s) in enumerate(zip(problems, state, strict=True)):
            if s["shift"] == 0:
                firsts.append(0)
                continue
            next_shift = max(s["shift"] - bits, 0)
            low, shift = s["low"], s["shift"]
            full_range = shift == problem["width"] and low == problem["low"]
            # As the single-process histogram (fprune.select._engine): keys below the range clamp into a
            # bin before the in-range ones, keys above into the bin after them; one clamp,
            # subtract and shift per key.
            step = 1 << next_shift
            key_min, key_max = -(1 << (problem["width"] - 1)), (1 << (problem["width"] - 1)) - 1
            floor = low if full_range or low - step < key_min else low - step
            ceiling = min(low + (1 << shift), key_max)
            first = 1 if floor < low else 0
            firsts.append(first)
            for key in problem["chunks"]():
                digit = buffer_like(key)
                if full_range:
                    # The whole key range: the digit is the top bits, offset to be non-negative.
                    torch.bitwise_right_shift(key, next_shift, out=digit)
                    digit.sub_(low >> next_shift)
                else:
                    torch.clamp(key, floor, ceiling, out=digit)
                    digit.sub_(floor)
                    if next_shift:
                        digit.bitwise_right_shift_(next_shift)
                hist[row] += torch.bincount(digit, minlength=width + 2)[: width + 2]
        hist = comm.all_reduce(hist.to(hist_dtype)).to(torch.int64)
        comm.stats.passes += 1
        for row, s in enumerate(state):
            if s["shift"] == 0:
                continue
            next_shift = max(s["shift"] - bits, 0)
            inner = hist[row, firsts[row] : firsts[row] + min(width, 1 << (s["shift"] - next_shift))]
            row_cum = inner.cumsum(0)
            top = int(torch.searchsorted(row_cum, s["k"]))
            skipped = int(row_cum[top - 1]) if top > 0 else 0
            s["below"] += skipped
            s["k"] -= skipped
            s["equal"] = int(inner[top])
            s["low"] += top << next_shift
            s["shift"] = next_shift
    return [(s["low"], s["below"], s["equal"]) for s in state]


def chunk_keys(
    leaf: _layout.Leaf, key_fn: Callable[[int, int], torch.Tensor], buffer: torch.Tensor
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """This leaf's local keys chunk by chunk, in ``buffer`` when the key builder can fill it."""
    fill = getattr(key_fn, "into", None)
    for start in range(0, leaf.local_numel, _stream.CHUNK):
        stop = min(start + _stream.CHUNK, leaf.local_numel)
        if fill is not None:
            yield start, stop, fill(start, stop, buffer[: stop - start])
        else:
            yield start, stop, key_fn(start, stop)


def _buffer(
    sources: Sequence[tuple[_layout.Leaf, Callable[[int, int], torch.Tensor]]], dtype: torch.dtype
) -> torch.Tensor:
    size = min(_stream.CHUNK, max([leaf.local_numel for leaf, _ in sources], default=1))
    device = sources[0][0].local.device if sources else "cpu"
    return torch.empty(max(size, 1), dtype=dtype, device=device)


# Leaves of at most this many local entries have their keys computed once per select and kept
# (concatenated into blocks), instead of once per pass: the per-leaf work of many small leaves.
SMALL_LOCAL = 4096
_KEPT_KEYS = 1 << 25  # at most this many kept keys per select; the rest are recomputed


def _score_chunks(
    sources: Sequence[tuple[_layout.Leaf, Callable[[int, int], torch.Tensor]]], dtype: torch.dtype
) -> Callable[[], Iterator[torch.Tensor]]:
    buffer = _buffer(sources, dtype)
    kept: list = []

    def build() -> int:
        pieces, size, total = [], 0, 0
        for leaf, key_fn in sources:
            if not leaf.owned or not 0 < leaf.local_numel <= SMALL_LOCAL or total >= _KEPT_KEYS:
                continue
            pieces.append(key_fn(0, leaf.local_numel).reshape(-1))
            size += leaf.local_numel
            total += leaf.local_numel
            if size >= _stream.CHUNK:
                kept.append(torch.cat(pieces))
                pieces, size = [], 0
        if pieces:
            kept.append(torch.cat(pieces))
        return total

    state: dict = {}

    def chunks() -> Iterator[torch.Tensor]:
        if "total" not in state:
            state["total"] = build()
        yield from kept
        counted = 0
        for leaf, key_fn in sources:
            if not leaf.owned:
                continue
            if 0 < leaf.local_numel <= SMALL_LOCAL and counted < state["total"]:
                counted += leaf.local_numel  # kept above
                continue
            for _, _, key in chunk_keys(leaf, key_fn, buffer):
                yield key

    return chunks


def _tie_position_chunks(
    leaf: _layout.Leaf, key_fn: Callable[[int, int], torch.Tensor], threshold: int, dtype: torch.dtype
) -> Callable[[], Iterator[torch.Tensor]]:
    buffer = _buffer([(leaf, key_fn)], dtype)

    def chunks() -> Iterator[torch.Tensor]:
        if not leaf.owned:
            return
        for start, stop, key in chunk_keys(leaf, key_fn, buffer):
            yield torch.where(key == threshold, leaf.positions(start, stop), -1)

    return chunks


def select_all(comm: Comm, rankings: list[Ranking]) -> None:
    """Fill threshold, ties and the tie split of every ranking (collectives on every rank)."""
    active = [r for r in rankings if r.mode == "select"]
    if not active:
        return
    hist_dtype = torch.int32 if max(r.total for r in active) < 2**31 else torch.int64
    found = _radix_select(
        comm,
        [
            {
                "k": r.k,
                "low": -(1 << (r.width - 1)),
                "shift": r.width,
                "width": r.width,
                "chunks": _score_chunks(r.sources, r.dtype),
            }
            for r in active
        ],
        HIST_BUDGET,
        hist_dtype,
    )
    splits = []
    for r, (threshold, below, equal) in zip(active, found, strict=True):
        r.threshold, r.below, r.ties = threshold, below, equal
        if r.k - below < equal:
            splits.append(r)
    if not splits:
        return
    # Where does each split fall? Per-leaf tie counts (one leaf: all of them).
    multi = [r for r in splits if len(r.sources) > 1]
    per_leaf: Iterator[int] = iter(())
    if multi:
        counts = []
        for r in multi:
            for leaf, key_fn in r.sources:
                n = 0
                if leaf.owned:
                    for key in _score_chunks([(leaf, key_fn)], r.dtype)():
                        n += int(torch.count_nonzero(key == r.threshold))
                counts.append(n)
        reduced = comm.all_reduce(torch.tensor(counts, dtype=torch.int64, device=comm.device))
        per_leaf = iter(reduced.tolist())
    position_problems = []
    for r in splits:
        remaining = r.k - r.below  # ties to prune, in [1, ties)
        leaf_ties = [next(per_leaf) for _ in r.sources] if len(r.sources) > 1 else [r.ties]
        for j, n in enumerate(leaf_ties):  # noqa: B007 (j is read after the loop: the leaf the break stopped at)
            if remaining <= n:
                break
            remaining -= n
        r.split_leaf = j
        leaf, key_fn = r.sources[j]
        if remaining == leaf_ties[j]:
            r.split_position = leaf.numel  # every tie of this leaf is pruned
            continue
        position_problems.append(
            (
                r,
                {
                    "k": remaining,
                    "low": 0,
                    "shift": max(1, (leaf.numel - 1).bit_length()),
                    "width": 64,
                    "chunks": _tie_position_chunks(leaf, key_fn, r.threshold, r.dtype),
                },
            )
        )
    if position_problems:
        hist_dtype = torch.int32 if max(r.total for r, _ in position_problems) < 2**31 else torch.int64
        found = _radix_select(comm, [p for _, p in position_problems], POSITION_BUDGET, hist_dtype)
        for (r, _), (position, _, _) in zip(position_problems, found, strict=True):
            r.split_position = position


def keep_masks(ranking: Ranking) -> list[torch.Tensor]:
    """This rank's local keep-masks of a ranking's sources, once the selection is known."""
    out = []
    buffer = _buffer(ranking.sources, ranking.dtype)
    for j, (leaf, key_fn) in enumerate(ranking.sources):
        if ranking.mode != "select":
            fill = ranking.mode == "keep"
            out.append(torch.full(leaf.local_shape, fill, dtype=torch.bool, device=leaf.local.device))
            continue
        keep = torch.empty(leaf.local_numel, dtype=torch.bool, device=leaf.local.device)
        for start, stop, key in chunk_keys(leaf, key_fn, buffer):
            part = keep[start:stop]
            if ranking.split_leaf is None or j < ranking.split_leaf:
                torch.gt(key, ranking.threshold, out=part)  # every tie pruned
            elif j > ranking.split_leaf:
                torch.ge(key, ranking.threshold, out=part)  # every tie kept
            else:
                torch.gt(key, ranking.threshold, out=part)
                part |= (key == ranking.threshold) & (leaf.positions(start, stop) > ranking.split_position)
        out.append(keep.view(leaf.local_shape))
    return out


def make_ranking(k: int, total: int, sources: list, dtype: torch.dtype) -> Ranking:
    mode = "keep" if k <= 0 else "prune" if k >= total else "select"
    return Ranking(k=k, total=total, sources=sources, width=torch.iinfo(dtype).bits, dtype=dtype, mode=mode)


def _group_bits(width: int, groups: int, element: int, budget: int) -> int:
    """The digit width whose passes over ``groups`` histograms fit ``budget`` (else the cheapest)."""
    best, best_bytes = 1, None
    for bits in range(min(_MAX_DIGIT, width), 0, -1):
        passes = -(-width // bits)
        total = passes * groups * ((1 << bits) - 1) * element  # the last bin is not sent
        if total <= budget:
            return bits
        if best_bytes is None or total < best_bytes:
            best, best_bytes = bits, total
    return best


def group_radix(
    comm: Comm,
    parts: Any,
    k: torch.Tensor,
    low: int,
    width: int,
    budget: int,
    largest: int,
    totals: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k[g]``-th lowest key of every group ``g`` over all ranks, side by side.

    ``parts`` are ``(first_group, keys)`` pairs (or a callable that yields them, once per pass):
    ``keys`` is a ``(groups, entries)`` block of this rank's integer keys for groups
    ``first_group...`` (or for the groups of an int64 tensor ``first_group``, one per row; a
    group may come in several blocks); keys outside
    ``[low, low + 2**width)`` are ignored. ``k`` (int64, one per group, >= 1) is the same on
    every rank. ``totals`` (int64, one per group) counts each group's keys in that range over
    all ranks: the last bin of a histogram is then known (the keys in range less the other
    bins), so each pass sends ``2**bits - 1`` counts per group in one ``all_reduce``. Returns
    ``(key, below, equal)`` tensors: the key, how many keys of the group lie below it and how
    many equal it.
    """
    groups = k.numel()
    count_dtype = torch.int32 if largest < 2**31 else torch.int64  # largest: entries in a group
    bits = _group_bits(width, groups, torch.empty((), dtype=count_dtype).element_size(), budget)
    # No more bins than the largest group has entries: the histograms are sized to the data.
    bits = min(bits, max(1, (largest - 1).bit_length()))
    comm.stats.digit_bits.append(bits)
    device = comm.device
    lows = torch.full((groups,), low, dtype=torch.int64, device=device)
    below = torch.zeros(groups, dtype=torch.int64, device=device)
    remaining = k.clone()
    equal = torch.zeros(groups, dtype=torch.int64, device=device)
    in_range = totals.to(device=device, dtype=torch.int64).clone()
    shift = width
    while shift > 0:
        next_shift = max(shift - bits, 0)
        step_bits = shift - next_shift
        bins = 1 << step_bits
        hist = torch.zeros(groups * bins + 1, dtype=torch.int64, device=device)
        for first, keys in parts() if callable(parts) else parts:
            if keys.numel() == 0:
                continue
            keys = keys.to(torch.int64)
            rows = keys.shape[0]
            if isinstance(first, torch.Tensor):  # the groups of the block's rows, given
                group_ids = first
            else:
                group_ids = torch.arange(first, first + rows, device=device)
            base = lows[group_ids].unsqueeze(1)
            if shift >= 64:  # the whole int64 range: top digit, offset to be non-negative
                digit = (keys >> next_shift) - (base >> next_shift)
                inside = torch.ones_like(keys, dtype=torch.bool)
            else:  # keys - base may wrap only where it is >= 2**63: then it is outside anyway
                offset = keys - base
                inside = (keys >= base) & ((offset >> shift) == 0)
                digit = offset >> next_shift
            if isinstance(first, torch.Tensor):
                index = group_ids.unsqueeze(1) * bins + digit
                index = torch.where(inside, index, groups * bins)  # outside: the discarded last bin
                hist += torch.bincount(index.reshape(-1), minlength=groups * bins + 1)
            else:  # consecutive groups: count into their part of the histograms only
                index = (group_ids - first).unsqueeze(1) * bins + digit
                index = torch.where(inside, index, rows * bins)
                span = hist[first * bins : (first + rows) * bins]
                span += torch.bincount(index.reshape(-1), minlength=rows * bins + 1)[: rows * bins]
        sent = hist[:-1].view(groups, bins)[:, :-1].to(count_dtype).contiguous()
        sent = comm.all_reduce(sent).to(torch.int64)
        hist = torch.cat([sent, (in_range - sent.sum(1)).unsqueeze(1)], 1)
        comm.stats.passes += 1
        cumulative = hist.cumsum(1)
        digit = (cumulative < remaining.unsqueeze(1)).sum(1).clamp(max=bins - 1)
        skipped = torch.where(
            digit > 0, cumulative.gather(1, (digit - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0
        )
        below += skipped
        remaining -= skipped
        equal = hist.gather(1, digit.unsqueeze(1)).squeeze(1)
        in_range = equal
        lows += digit << next_shift
        shift = next_shift
    return lows, below, equal


def stack_rows(blocks: list, device: torch.device) -> list:
    """``(first_row, (rows, entries))`` blocks stacked by row length into ``(row ids, keys)``
    blocks: one histogram per row length and pass, not one per leaf."""
    by_length: dict = {}
    for first, keys in blocks:
        if keys.numel():
            by_length.setdefault(keys.shape[1], []).append((first, keys))
    out = []
    for group in by_length.values():
        ids = torch.cat([torch.arange(f, f + k.shape[0], device=device) for f, k in group])
        out.append((ids, torch.cat([k.to(device) for _, k in group])))
    return out


# ----------------------------------------------------------------------------- per-leaf rankings

# Sharded leaves of at most this many entries exchange their keys (4 or 8 bytes an entry, no
# more than the histograms of a radix select would cost) and are selected whole on every rank.
SMALL_LEAF = 64


def per_leaf(comm: Comm, items: list) -> list:
    """This rank's local keep-masks of per-leaf rankings ``(leaf, key_fn, k, key dtype)``.

    Leaves not sharded on any mesh dim (``Replicate()`` only) are whole on every rank: the
    single-process engine selects them with no communication. Sharded leaves of at most
    :data:`SMALL_LEAF` entries exchange their keys. The others run one radix select side by
    side (:func:`group_radix`: one histogram row of ``2**bits`` counts per leaf and pass, the
    digit width the widest that fits the budget for all of them), then, for the leaves where
    only some ties are pruned, the same select over the ties' global positions.
    """
    keeps: list[torch.Tensor | None] = [None] * len(items)
    local, small, big = [], [], []
    for j, (leaf, _key_fn, k, _dtype) in enumerate(items):
        device = leaf.local.device
        if k <= 0 or k >= leaf.numel:
            keeps[j] = torch.full(leaf.local_shape, k <= 0, dtype=torch.bool, device=device)
        elif not _layout.sharded(leaf):
            local.append(j)
        elif leaf.numel <= SMALL_LEAF:
            small.append(j)
        else:
            big.append(j)
    if local:
        found = _engine.prune_lowest_each(
            [(items[j][0].local_numel, items[j][1]) for j in local],
            [items[j][2] for j in local],
            traced=False,
            device=items[local[0]][0].local.device,
        )
        for j, keep in zip(local, found, strict=True):
            keeps[j] = keep.view(items[j][0].local_shape)
    if small:
        _small_leaves(comm, items, small, keeps)
    if big:
        _big_leaves(comm, items, big, keeps)
    return keeps


def _small_leaves(comm: Comm, items: list, chosen: list[int], keeps: list) -> None:
    """Sharded leaves of a few entries: their keys summed into one buffer, selected whole."""
    wide = any(items[j][3] == torch.int64 for j in chosen)
    dtype = torch.int64 if wide else torch.int32
    bases, total = [], 0
    for j in chosen:
        bases.append(total)
        total += items[j][0].numel
    buffer = torch.zeros(total, dtype=dtype, device=comm.device)
    for base, j in zip(bases, chosen, strict=True):
        leaf, key_fn = items[j][0], items[j][1]
        if leaf.owned and leaf.local_numel:
            buffer[base + leaf.positions(0, leaf.local_numel).to(comm.device)] = key_fn(
                0, leaf.local_numel
            ).to(comm.device, dtype)
    buffer = comm.all_reduce(buffer)
    for base, j in zip(bases, chosen, strict=True):
        leaf, _, k, key_dtype = items[j]
        whole = _groups.lowest_in_groups(buffer[base : base + leaf.numel].to(key_dtype).view(1, -1), k).view(
            -1
        )
        mine = whole[leaf.positions(0, leaf.local_numel).to(whole.device)] if leaf.local_numel else whole[:0]
        keeps[j] = mine.to(leaf.local.device).view(leaf.local_shape)


def _big_leaves(comm: Comm, items: list, chosen: list[int], keeps: list) -> None:
    device = comm.device
    buffers: dict = {}

    def buffer_for(leaf: _layout.Leaf, dtype: torch.dtype) -> torch.Tensor:
        held = buffers.get(dtype)
        if held is None or held.numel() < min(_stream.CHUNK, leaf.local_numel):
            held = buffers[dtype] = torch.empty(
                max(1, min(_stream.CHUNK, leaf.local_numel)), dtype=dtype, device=leaf.local.device
            )
        return held

    # Owned leaves of a few local entries: their keys computed once, stacked by local size.
    stacked: dict = {}
    kept = 0
    for g, j in enumerate(chosen):
        leaf, key_fn, _, dtype = items[j]
        if leaf.owned and 0 < leaf.local_numel <= SMALL_LOCAL and kept < _KEPT_KEYS:
            stacked.setdefault(leaf.local_numel, []).append(
                (g, key_fn(0, leaf.local_numel).reshape(-1).to(torch.int64))
            )
            kept += leaf.local_numel
    blocks = [
        (
            torch.tensor([g for g, _ in rows], dtype=torch.int64, device=device),
            torch.stack([key for _, key in rows]),
        )
        for rows in stacked.values()
    ]
    in_blocks = {g for rows in stacked.values() for g, _ in rows}
    stacked.clear()

    def key_blocks() -> Iterator[tuple[Any, torch.Tensor]]:
        yield from blocks
        for g, j in enumerate(chosen):
            leaf, key_fn, _, dtype = items[j]
            if leaf.owned and g not in in_blocks:
                for _, _, key in chunk_keys(leaf, key_fn, buffer_for(leaf, dtype)):
                    yield g, key.view(1, -1)

    k = torch.tensor([items[j][2] for j in chosen], dtype=torch.int64, device=device)
    width = 64 if any(items[j][3] == torch.int64 for j in chosen) else 32
    largest = max(items[j][0].numel for j in chosen)
    totals = torch.tensor([items[j][0].numel for j in chosen], dtype=torch.int64, device=device)
    threshold, below, equal = group_radix(
        comm, key_blocks, k, -(1 << (width - 1)), width, HIST_BUDGET, largest, totals
    )
    ties = k - below
    partial = (ties < equal).tolist()
    split = {}
    subset = [g for g, p in enumerate(partial) if p]
    if subset:
        pbits = max(1, max(items[chosen[g]][0].numel - 1 for g in subset).bit_length())
        thresholds = threshold.tolist()

        def position_blocks() -> Iterator[tuple[int, torch.Tensor]]:
            for row, g in enumerate(subset):
                leaf, key_fn, _, dtype = items[chosen[g]]
                if leaf.owned:
                    for start, stop, key in chunk_keys(leaf, key_fn, buffer_for(leaf, dtype)):
                        tie = key == thresholds[g]
                        yield row, torch.where(tie, leaf.positions(start, stop), 1 << pbits).view(1, -1)

        found, _, _ = group_radix(
            comm, position_blocks, ties[subset], 0, pbits, POSITION_BUDGET, largest, equal[subset]
        )
        split = dict(zip(subset, found.tolist(), strict=True))
    thresholds = threshold.tolist()
    for g, j in enumerate(chosen):
        leaf, key_fn, _, dtype = items[j]
        thr = thresholds[g]
        position = split.get(g, leaf.numel)  # no split: every tie pruned
        keep = torch.empty(leaf.local_numel, dtype=torch.bool, device=leaf.local.device)
        for start, stop, key in chunk_keys(leaf, key_fn, buffer_for(leaf, dtype)):
            part = keep[start:stop]
            torch.gt(key, thr, out=part)
            if g in split:
                part |= (key == thr) & (leaf.positions(start, stop) > position)
        keeps[j] = keep.view(leaf.local_shape)
