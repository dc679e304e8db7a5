"""Private: the k-th key of the eager engine's sources (:mod:`fprune.select._engine`): radix
histograms on 16-bit digits, and a sampled window around the k-th key for large int32 inputs."""

from __future__ import annotations

import torch

from fprune.select._keys import INF32
from fprune.select._stream import Buffers, Steps, Stream, fill_one

# When at most this many keys remain in range and two or more radix passes would still be
# needed (int64 keys, or a small input), the eager path gathers them and selects among them.
CANDIDATES = 1 << 16
DIGIT = 16
# int32 keys of inputs this large are first located from a sample: the eager path then guesses a
# window of consecutive keys around the k-th one (the sample's spread, 2**_MIN_WINDOW_BITS to
# 2**_WINDOW_BITS keys), and one exact histogram of that window (keys below and above it land in
# two extra bins) gives the answer if the guess holds, which saves a pass over the data. A wrong
# guess costs that one pass; the radix select follows.
SAMPLED = 1 << 22
_WINDOW_BITS = 19
_MIN_WINDOW_BITS = 10
_SAMPLE_BLOCKS = 256
_SAMPLE_BLOCK = 1024
# The histogram kernel. None: by device type, ``torch.bincount`` on the CPU, and elsewhere
# ``index_add_`` into fixed bins (CUDA's bincount reads its input's min and max on the host, two
# syncs per call), with the entries of the bins that out-of-range keys clamp into spread over
# ``_SPREAD`` extra bins each, so that no bin takes most of the atomic increments. True / False
# force one kernel (tests run the CUDA one on the CPU).
SCATTER_HISTOGRAM: bool | None = None
_SPREAD = 256


def kth_key(stream: Stream, k: int, total: int) -> Steps:
    """Generator: the k-th lowest key (1-based), how many keys lie strictly below it, how many equal it.

    Radix select on 16-bit digits from the top. A pass makes a histogram of the next digit of
    the keys still in range (those between ``low`` and ``low + 2**shift``), which picks the digit
    of the k-th key; keys out of range are clamped into two extra bins, so a pass costs a clamp,
    a subtraction and a histogram per entry, never a gather, and one host read. Keys of a single
    chunk of at most ``CANDIDATES`` entries are selected directly (``kthvalue``).
    """
    if stream.cache and total <= CANDIDATES:
        key = stream.fill(stream.plan[0])
        threshold = key.kthvalue(k).values
        request = [
            torch.stack([threshold.to(torch.int64), (key < threshold).sum(), (key == threshold).sum()])
        ]
        del key, threshold
        read = yield request
        threshold_v, below, ties = read[0]
        return threshold_v, below, ties
    if stream.dtype == torch.int32 and total >= SAMPLED:
        found = yield from _kth_key_in_sampled_window(stream, k, total)
        if found is not None:
            return found
    width = torch.iinfo(stream.dtype).bits
    low, shift, below = torch.iinfo(stream.dtype).min, width, 0
    in_range = 0  # set by the first pass (width > 0)
    while shift > 0:
        next_shift = max(shift - DIGIT, 0)
        bins = 1 << (shift - next_shift)
        hist, first = _histogram(stream, low, shift, next_shift)
        cumulative = hist[first : first + bins].cumsum_(0)  # in place: no second histogram
        digit = torch.searchsorted(cumulative, k).reshape(1)  # first digit whose cumulative count >= k
        skipped, count = _before_and_at(cumulative, digit)
        request = [digit, skipped, count]
        del hist, cumulative  # a suspended step holds only what it asked for
        ((digit_v,), (skipped_v,), (in_range,)) = yield request
        del request
        below += skipped_v
        k -= skipped_v
        low += digit_v << next_shift
        shift = next_shift
        if not stream.one_nan and stream.dtype == torch.int32 and low + (1 << shift) > INF32:
            # The k-th key may be +inf or a NaN: start again with every NaN on one key.
            stream.one_nan = True
            return (yield from kth_key(stream, k + below, total))
    return low, below, in_range


def _before_and_at(cumulative: torch.Tensor, digit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From cumulative counts: how many lie before bin ``digit`` (a 1-element tensor) and in it."""
    at = cumulative.index_select(0, digit)
    before = cumulative.index_select(0, (digit - 1).clamp(min=0)) * (digit > 0)
    return before, at - before


def _kth_key_in_sampled_window(stream: Stream, k: int, total: int) -> Steps:
    """Generator: :func:`kth_key` in one pass when a sample locates the k-th key closely
    enough, else None."""
    found = yield from _sample_window(stream, k, total)
    if found is None:
        return None
    guess, bits = found
    window = 1 << bits
    hist, first = _histogram(stream, guess, bits, 0)
    below = hist[:first].sum().reshape(1)
    cumulative = hist[first : first + window].cumsum_(0)  # in place: no second histogram
    digit = torch.searchsorted(cumulative, (k - below).clamp(min=1)).clamp(max=window - 1)
    skipped, count = _before_and_at(cumulative, digit)
    request = [below, cumulative[-1:].clone(), digit, skipped, count]  # no view keeps hist alive
    del hist, cumulative
    read = yield request
    del request
    ((below_v,), (inside,), (digit_v,), (skipped_v,), (ties,)) = read
    if not below_v < k <= below_v + inside:
        return None
    threshold = guess + digit_v
    if threshold >= INF32 and not stream.one_nan:
        return None  # the k-th key is +inf or a NaN: the radix select merges the NaN keys
    return threshold, below_v + skipped_v, ties


def _sample_window(stream: Stream, k: int, total: int) -> Steps:
    """Generator: ``(lowest key, log2 of the width)`` of a window of keys that likely holds the
    k-th key, or None.

    The window is the narrowest power of two of keys (at least ``2**_MIN_WINDOW_BITS``, at most
    ``2**_WINDOW_BITS``) that spans the sample's keys around rank ``k``: its histogram is as small
    as the data allows (fewer bins to allocate, add up and scan).

    The sample is ``_SAMPLE_BLOCKS`` contiguous blocks spread evenly over all entries. The
    window must span the sample's keys of ranks ``k/total`` plus and minus a margin of four
    standard deviations of a sample quantile and a slack for the correlation within blocks.
    """
    starts = [i * total // _SAMPLE_BLOCKS for i in range(_SAMPLE_BLOCKS)]
    offsets, position = [], 0
    for numel, _ in stream.sources:
        offsets.append(position)
        position += numel
    # The sample and its digits live in the key buffer (which the passes after it use anyway) and
    # are counted into the call's histogram buffers: the sample allocates no memory of its own.
    size = _SAMPLE_BLOCKS * _SAMPLE_BLOCK
    room = stream.buffers.get("key", stream.dtype, max(2 * size, stream.key_buffer.numel()))
    sample = room[:size]
    filled, source = 0, 0
    for start in starts:
        while offsets[source] + stream.sources[source][0] <= start:
            source += 1
        numel, key_fn = stream.sources[source]
        local = start - offsets[source]
        stop = min(local + _SAMPLE_BLOCK, numel)
        fill_one(key_fn, local, stop, sample[filled : filled + stop - local], True)
        filled += stop - local
    sample, scratch = room[:filled], room[size : size + filled]
    fraction = k / total
    margin = 4.0 * (fraction * (1.0 - fraction) / filled) ** 0.5 + 0.0005
    low_rank = max(1, int((fraction - margin) * filled))
    high_rank = min(filled, int((fraction + margin) * filled) + 1)
    low_key, high_key = yield from _sample_keys(sample, scratch, stream.buffers, (low_rank, high_rank))
    spread = high_key - low_key + 1  # keys the window must hold: [low_key, high_key]
    bits = max(min(_MIN_WINDOW_BITS, _WINDOW_BITS), (spread - 1).bit_length())  # 2**bits >= spread
    if bits > _WINDOW_BITS:
        return None
    window = 1 << bits
    key_min, key_max = torch.iinfo(stream.dtype).min, torch.iinfo(stream.dtype).max
    start = low_key - (window - spread) // 2  # centred on the spread
    return max(key_min, min(start, key_max + 1 - window)), bits


def _sample_keys(
    sample: torch.Tensor, scratch: torch.Tensor, buffers: Buffers, ranks: tuple[int, ...]
) -> Steps:
    """Generator: the keys of the given ranks (1-based) among the int32 keys ``sample``, exactly.

    A radix select of two 16-bit digits over the sample, for all ranks at once: the top digits
    (one histogram), then the low digits among the keys that share each rank's top digit (one
    histogram per rank). Two host reads; digits go to ``scratch`` (the sample's size) and counts
    to the call's histogram buffer, so nothing of the sample's size is allocated (a sort would
    allocate a copy and int64 indices).
    """
    half = 1 << (DIGIT - 1)
    ones = torch.ones((), dtype=torch.int32, device=sample.device).expand(sample.numel())
    torch.bitwise_right_shift(sample, DIGIT, out=scratch).add_(half)  # top digit, non-negative
    cumulative = buffers.get("hist", torch.int32, 1 << DIGIT).zero_().index_add_(0, scratch, ones).cumsum_(0)
    wanted = torch.tensor(ranks, dtype=torch.int32, device=sample.device)
    tops = torch.searchsorted(cumulative, wanted)
    before, _ = _before_and_at(cumulative, tops)
    request = [tops, before]
    del cumulative
    (tops_v, before_v) = yield request
    del request
    found = []
    key_min, key_max = torch.iinfo(torch.int32).min, torch.iinfo(torch.int32).max
    for rank, top, skipped in zip(ranks, tops_v, before_v, strict=True):
        low = (top - half) << DIGIT  # the lowest key with this top digit
        # keys below and above the top digit's keys clamp to the bins around them (as in _histogram)
        floor, ceiling = max(low - 1, key_min), min(low + (1 << DIGIT), key_max)
        digit = torch.clamp(sample, floor, ceiling, out=scratch).sub_(floor)
        hist = buffers.get("hist", torch.int32, (1 << DIGIT) + 2).zero_().index_add_(0, digit, ones)
        offset = 1 if floor < low else 0
        cumulative = hist[offset : offset + (1 << DIGIT)].cumsum_(0)
        found.append(torch.searchsorted(cumulative, torch.tensor([rank - skipped], device=sample.device)))
        del hist, cumulative
    request = [torch.cat(found)]
    (lows,) = yield request
    del request
    return tuple(((top - half) << DIGIT) + low for top, low in zip(tops_v, lows, strict=True))


def _histogram(stream: Stream, low: int, shift: int, next_shift: int) -> tuple[torch.Tensor, int]:
    """Counts of ``(key - low) >> next_shift`` over keys in ``[low, low + 2**shift)``.

    Returns the histogram and the index of its first in-range bin; the bins just before and
    after the in-range ones count the keys below and above the range.
    """
    key_min, key_max = torch.iinfo(stream.dtype).min, torch.iinfo(stream.dtype).max
    width = torch.iinfo(stream.dtype).bits
    bins = 1 << (shift - next_shift)
    if shift == width:
        # The whole key range: the digit is the top bits, offset to be non-negative.
        offset = 0 if stream.nonnegative else 1 << (DIGIT - 1)
        first = -offset + (1 << (DIGIT - 1))
        counter = _Counter(bins, stream.device, stream.buffers, entries=stream.total)
        for chunk, key in stream.chunks():
            digit = torch.bitwise_right_shift(key, next_shift, out=stream.scratch(chunk, key))
            if offset:
                digit.add_(offset)
            counter.add(digit)
        hist = counter.total()
        # Place the bins as if the offset were always there: bin i holds top bits i - 2**15. In
        # place (non-negative keys fill only the lower half): no second histogram is made.
        if first:
            hist[first:].copy_(hist[: bins - first])
            hist[:first].zero_()
        return hist, 0
    # Keys below the range clamp to ``floor`` (bin 0 when something can be below), keys above to
    # ``low + 2**shift`` (the bin after the in-range ones).
    step = 1 << next_shift
    floor = low - step if low - step >= key_min else key_min
    first = 1 if floor < low else 0
    ceiling = min(low + (1 << shift), key_max)
    edges = (0, (ceiling - floor) >> next_shift)
    counter = _Counter(bins + 2, stream.device, stream.buffers, edges=edges, entries=stream.total)
    for chunk, key in stream.chunks():
        digit = torch.clamp(key, floor, ceiling, out=stream.scratch(chunk, key))
        digit.sub_(floor)
        if next_shift:
            digit.bitwise_right_shift_(next_shift)
        counter.add(digit)
    return counter.total(), first


class _Counter:
    """Counts of the values in ``[0, length)`` of many digit tensors, summed (see SCATTER_HISTOGRAM).

    ``edges`` are the bins that out-of-range keys clamp into. On the CPU the digits are counted
    with ``index_add_`` into histograms taken from the call's reused buffers (int32 when fewer
    than 2**31 entries are counted): no histogram is allocated per pass or per chunk, so the
    many small selections of a per-leaf call leave no trail of freed blocks in the allocator
    (``torch.bincount`` is faster on widely spread digits, but allocates its output every time).
    One thread counts: Python helper threads compete with torch's OpenMP threads for the cores
    (docs/performance.md, engine notes). The scatter kernel (other
    devices) spreads the entries of the edge bins over extra bins (by position) and folds them
    back in :meth:`total`.
    """

    def __init__(
        self,
        length: int,
        device: torch.device | str,
        buffers: Buffers,
        edges: tuple[int, ...] = (),
        entries: int = 0,
    ) -> None:
        self.length = length
        self.device = device
        self.buffers = buffers
        self.scatter = (
            SCATTER_HISTOGRAM if SCATTER_HISTOGRAM is not None else torch.device(device).type != "cpu"
        )
        self.edges = tuple(sorted({e for e in edges if 0 <= e < length}))
        self.hist: torch.Tensor | None = None
        self.dtype = torch.int32 if 0 < entries < 2**31 else torch.int64
        if self.scatter:
            self.hist = torch.zeros(length + _SPREAD * len(self.edges), dtype=torch.int64, device=device)

    def add(self, digit: torch.Tensor) -> None:
        if not self.scatter:
            if self.hist is None:
                self.hist = self.buffers.get("hist", self.dtype, self.length).zero_()
            ones = torch.ones((), dtype=self.dtype, device=self.device).expand(digit.numel())
            self.hist.index_add_(0, digit, ones)
            return
        index = digit
        if self.edges:
            n = digit.numel()
            lanes = self.buffers.store.get(("lanes", digit.dtype))
            if lanes is None or lanes.numel() < n:
                lanes = torch.arange(n, dtype=digit.dtype, device=digit.device).remainder_(_SPREAD)
                self.buffers.store[("lanes", digit.dtype)] = lanes
            for j, edge in enumerate(self.edges):
                spread = lanes[:n] + (self.length + j * _SPREAD)
                index = torch.where(index == edge, spread, index)
        ones = torch.ones((), dtype=torch.int64, device=digit.device).expand(digit.numel())
        assert self.hist is not None  # made in __init__ for the scatter kernel
        self.hist.index_add_(0, index, ones)

    def total(self) -> torch.Tensor:
        if not self.scatter:
            if self.hist is None:
                return torch.zeros(self.length, dtype=torch.int64, device=self.device)
            return self.hist
        assert self.hist is not None  # made in __init__ for the scatter kernel
        hist = self.hist[: self.length].clone()
        for j, edge in enumerate(self.edges):
            start = self.length + j * _SPREAD
            hist[edge : edge + 1] += self.hist[start : start + _SPREAD].sum()
        return hist
