"""Private: count-exact selection of the lowest scores, within one leaf or across many.

The selection contract, shared by every pruning function in fprune:

* Exactly ``k`` entries are pruned: the ``k`` with the lowest score.
* Ties are broken by position: among equal scores, the entry that comes first is pruned first.
  "First" is row-major (flat) order inside a tensor and, across leaves, the order in which
  optree flattens the pytree (a dict's keys in sorted order).
* ``-0.0`` equals ``0.0``; NaN ranks above ``+inf`` (a NaN score is pruned last), which is what
  ``torch.topk`` does, so torch's masks are reproduced where scores are NaN too. All NaNs are
  equal to each other (whatever their sign or payload), so they too tie by position.
* Entries that prior masks already pruned rank below everything, so they stay pruned and the
  count includes them.

Two algorithms compute the same masks:

* eager (Python-int ``k``, no transform active): a streaming select over order-preserving
  integer keys of the scores, chunk by chunk and leaf by leaf, into reused chunk buffers. No
  concatenated copy of the scores is ever built; temporaries are bounded by the chunk size, so
  the extra memory is the returned masks (1 byte per entry) plus a few chunks. Each pass over
  the data is a ``bincount`` of a digit of the keys (keys outside the digit's range clamp into
  two extra bins), never a gather. For large inputs with int32 keys (float32, float16,
  bfloat16 scores) the scores are read twice: a sample of the keys locates the k-th one, one
  exact histogram of a window of 2**18 consecutive keys around it gives the k-th key, how many
  keys lie below it and how many equal it, and a last pass writes the masks. Where the sample
  misses (or for int64 keys, or small inputs) a radix select on 16-bit digits from the top
  takes over: one histogram per digit, then the mask pass. Ties at the threshold that must be
  split are resolved in the mask pass, scanning in tie-break order. Magnitudes of float32
  (the named score source :data:`MAGNITUDE`) take a shortcut: their key is the float's bits
  with the sign bit cleared (``bits & 0x7fffffff`` orders non-negative floats, NaN above inf).
* traced (under ``vmap``, ``grad``, ``torch.compile``, or with a tensor ``k``): a stable sort of
  the keys and a rank comparison, free of ``.item()``, data-dependent shapes and Python
  branches on values.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch

from fprune._torch import is_traced  # noqa: F401 (torch internals live in _torch)

# Entries per chunk in the eager path: its buffers are a few of these (4 MiB each for int32).
CHUNK = 1 << 20
# When at most this many keys remain in range and two or more radix passes would still be
# needed (int64 keys, or a small input), the eager path gathers them and selects among them.
CANDIDATES = 1 << 16
_DIGIT = 16
# int32 keys of inputs this large are first located from a sample: the eager path then guesses a
# window of 2**_WINDOW_BITS consecutive keys around the k-th one, and one exact histogram of that
# window (keys below and above it land in two extra bins) gives the answer if the guess holds,
# which saves a pass over the data. A wrong guess costs that one pass; the radix select follows.
SAMPLED = 1 << 22
_WINDOW_BITS = 18
_SAMPLE_BLOCKS = 256
_SAMPLE_BLOCK = 2048

KeyFn = Callable[[int, int], torch.Tensor]

_ABS32 = 0x7FFFFFFF
_INF32 = 0x7F800000  # bits of float32 +inf
_NAN32 = _INF32 + 1  # the one key of every float32 NaN: just above +inf
_INF64 = 0x7FF0000000000000
_NAN64 = _INF64 + 1


def key_dtype(scores: Sequence[torch.Tensor]) -> torch.dtype:
    """int32 keys when every score fits float32 exactly, int64 (through float64) otherwise."""
    narrow = all(
        s.dtype == torch.bool or (s.is_floating_point() and s.element_size() <= 4) for s in scores
    )
    return torch.int32 if narrow else torch.int64


def pruned_key(dtype: torch.dtype) -> int:
    """The key of an entry that prior masks pruned: below every score's key."""
    return torch.iinfo(dtype).min


def orderable(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Integer keys whose signed order is the order of ``scores`` (-0 == 0, NaN above +inf).

    Every NaN gets the same key, one above the key of ``+inf``.

    >>> k = orderable(torch.tensor([-2.0, -0.0, 0.0, 1.0, float("inf"), float("nan")]), torch.int32)
    >>> bool((k[:-1] < k[1:]).sum() == 4), bool(k[1] == k[2]), int(k[5] - k[4])
    (True, True, 1)
    """
    x = scores.to(torch.float32 if dtype == torch.int32 else torch.float64) + 0.0  # -0.0 -> 0.0
    bits = x.view(dtype)
    width = torch.iinfo(dtype).bits
    key = bits ^ ((bits >> (width - 1)) & torch.iinfo(dtype).max)
    nan_key = _NAN32 if dtype == torch.int32 else _NAN64
    return torch.where(torch.isnan(x), torch.full_like(key, nan_key), key)


class Magnitude:
    """The named score source ``|x|``: rank values by magnitude.

    It computes ``torch.abs`` like any transform, but the key builder recognises it (by type,
    not by identity with ``torch.abs``) and, for floats of at most 32 bits, takes the fast path:
    the key is the float32 bits with the sign bit cleared, and no ``|x|`` tensor is made.
    """

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        return torch.abs(values)

    def __repr__(self) -> str:
        return "MAGNITUDE"


#: The magnitude score source (see :class:`Magnitude`).
MAGNITUDE = Magnitude()


class Keys:
    """The keys of one leaf's flattened entries, a chunk at a time: ``keys(start, stop)``.

    Calling it returns a new tensor (this is what the traced path uses, whole-leaf, and it
    works under ``vmap`` and ``torch.compile``); :meth:`into` writes the same keys into a
    caller's buffer, which is what the eager path does chunk by chunk.
    """

    def __init__(
        self,
        scores: torch.Tensor,
        keep: Optional[torch.Tensor],
        dtype: torch.dtype,
        transform: Optional[Callable[[torch.Tensor], torch.Tensor]],
    ):
        self.dtype = dtype
        self.flat_scores = scores.reshape(-1)
        self.flat_keep = None if keep is None else keep.reshape(-1)
        self.transform = transform
        self.low = pruned_key(dtype)
        # Magnitudes of floats of at most 32 bits: key = float32 bits with the sign cleared.
        self.magnitude32 = (
            isinstance(transform, Magnitude)
            and dtype == torch.int32
            and scores.is_floating_point()
            and scores.element_size() <= 4
        )
        # Keys are then never negative unless prior masks pruned something.
        self.nonnegative = self.magnitude32 and keep is None

    def __call__(self, start: int, stop: int) -> torch.Tensor:
        chunk = self.flat_scores[start:stop]
        key = orderable(chunk if self.transform is None else self.transform(chunk), self.dtype)
        if self.flat_keep is not None:
            key = key.masked_fill(~self.flat_keep[start:stop], self.low)
        return key

    def into(self, start: int, stop: int, out: torch.Tensor, one_nan: bool = True) -> torch.Tensor:
        """The keys of entries ``start:stop``, written into ``out`` (eager code only).

        ``one_nan=False`` lets float32 NaNs keep distinct keys (all above ``+inf``), which
        saves a pass of the buffer; it is correct while the k-th key is below ``+inf``.
        """
        if self.magnitude32:
            chunk = self.flat_scores[start:stop]
            if chunk.dtype != torch.float32:
                chunk = chunk.to(torch.float32)
            torch.bitwise_and(chunk.view(torch.int32), _ABS32, out=out)
            if one_nan:
                torch.clamp(out, max=_NAN32, out=out)  # every NaN payload -> one NaN key
        else:
            out.copy_(self(start, stop) if self.flat_keep is None else self._unmasked(start, stop))
        if self.flat_keep is not None:
            low = torch.full((), self.low, dtype=out.dtype, device=out.device)
            torch.where(self.flat_keep[start:stop], out, low, out=out)
        return out

    def _unmasked(self, start: int, stop: int) -> torch.Tensor:
        chunk = self.flat_scores[start:stop]
        return orderable(chunk if self.transform is None else self.transform(chunk), self.dtype)


def keys(
    scores: torch.Tensor,
    keep: Union[torch.Tensor, None],
    dtype: torch.dtype,
    transform: Union[Callable[[torch.Tensor], torch.Tensor], None] = None,
) -> KeyFn:
    """A function ``(start, stop) -> keys`` over the flattened entries of one leaf.

    ``transform`` (say :data:`MAGNITUDE`, or any elementwise callable) turns the values into
    scores chunk by chunk, so no full-size score tensor is made; ``None`` ranks the values
    themselves (signed). Entries where ``keep`` is False get the pruned key. Keys
    are computed per call: the eager path holds one chunk of them at a time. The result is a
    :class:`Keys`, which the eager path also fills into reused buffers.
    """
    return Keys(scores, keep, dtype, transform)


def prune_lowest(
    sources: Sequence[Tuple[int, KeyFn]],
    k: Union[int, torch.Tensor],
    *,
    traced: bool,
    device: torch.device,
) -> List[torch.Tensor]:
    """Flat keep-masks (``torch.bool``) that prune the ``k`` lowest keys across all ``sources``.

    ``sources`` are ``(numel, key_fn)`` pairs in tie-break order. ``k`` is an int, or a 0-dim
    integer tensor (which needs ``traced=True``: the count is not known to Python).
    """
    if traced or isinstance(k, torch.Tensor):
        return _prune_lowest_traced(sources, k)
    return _prune_lowest_streaming(sources, int(k), device)


def prune_lowest_each(
    sources: Sequence[Tuple[int, KeyFn]],
    ks: Sequence[Union[int, torch.Tensor]],
    *,
    traced: bool,
    device: torch.device,
) -> List[torch.Tensor]:
    """Flat keep-masks that prune the ``ks[i]`` lowest keys of each source on its own.

    The per-leaf counterpart of :func:`prune_lowest` (one independent ranking per source, the
    same tie-break within each). This is the entry point of every per-leaf scope, so that
    many small leaves can be selected in batches here rather than one call per leaf.
    """
    return [
        prune_lowest([source], k, traced=traced, device=device)[0]
        for source, k in zip(sources, ks)
    ]


def _prune_lowest_traced(sources, k) -> List[torch.Tensor]:
    flat = torch.cat([key_fn(0, numel) for numel, key_fn in sources])
    order = torch.argsort(flat, stable=True)
    positions = torch.arange(flat.shape[0], device=flat.device)
    ranks = torch.zeros_like(order).scatter(0, order, positions)
    keep = ranks >= k
    return list(torch.split(keep, [numel for numel, _ in sources]))


class _Stream:
    """The eager path's view of the sources: chunk ranges and reused key buffers."""

    def __init__(self, sources, device):
        self.sources = [(numel, key_fn) for numel, key_fn in sources if numel > 0]
        self.device = device
        self.dtype = _dtype_of(self.sources)
        size = min(CHUNK, max([numel for numel, _ in self.sources], default=1))
        self.key_buffer = torch.empty(size, dtype=self.dtype, device=device)
        self.work_buffer = torch.empty(size, dtype=self.dtype, device=device)
        self.tie_buffer = torch.empty(size, dtype=torch.bool, device=device)
        self.nonnegative = all(getattr(key_fn, "nonnegative", False) for _, key_fn in self.sources)
        # Distinct NaN keys are harmless unless the threshold reaches +inf (see _kth_key).
        self.one_nan = False

    def chunks(self):
        """``(source index, start, stop, keys)`` for every chunk, in tie-break order."""
        for index, (numel, key_fn) in enumerate(self.sources):
            for start in range(0, numel, CHUNK):
                stop = min(start + CHUNK, numel)
                yield index, start, stop, self._keys(key_fn, start, stop)

    def _keys(self, key_fn, start, stop):
        if isinstance(key_fn, Keys):
            return key_fn.into(start, stop, self.key_buffer[: stop - start], self.one_nan)
        return key_fn(start, stop)


def _dtype_of(sources) -> torch.dtype:
    for _, key_fn in sources:
        if isinstance(key_fn, Keys):
            return key_fn.dtype
    return sources[0][1](0, 1).dtype if sources else torch.int32


def _prune_lowest_streaming(sources, k: int, device) -> List[torch.Tensor]:
    sizes = [numel for numel, _ in sources]
    total = sum(sizes)
    if k <= 0:
        return [torch.ones(numel, dtype=torch.bool, device=device) for numel in sizes]
    if k >= total:
        return [torch.zeros(numel, dtype=torch.bool, device=device) for numel in sizes]
    stream = _Stream(sources, device)
    threshold, below, ties = _kth_key(stream, k, total)
    ties_to_prune = k - below  # in [1, ties]: the k-th lowest key itself equals the threshold
    split = ties_to_prune < ties  # some ties are pruned, the later ones kept
    keeps = [torch.empty(numel, dtype=torch.bool, device=device) for numel, _ in stream.sources]
    for index, start, stop, key in stream.chunks():
        keep = keeps[index][start:stop]
        if not split:
            # Every tie is pruned (gt) or, once the split is done, every later one is kept (ge).
            (torch.gt if ties_to_prune else torch.ge)(key, threshold, out=keep)
            continue
        torch.gt(key, threshold, out=keep)
        is_tie = torch.eq(key, threshold, out=stream.tie_buffer[: stop - start])
        count = int(torch.count_nonzero(is_tie))
        if count > ties_to_prune:
            keep[is_tie.nonzero().squeeze(1)[ties_to_prune:]] = True
            ties_to_prune = 0
            split = False
        else:
            ties_to_prune -= count
    kept = iter(keeps)
    return [next(kept) if numel > 0 else torch.ones(0, dtype=torch.bool, device=device) for numel in sizes]


def _kth_key(stream: _Stream, k: int, total: int) -> Tuple[int, int, int]:
    """The k-th lowest key (1-based), how many keys lie strictly below it, and how many equal it.

    Radix select on 16-bit digits from the top. A pass makes a histogram of the next digit of
    the keys still in range (those between ``low`` and ``low + 2**shift``), which picks the digit
    of the k-th key; keys out of range are clamped into two extra bins, so a pass costs a clamp,
    a subtraction and a ``bincount`` per entry, never a gather. When few keys remain in range and
    more than one pass would still be needed, they are gathered and selected directly.
    """
    if stream.dtype == torch.int32 and total >= SAMPLED:
        found = _kth_key_in_sampled_window(stream, k, total)
        if found is not None:
            return found
    width = torch.iinfo(stream.dtype).bits
    low, shift, below, in_range = torch.iinfo(stream.dtype).min, width, 0, total
    while shift > 0:
        if in_range <= CANDIDATES and (shift > _DIGIT or total <= CANDIDATES):
            return _select_among(stream, k, low, shift, below)
        next_shift = max(shift - _DIGIT, 0)
        bins = 1 << (shift - next_shift)
        hist, first = _histogram(stream, low, shift, next_shift)
        inner = hist[first : first + bins]
        cumulative = inner.cumsum(0)
        digit = int(torch.searchsorted(cumulative, k))  # first digit whose cumulative count >= k
        skipped = int(cumulative[digit - 1]) if digit > 0 else 0
        below += skipped
        k -= skipped
        in_range = int(inner[digit])
        low += digit << next_shift
        shift = next_shift
        if not stream.one_nan and stream.dtype == torch.int32 and low + (1 << shift) > _INF32:
            # The k-th key may be +inf or a NaN: start again with every NaN on one key.
            stream.one_nan = True
            return _kth_key(stream, k + below, total)
    return low, below, in_range


def _kth_key_in_sampled_window(stream: _Stream, k: int, total: int) -> Optional[Tuple[int, int, int]]:
    """:func:`_kth_key` in one pass when a sample locates the k-th key closely enough, else None."""
    window = 1 << _WINDOW_BITS
    guess = _sample_window(stream, k, total, window)
    if guess is None:
        return None
    hist, first = _histogram(stream, guess, _WINDOW_BITS, 0)
    below = int(hist[:first].sum())
    inner = hist[first : first + window]
    if not below < k <= below + int(inner.sum()):
        return None
    cumulative = inner.cumsum(0)
    digit = int(torch.searchsorted(cumulative, k - below))
    below += int(cumulative[digit - 1]) if digit > 0 else 0
    threshold = guess + digit
    if threshold >= _INF32 and not stream.one_nan:
        return None  # the k-th key is +inf or a NaN: the radix select merges the NaN keys
    return threshold, below, int(inner[digit])


def _sample_window(stream: _Stream, k: int, total: int, window: int) -> Optional[int]:
    """The lowest key of a window of ``window`` keys that likely holds the k-th key, or None.

    The sample is ``_SAMPLE_BLOCKS`` contiguous blocks spread evenly over all entries. The
    window must span the sample's keys of ranks ``k/total`` plus and minus a margin of four
    standard deviations of a sample quantile and a slack for the correlation within blocks.
    """
    starts = [i * total // _SAMPLE_BLOCKS for i in range(_SAMPLE_BLOCKS)]
    offsets, position = [], 0
    for numel, _ in stream.sources:
        offsets.append(position)
        position += numel
    sample = torch.empty(_SAMPLE_BLOCKS * _SAMPLE_BLOCK, dtype=stream.dtype, device=stream.device)
    filled, source = 0, 0
    for start in starts:
        while offsets[source] + stream.sources[source][0] <= start:
            source += 1
        numel, key_fn = stream.sources[source]
        local = start - offsets[source]
        stop = min(local + _SAMPLE_BLOCK, numel)
        out = sample[filled : filled + stop - local]
        if isinstance(key_fn, Keys):
            key_fn.into(local, stop, out)
        else:
            out.copy_(key_fn(local, stop))
        filled += stop - local
    sample = sample[:filled]
    size = sample.numel()
    fraction = k / total
    margin = 4.0 * (fraction * (1.0 - fraction) / size) ** 0.5 + 0.0005
    low_rank = max(1, int((fraction - margin) * size))
    high_rank = min(size, int((fraction + margin) * size) + 1)
    low_key = int(sample.kthvalue(low_rank).values)
    high_key = int(sample.kthvalue(high_rank).values)
    if high_key - low_key >= window:
        return None
    key_min, key_max = torch.iinfo(stream.dtype).min, torch.iinfo(stream.dtype).max
    start = (low_key + high_key) // 2 - window // 2
    return max(key_min, min(start, key_max + 1 - window))


def _histogram(stream: _Stream, low: int, shift: int, next_shift: int) -> Tuple[torch.Tensor, int]:
    """Counts of ``(key - low) >> next_shift`` over keys in ``[low, low + 2**shift)``.

    Returns the histogram and the index of its first in-range bin; the bins just before and
    after the in-range ones count the keys below and above the range.
    """
    key_min, key_max = torch.iinfo(stream.dtype).min, torch.iinfo(stream.dtype).max
    width = torch.iinfo(stream.dtype).bits
    bins = 1 << (shift - next_shift)
    work = stream.work_buffer
    if shift == width:
        # The whole key range: the digit is the top bits, offset to be non-negative.
        offset = 0 if stream.nonnegative else 1 << (_DIGIT - 1)
        first = -offset + (1 << (_DIGIT - 1))
        counter = _Counter(bins)
        for _, start, stop, key in stream.chunks():
            digit = torch.bitwise_right_shift(key, next_shift, out=work[: stop - start])
            if offset:
                digit.add_(offset)
            counter.add(digit)
        hist = counter.total()
        # Place the bins as if the offset were always there: bin i holds top bits i - 2**15.
        if first:
            hist = torch.cat([hist.new_zeros(first), hist])[:bins]
        return hist, 0
    # Keys below the range clamp to ``floor`` (bin 0 when something can be below), keys above to
    # ``low + 2**shift`` (the bin after the in-range ones).
    step = 1 << next_shift
    floor = low - step if low - step >= key_min else key_min
    first = 1 if floor < low else 0
    ceiling = min(low + (1 << shift), key_max)
    counter = _Counter(bins + 2)
    for _, start, stop, key in stream.chunks():
        digit = torch.clamp(key, floor, ceiling, out=work[: stop - start])
        digit.sub_(floor)
        if next_shift:
            digit.bitwise_right_shift_(next_shift)
        counter.add(digit)
    return counter.total(), first


class _Counter:
    """Counts of the values in ``[0, length)`` of many digit tensors (``torch.bincount``, summed)."""

    def __init__(self, length: int):
        self.length = length
        self.hist: Optional[torch.Tensor] = None

    def add(self, digit: torch.Tensor) -> None:
        counts = torch.bincount(digit, minlength=self.length)
        self.hist = counts if self.hist is None else self.hist.add_(counts)

    def total(self) -> torch.Tensor:
        if self.hist is None:
            return torch.zeros(self.length, dtype=torch.int64)
        return self.hist


def _select_among(stream: _Stream, k: int, low: int, shift: int, below: int) -> Tuple[int, int, int]:
    """The exact answer of :func:`_kth_key` from the keys in ``[low, low + 2**shift)``, gathered."""
    width = torch.iinfo(stream.dtype).bits
    stream.one_nan = True  # the gathered keys are compared exactly
    gathered = []
    for _, start, stop, key in stream.chunks():
        if shift == width:
            gathered.append(key.clone())
        else:
            gathered.append(key[(key >> shift) == (low >> shift)])
    candidates = torch.cat(gathered)
    threshold = candidates.kthvalue(k).values
    below += int((candidates < threshold).sum())
    return int(threshold), below, int((candidates == threshold).sum())
