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
  the extra memory is the returned masks (1 byte per entry) plus the call's buffers: the key
  buffer (a chunk of keys) and one histogram. The masks are made first, before any scratch, so
  that repeated calls reuse the same memory. Each pass over the data counts a digit of the keys
  (keys outside the digit's range clamp into two extra bins) with ``index_add_`` into the
  reused histogram, never a gather. For large inputs with int32 keys (float32, float16,
  bfloat16 scores) the scores are read twice: a sample of the keys (256 blocks of 1024, held in
  the key buffer, its quantiles found by a two-digit radix select) locates the k-th one, one
  exact histogram of a window of consecutive keys around it (2**10 to 2**19 keys: the sample's
  spread) gives the k-th key, how many keys lie below it and how many equal it, and a last pass
  writes the masks. Where the sample misses (or for int64 keys, or small inputs) a radix select
  on 16-bit digits from the top takes over: one histogram per digit, then the mask pass. The
  mask pass compares into the masks' bytes (a uint8 view: a faster write than a bool output on
  the CPU, docs/performance.md). Ties at the threshold that must be split are resolved in the
  mask pass (a guess of where the split lies, the ties of each chunk counted, the chunks the guess got wrong
  recomputed with a ``cumsum`` over pieces of 64K keys). Small leaves are
  packed side by side into shared chunks; per-leaf selections (:func:`prune_lowest_each`) run
  in batched rows or side by side, and the host reads what it needs once per step for all
  leaves together: a constant number of host syncs per call. Magnitudes of float32
  (the named score source :data:`MAGNITUDE`) take a shortcut: their key is the float's bits
  with the sign bit cleared (``bits & 0x7fffffff`` orders non-negative floats, NaN above inf).
* traced (under ``vmap``, ``grad``, ``torch.compile``, or with a tensor ``k``): a stable sort of
  the keys and a rank comparison (up to ``TRACED_SORT`` keys), or a radix select of fixed
  passes over slices (larger inputs), free of ``.item()``, data-dependent shapes and Python
  branches on values.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, cast

import torch

from fprune import _torch
from fprune._torch import is_traced as is_traced  # re-exported (torch internals live in _torch)

# Entries per chunk in the eager path: its buffers are a few of these (4 MiB each for int32).
CHUNK = 1 << 20
# When at most this many keys remain in range and two or more radix passes would still be
# needed (int64 keys, or a small input), the eager path gathers them and selects among them.
CANDIDATES = 1 << 16
_DIGIT = 16
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

KeyFn = Callable[[int, int], torch.Tensor]
# A selection generator (see _drive): yields the tensors it needs read, is sent their values.
_Steps = Generator[list[torch.Tensor], Any, Any]

_ABS32 = 0x7FFFFFFF
_INF32 = 0x7F800000  # bits of float32 +inf
_NAN32 = _INF32 + 1  # the one key of every float32 NaN: just above +inf
_INF64 = 0x7FF0000000000000
_NAN64 = _INF64 + 1


def key_dtype(scores: Sequence[torch.Tensor]) -> torch.dtype:
    """int32 keys when every score fits float32 exactly, int64 (through float64) otherwise."""
    narrow = all(s.dtype == torch.bool or (s.is_floating_point() and s.element_size() <= 4) for s in scores)
    return torch.int32 if narrow else torch.int64


def pruned_key(dtype: torch.dtype) -> int:
    """The key of an entry that prior masks pruned: below every score's key."""
    return torch.iinfo(dtype).min


def protected_key(dtype: torch.dtype) -> int:
    """The key of a protected entry (see :class:`Keys`): above every score's key, NaN's too."""
    return torch.iinfo(dtype).max


def orderable(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Integer keys whose signed order is the order of ``scores`` (-0 == 0, NaN above +inf).

    Every NaN gets the same key, one above the key of ``+inf``.

    >>> k = orderable(torch.tensor([-2.0, -0.0, 0.0, 1.0, float("inf"), float("nan")]), torch.int32)
    >>> bool((k[:-1] < k[1:]).sum() == 4), bool(k[1] == k[2]), int(k[5] - k[4])
    (True, True, 1)
    """
    if dtype == torch.int64 and not _torch.has_float64(scores.device):
        return _orderable64_without_float64(scores)
    x = scores.to(torch.float32 if dtype == torch.int32 else torch.float64) + 0.0  # -0.0 -> 0.0
    bits = x.view(dtype)
    width = torch.iinfo(dtype).bits
    key = bits ^ ((bits >> (width - 1)) & torch.iinfo(dtype).max)
    nan_key = _NAN32 if dtype == torch.int32 else _NAN64
    return torch.where(torch.isnan(x), torch.full_like(key, nan_key), key)


def _orderable64_without_float64(scores: torch.Tensor) -> torch.Tensor:
    """:func:`orderable`'s int64 keys, identical, made without any float64 tensor (for MPS).

    The float64 path widens the scores to float64 and keys its bits; here the same float64 bit
    patterns are built in integer arithmetic (:func:`_float64_bits`), so the keys, and every
    mask made from them, are exactly those of the float64 path.
    """
    bits = _float64_bits(scores)
    key = bits ^ ((bits >> 63) & torch.iinfo(torch.int64).max)
    if scores.is_floating_point():
        key = torch.where(torch.isnan(scores), torch.full_like(key, _NAN64), key)
    return key


def _float64_bits(x: torch.Tensor) -> torch.Tensor:
    """The IEEE bits (as int64) of ``x.to(torch.float64)``, with -0.0 as 0.0, in integer arithmetic.

    >>> x = torch.tensor([-3.5, -0.0, 1e-45, 0.1, 3e38, float("inf")])
    >>> bool((_float64_bits(x) == (x.double() + 0.0).view(torch.int64)).all())
    True
    """
    if x.dtype == torch.float64:
        bits = x.view(torch.int64)
        return torch.where(bits == torch.iinfo(torch.int64).min, torch.zeros_like(bits), bits)
    if not x.is_floating_point():
        return _integer_float64_bits(x.to(torch.int64))
    b = (x.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent, mantissa = (b >> 23) & 0xFF, b & 0x7FFFFF
    normal = ((exponent + (1023 - 127)) << 52) | (mantissa << 29)
    special = (2047 << 52) | (mantissa << 29)  # inf and NaN
    # subnormal floats are mantissa * 2**-149: the float64 of the integer, scaled
    tiny = torch.where(mantissa == 0, 0, _integer_float64_bits(mantissa) - (149 << 52))
    bits = torch.where(exponent == 255, special, torch.where(exponent == 0, tiny, normal))
    return torch.where(b >> 31 == 1, bits | torch.iinfo(torch.int64).min, bits)


def _integer_float64_bits(v: torch.Tensor) -> torch.Tensor:
    """The IEEE bits of ``v.to(torch.float64)`` for int64 ``v``: rounded half to even, as torch does."""
    low = torch.iinfo(torch.int64).min
    negative = v < 0
    a = torch.where(v == low, 0, v.abs())  # -2**63 is handled at the end
    # floor(log2(a)): float32's exponent is it, or one more where float32 rounded a up.
    e = ((a.to(torch.float32).view(torch.int32) >> 23) & 0xFF).to(torch.int64) - 127
    e = e.clamp(0, 62)
    e = e - ((a >> e) == 0).to(torch.int64)
    e = e.clamp(min=0)
    # 53 significant bits: shifted up (exact) or down (rounded half to even)
    up = a << (52 - e).clamp(0, 63)
    shift = (e - 52).clamp(0, 63)
    q = a >> shift
    rest = a - (q << shift)
    half = (1 << (shift - 1).clamp(min=0)) * (shift > 0)
    q = q + ((shift > 0) & ((rest > half) | ((rest == half) & (q & 1 == 1)))).to(torch.int64)
    significand = torch.where(e <= 52, up, q)
    # a carry out of the 53 bits moves into the exponent by the addition
    bits = ((e + 1023) << 52) + (significand - (1 << 52))
    bits = torch.where(a == 0, 0, bits)
    bits = torch.where(v == low, (1023 + 63) << 52, bits)
    return torch.where(negative, bits | low, bits)


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
        keep: torch.Tensor | None,
        dtype: torch.dtype,
        transform: Callable[[torch.Tensor], torch.Tensor] | None,
        protect: torch.Tensor | None = None,
    ):
        self.dtype = dtype
        self.flat_scores = scores.reshape(-1)
        self.flat_keep = None if keep is None else keep.reshape(-1)
        # Entries where ``protect`` is True get the highest key, above every score's: a
        # selection of fewer than the unprotected entries never reaches them.
        self.flat_protect = None if protect is None else protect.reshape(-1)
        self.high = protected_key(dtype)
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
        if self.flat_protect is not None:
            key = key.masked_fill(self.flat_protect[start:stop], self.high)
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
        if self.flat_protect is not None:
            out.masked_fill_(self.flat_protect[start:stop], self.high)
        return out

    def _unmasked(self, start: int, stop: int) -> torch.Tensor:
        chunk = self.flat_scores[start:stop]
        return orderable(chunk if self.transform is None else self.transform(chunk), self.dtype)


def keys(
    scores: torch.Tensor,
    keep: torch.Tensor | None,
    dtype: torch.dtype,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    protect: torch.Tensor | None = None,
) -> Keys:
    """A function ``(start, stop) -> keys`` over the flattened entries of one leaf.

    ``transform`` (say :data:`MAGNITUDE`, or any elementwise callable) turns the values into
    scores chunk by chunk, so no full-size score tensor is made; ``None`` ranks the values
    themselves (signed). Entries where ``keep`` is False get the pruned key. Keys
    are computed per call: the eager path holds one chunk of them at a time. The result is a
    :class:`Keys`, which the eager path also fills into reused buffers.
    """
    return Keys(scores, keep, dtype, transform, protect)


def prune_lowest(
    sources: Sequence[tuple[int, KeyFn]],
    k: int | torch.Tensor,
    *,
    traced: bool,
    device: torch.device,
) -> list[torch.Tensor]:
    """Flat keep-masks (``torch.bool``) that prune the ``k`` lowest keys across all ``sources``.

    ``sources`` are ``(numel, key_fn)`` pairs in tie-break order. ``k`` is an int, or a 0-dim
    integer tensor (which needs ``traced=True``: the count is not known to Python).
    """
    traced = traced or isinstance(k, torch.Tensor)
    if _one_device(sources, probe=not traced) or traced:
        return _prune_lowest_traced(sources, k)
    stream = _Stream(sources, device, _Buffers(device), cache=True)
    stream.owns_buffers = True
    (keeps,) = _drive([_select_streaming(stream, int(k))])
    return keeps


def prune_lowest_each(
    sources: Sequence[tuple[int, KeyFn]],
    ks: Sequence[int | torch.Tensor],
    *,
    traced: bool,
    device: torch.device,
) -> list[torch.Tensor]:
    """Flat keep-masks that prune the ``ks[i]`` lowest keys of each source on its own.

    The per-leaf counterpart of :func:`prune_lowest` (one independent ranking per source, the
    same tie-break within each). In eager code, sources of at most ``EACH_SMALL`` entries are
    selected in batches of equal sizes and counts (a row per source: ``kthvalue`` along rows
    and a tie split by ``cumsum``); larger ones run the streaming select side by side, so the
    host reads a few small tensors per pass for all of them together, never per source.
    """
    sources, ks = list(sources), list(ks)
    if len(sources) != len(ks):
        raise ValueError(f"Expected one count per source, got {len(ks)} for {len(sources)} sources.")
    if traced or _wrapped(sources):
        return [_prune_lowest_traced([source], k)[0] for source, k in zip(sources, ks, strict=True)]
    counts = _host_ints(ks)
    keeps: list[torch.Tensor | None] = [None] * len(sources)
    small: dict = {}
    large = []
    for index, ((numel, key_fn), k) in enumerate(zip(sources, counts, strict=True)):
        if k <= 0 or k >= numel:
            keeps[index] = torch.full((numel,), k <= 0, dtype=torch.bool, device=device)
        elif numel <= EACH_SMALL:
            small.setdefault((numel, k, _dtype_of([(numel, key_fn)])), []).append(index)
        else:
            large.append(index)
    buffers = _Buffers(device)
    streams = [_Stream([sources[i]], device, buffers, cache=False) for i in large]
    for stream in streams:  # every mask first, before any scratch (see _Stream.allocate)
        stream.allocate()
    generators = [_select_streaming(stream, counts[i]) for stream, i in zip(streams, large, strict=True)]
    generators += [
        _select_rows(sources, indices, numel, k, dtype, device, buffers, keeps)
        for (numel, k, dtype), indices in small.items()
    ]
    # The large sources' results come first; the small groups' results (written into keeps) follow.
    for index, result in zip(large, _drive(generators), strict=False):
        keeps[index] = result[0]
    return keeps  # type: ignore[return-value]


# Leaves of fewer entries than this are packed side by side into shared chunks (their keys
# written into the chunk buffer one after the other, their masks views of one bool tensor per
# chunk); larger leaves get chunks of their own.
PACK = 1 << 18
# prune_lowest_each selects sources of at most this many entries in batched rows, in batches of
# at most ROWS entries (or one source).
EACH_SMALL = 1 << 14
ROWS = 1 << 16
# On CUDA, chunks of this many entries (a 4 MiB chunk is shorter than the launches of its ops).
CUDA_CHUNK = 1 << 24
# The histogram kernel. None: by device type, ``torch.bincount`` on the CPU, and elsewhere
# ``index_add_`` into fixed bins (CUDA's bincount reads its input's min and max on the host, two
# syncs per call), with the entries of the bins that out-of-range keys clamp into spread over
# ``_SPREAD`` extra bins each, so that no bin takes most of the atomic increments. True / False
# force one kernel (tests run the CUDA one on the CPU).
SCATTER_HISTOGRAM: bool | None = None
_SPREAD = 256


def _tensors_of(key_fn: KeyFn) -> list[torch.Tensor]:
    if not isinstance(key_fn, Keys):
        return []
    keep = getattr(key_fn, "flat_keep", None)
    return [key_fn.flat_scores] if keep is None else [key_fn.flat_scores, keep]


def _wrapped(sources: Sequence[tuple[int, KeyFn]]) -> bool:
    """True when a source's scores or mask are batched by a transform the caller did not see.

    (A batched seed makes batched random scores from unbatched params, say.) Then the traced
    path runs, which is correct under every transform.
    """
    is_wrapped = _torch.is_functorch_wrapped
    for _, key_fn in sources:
        if isinstance(key_fn, Keys):
            keep = key_fn.flat_keep
            if is_wrapped(key_fn.flat_scores) or (keep is not None and is_wrapped(keep)):
                return True
    return False


def _one_device(sources: Sequence[tuple[int, KeyFn]], probe: bool) -> bool:
    """Check that ``sources`` live on one device (one ranking is computed on one device); with
    ``probe``, also returns :func:`_wrapped` of them, from the same pass."""
    is_wrapped = _torch.is_functorch_wrapped if probe else (lambda t: False)
    first, wrapped = None, False
    for _, key_fn in sources:
        if isinstance(key_fn, Keys):
            scores, keep = key_fn.flat_scores, key_fn.flat_keep
            device = scores.device
            first = device if first is None else first
            if device != first or (keep is not None and keep.device != first):
                break
            wrapped = wrapped or is_wrapped(scores) or (keep is not None and is_wrapped(keep))
    else:
        return wrapped
    devices: dict = {}
    for index, (_, key_fn) in enumerate(sources):
        for t in _tensors_of(key_fn):
            devices.setdefault(t.device, []).append(index)
    where = "; ".join(f"{d}: leaves {sorted(set(i))[:5]}" for d, i in devices.items())
    raise ValueError(
        f"Expected every leaf of one global selection (and its scores and masks) on one device, "
        f"got several ({where}); move them to one device, or select per device."
    )


def _host_ints(values: Sequence[int | torch.Tensor]) -> list[int]:
    """Python ints of ``values``: the tensors among them are read in one host sync per device."""
    out = [v if not isinstance(v, torch.Tensor) else None for v in values]
    tensors = [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    by_device: dict = {}
    for i, v in tensors:
        by_device.setdefault(v.device, []).append((i, v))
    for items in by_device.values():
        read = torch.stack([v.reshape(()).to(torch.int64) for _, v in items]).tolist()
        for (i, _), value in zip(items, read, strict=True):
            out[i] = int(value)
    return out  # type: ignore[return-value]


def _drive(generators: list[_Steps]) -> list:
    """Run selection generators side by side; each yields tensors whose values it needs.

    A generator yields a list of 0-dim or 1-dim integer tensors and is sent back their values
    (lists of ints). All the tensors requested at one step are read in one host sync per device,
    so the number of syncs is the number of steps, whatever the number of generators.
    """
    results: list = [None] * len(generators)
    pending: dict = {}

    def advance(i: int, value: Any) -> None:
        try:
            pending[i] = generators[i].send(value)
        except StopIteration as stop:
            pending.pop(i, None)
            results[i] = stop.value

    for i in range(len(generators)):
        advance(i, None)
    while pending:
        requests = dict(pending)
        by_device: dict = {}
        for _i, tensors in requests.items():
            for tensor in tensors:
                by_device.setdefault(tensor.device, []).append(tensor.reshape(-1).to(torch.int64))
        values = {device: iter(torch.cat(parts).tolist()) for device, parts in by_device.items()}
        for i, tensors in requests.items():
            answer = []
            for tensor in tensors:
                it = values[tensor.device]
                answer.append([next(it) for _ in range(max(tensor.numel(), 1))])
            advance(i, answer)
    return results


def _prune_lowest_traced(sources: Sequence[tuple[int, KeyFn]], k: int | torch.Tensor) -> list[torch.Tensor]:
    n = sum(numel for numel, _ in sources)
    if n <= TRACED_SORT:
        flat = torch.cat([key_fn(0, numel) for numel, key_fn in sources])
    else:  # keys made a slice at a time, so that their temporaries are a slice's
        step = max(TRACED_SLICE, -(-n // _TRACED_SLICES))
        flat = torch.cat(
            [key_fn(a, min(a + step, numel)) for numel, key_fn in sources for a in range(0, numel, step)]
        )
    if isinstance(k, torch.Tensor):
        k = k.to(flat.device)
    keep = _keep_traced_sort(flat, k) if n <= TRACED_SORT else _keep_traced_radix(flat, k, n)
    return list(torch.split(keep, [numel for numel, _ in sources]))


# The traced path sorts at most this many keys (36 bytes per key at the sort); above, it runs a
# radix select of fixed passes over slices (about 6-7 bytes per key, see _keep_traced_radix).
TRACED_SORT = 1 << 20
# ... in slices of at least this many keys, and at most _TRACED_SLICES slices (a graph of
# bounded size under torch.compile).
TRACED_SLICE = 1 << 22
_TRACED_SLICES = 16


def _keep_traced_sort(flat: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """Keep-mask of all but the ``k`` lowest keys: a stable sort and a rank comparison."""
    order = torch.argsort(flat, stable=True)
    positions = torch.arange(flat.shape[0], device=flat.device)
    ranks = torch.zeros_like(order).scatter(0, order, positions)
    return ranks >= k


def _keep_traced_radix(flat: torch.Tensor, k: int | torch.Tensor, n: int) -> torch.Tensor:
    """:func:`_keep_traced_sort` without a sort: a radix select in a fixed number of passes.

    Every pass makes a histogram (``index_add``, functional) of the next 16-bit digit of the
    keys that share the digits found so far (the others go to an extra bin), and picks the digit
    of the k-th key with ``searchsorted``; then the mask is ``key > t``, plus the ties at ``t``
    whose rank among the ties (a ``cumsum``) is past ``k - below``. Shapes never depend on
    values and nothing is read on the host, so it runs under ``vmap`` and ``torch.compile``.
    The work runs over slices, so its temporaries are a slice's: the keys (4 or 8 bytes per
    entry) and the mask are the only full-size tensors.
    """
    device = flat.device
    width = torch.iinfo(flat.dtype).bits
    step = max(TRACED_SLICE, -(-n // _TRACED_SLICES))
    slices = [(a, min(a + step, n)) for a in range(0, n, step)]
    want = torch.clamp(torch.as_tensor(k, device=device), 1, n).to(torch.int64)
    below = torch.zeros((), dtype=torch.int64, device=device)
    prefix: torch.Tensor | None = None
    for shift in range(width - _DIGIT, -1, -_DIGIT):
        hist = torch.zeros((1 << _DIGIT) + 1, dtype=torch.int64, device=device)
        for a, b in slices:
            part = flat[a:b]
            digit = part >> shift
            if prefix is None:
                digit = digit + (1 << (_DIGIT - 1))  # the top digit is signed
            else:
                digit = torch.where((part >> (shift + _DIGIT)) == prefix, digit & 0xFFFF, 1 << _DIGIT)
            ones = torch.ones((), dtype=torch.int64, device=device).expand(b - a)
            hist = hist.index_add(0, digit.to(torch.int64), ones)
        counts = hist[: 1 << _DIGIT]
        cumulative = counts.cumsum(0)
        digit_of_k = torch.searchsorted(cumulative, (want - below).reshape(1))
        below = below + (cumulative - counts).gather(0, digit_of_k).reshape(())
        found = digit_of_k.reshape(())
        prefix = found - (1 << (_DIGIT - 1)) if prefix is None else (prefix << _DIGIT) | found
    assert prefix is not None  # the loop over the digits ran
    threshold = prefix
    ties_to_prune = torch.as_tensor(k, device=device) - below
    parts, seen = [], torch.zeros((), dtype=torch.int64, device=device)
    for a, b in slices:
        part = flat[a:b]
        tie = part == threshold
        rank = torch.cumsum(tie, 0, dtype=torch.int64 if b - a >= 2**31 else torch.int32) + seen
        parts.append((part > threshold) | (tie & (rank > ties_to_prune)))
        seen = seen + tie.sum()
    return torch.cat(parts)


class _Chunk:
    """Entries whose keys sit side by side in the key buffer: ``(source, start, stop)`` pieces."""

    __slots__ = ("pieces", "runs", "size")

    def __init__(self, pieces: list[tuple[int, int, int]]) -> None:
        self.pieces = pieces
        self.runs: list | None = None  # how _fill writes the keys, worked out on first use
        self.size = sum(stop - start for _, start, stop in pieces)


def _plan(sizes: Sequence[int], chunk: int) -> list[_Chunk]:
    """Chunks in tie-break order: small sources packed whole, large ones cut into chunks of their own.

    Packed chunks hold up to ``max(largest source, min(PACK, max(total / 8, 2**17)))`` entries
    (at most ``chunk``), so the buffers are no larger than the largest leaf's chunk needs, or an
    eighth of the data, or ``PACK`` entries.
    """
    chunks: list[_Chunk] = []
    current: list = []
    filled = 0
    # Sized to the data: a packed chunk holds at most an eighth of all entries (and at least
    # 2**17, or the largest source), so that the buffers of a small model stay small (smaller
    # chunks cost a histogram of 2**16 bins each).
    largest = max(sizes, default=0)
    capacity = min(chunk, max(largest, min(PACK, max(sum(sizes) // 8, 1 << 17))))
    for index, numel in enumerate(sizes):
        if numel == 0:
            continue
        if numel >= PACK or numel > chunk or filled + numel > capacity:
            if current:
                chunks.append(_Chunk(current))
            current, filled = [], 0
        if numel >= PACK or numel > chunk:
            for start in range(0, numel, chunk):
                chunks.append(_Chunk([(index, start, min(start + chunk, numel))]))
        else:
            current.append((index, 0, numel))
            filled += numel
    if current:
        chunks.append(_Chunk(current))
    return chunks


class _Buffers:
    """Reused scratch tensors of up to ``CHUNK`` entries, one per (name, dtype), made on first use."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = device
        self.store: dict = {}

    def get(self, name: str, dtype: torch.dtype, size: int) -> torch.Tensor:
        buffer = self.store.get((name, dtype))
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, min(CHUNK, 1 << 16)), dtype=dtype, device=self.device)
            self.store[(name, dtype)] = buffer
        return buffer[:size]

    def drop(self, prefix: str) -> None:
        """Let go of the buffers whose name starts with ``prefix`` (memory the masks can take)."""
        for key in [key for key in self.store if key[0].startswith(prefix)]:
            del self.store[key]


class _Stream:
    """The eager path's view of the sources: a plan of chunks and the key buffers they fill."""

    def __init__(
        self, sources: Sequence[tuple[int, KeyFn]], device: torch.device | str, buffers: _Buffers, cache: bool
    ) -> None:
        self.sources = list(sources)
        self.sizes = [numel for numel, _ in self.sources]
        self.total = sum(self.sizes)
        self.chunk = CHUNK if torch.device(device).type != "cuda" else max(CHUNK, CUDA_CHUNK)
        self.plan = _plan(self.sizes, self.chunk)
        self.device = device
        self.buffers = buffers
        live = [(numel, key_fn) for numel, key_fn in self.sources if numel > 0]
        self.dtype = _dtype_of(live)
        self.nonnegative = all(getattr(key_fn, "nonnegative", False) for _, key_fn in live)
        # Distinct NaN keys are harmless unless the threshold reaches +inf (see _kth_key). Keys
        # of a single chunk are computed once and kept (exact, with one NaN key).
        self.cache = cache and len(self.plan) == 1
        self.one_nan = self.cache
        self.cached: torch.Tensor | None = None
        self.masks: tuple | None = None
        self.owns_buffers = False  # no other stream uses its buffers (see _select_streaming)

    def allocate(self) -> tuple:
        """The masks (``(keeps, targets)``: one bool tensor per source, and the target of each
        chunk in the plan), made once, before the selection makes any scratch tensor.

        Made first, in one go, the masks of a call take the memory the masks of the call before
        left (the same sizes in the same order), and the scratch made after them cannot split
        it: repeated calls (iterative pruning) stay at the masks plus one call's scratch. (Made
        after the scratch, they could not reuse those blocks once scratch had been carved out
        of them, and a process's memory grew by whole masks from call to call.) A mask costs
        no memory until it is written.
        """
        if self.masks is None:
            keeps: list[torch.Tensor | None] = [None] * len(self.sizes)
            targets = []
            for chunk in self.plan:
                if len(chunk.pieces) == 1:
                    index, start, stop = chunk.pieces[0]
                    keep = keeps[index]
                    if keep is None:
                        keep = keeps[index] = torch.empty(
                            self.sizes[index], dtype=torch.bool, device=self.device
                        )
                    targets.append(keep[start:stop])
                else:
                    target = torch.empty(chunk.size, dtype=torch.bool, device=self.device)
                    views = target.split([stop - start for _, start, stop in chunk.pieces])
                    for (index, _, _), view in zip(chunk.pieces, views, strict=True):
                        keeps[index] = view
                    targets.append(target)
            self.masks = (keeps, targets)
        return self.masks

    @property
    def key_buffer(self) -> torch.Tensor:
        return self.buffers.get(
            "key", self.dtype, min(self.chunk, max([c.size for c in self.plan], default=1))
        )

    @property
    def work_buffer(self) -> torch.Tensor:
        return self.buffers.get(
            "work", self.dtype, min(self.chunk, max([c.size for c in self.plan], default=1))
        )

    def scratch(self, chunk: _Chunk, key: torch.Tensor) -> torch.Tensor:
        """Where a pass may write a chunk's derived values (digits, comparisons): over its keys
        (they are made again for each pass), unless they are the cached keys of a single chunk."""
        return self.work_buffer[: chunk.size] if key is self.cached else key

    def chunks(self) -> Iterator[tuple[_Chunk, torch.Tensor]]:
        """``(chunk, keys)`` for every chunk, in tie-break order."""
        for chunk in self.plan:
            yield chunk, self.fill(chunk)

    def fill(self, chunk: _Chunk) -> torch.Tensor:
        if self.cached is not None:
            return self.cached
        key = self.buffers.get("key", self.dtype, chunk.size)
        _fill(self, chunk, key)
        if self.cache:
            self.cached = key
        return key


def _dtype_of(sources: Sequence[tuple[int, KeyFn]]) -> torch.dtype:
    for _, key_fn in sources:
        if isinstance(key_fn, Keys):
            return key_fn.dtype
    return sources[0][1](0, 1).dtype if sources else torch.int32


def _signature(key_fn: KeyFn) -> tuple | None:
    """Key functions with equal signatures fill the buffer in one batched call (None: alone)."""
    if type(key_fn) is not Keys or not hasattr(key_fn, "flat_scores"):
        return None
    if key_fn.flat_protect is not None:
        return None  # protected entries (min_keep): leaf by leaf, through Keys.into
    transform = key_fn.transform
    if not (transform is None or transform is torch.abs or isinstance(transform, Magnitude)):
        return None  # a per-leaf transform (normalize=): leaf by leaf
    return (key_fn.magnitude32, key_fn.flat_scores.dtype, transform, key_fn.flat_keep is None, key_fn.dtype)


def _fill(stream: _Stream, chunk: _Chunk, out: torch.Tensor) -> None:
    """Write the keys of ``chunk`` into ``out`` side by side; runs of alike leaves in one call."""
    runs = chunk.runs
    if runs is None:
        runs = chunk.runs = _runs(stream, chunk.pieces)
    position = 0
    for size, single, run in runs:
        segment = out[position : position + size]
        if single is not None:
            _fill_one(single[0], single[1], single[2], segment, stream.one_nan)
        else:
            _fill_run(run, segment, stream)
        position += size


# A run of alike Keys: the first one, the scores of each piece, their prior keep-masks.
_Run = tuple["Keys", list[torch.Tensor], list[torch.Tensor] | None]


def _runs(stream: _Stream, pieces: list[tuple[int, int, int]]) -> list:
    """``pieces`` grouped into runs of alike :class:`Keys`: ``(size, (key_fn, start, stop) or None, run)``."""
    runs: list[tuple[int, tuple[KeyFn, int, int] | None, _Run | None]] = []
    i = 0
    signatures = [_signature(stream.sources[index][1]) for index, _, _ in pieces]
    while i < len(pieces):
        index, start, stop = pieces[i]
        j = i + 1
        if signatures[i] is not None:
            while j < len(pieces) and signatures[j] == signatures[i]:
                j += 1
        size = sum(b - a for _, a, b in pieces[i:j])
        if j - i == 1:
            runs.append((size, (stream.sources[index][1], start, stop), None))
        else:
            fns = [cast(Keys, stream.sources[x][1]) for x, _, _ in pieces[i:j]]  # alike Keys (signatures)
            scores = [
                fn.flat_scores if (a == 0 and b == fn.flat_scores.shape[0]) else fn.flat_scores[a:b]
                for fn, (_, a, b) in zip(fns, pieces[i:j], strict=True)
            ]
            keeps = None
            if fns[0].flat_keep is not None:  # alike signatures: all of the run have one
                keeps = [
                    cast(torch.Tensor, fn.flat_keep)[a:b]
                    for fn, (_, a, b) in zip(fns, pieces[i:j], strict=True)
                ]
            runs.append((size, None, (fns[0], scores, keeps)))
        i = j
    return runs


def _fill_one(key_fn: KeyFn, start: int, stop: int, out: torch.Tensor, one_nan: bool) -> None:
    if isinstance(key_fn, Keys):
        key_fn.into(start, stop, out, one_nan)
    else:
        out.copy_(key_fn(start, stop))


def _fill_run(run: _Run, out: torch.Tensor, stream: _Stream) -> None:
    """Keys of several alike :class:`Keys` (same score dtype and transform) written in one go."""
    first, scores, keeps = run
    size = out.numel()
    dtype = first.flat_scores.dtype
    if first.magnitude32:
        if dtype == torch.float32:
            torch.cat(scores, out=out.view(torch.float32))
        else:
            values = stream.buffers.get("values", dtype, size)
            torch.cat(scores, out=values)
            out.view(torch.float32).copy_(values)
        torch.bitwise_and(out, _ABS32, out=out)
        if stream.one_nan:
            torch.clamp(out, max=_NAN32, out=out)
    else:
        values = stream.buffers.get("values", dtype, size)
        torch.cat(scores, out=values)
        out.copy_(orderable(values if first.transform is None else first.transform(values), first.dtype))
    if keeps is not None:
        keep = stream.buffers.get("keep", torch.bool, size)
        torch.cat(keeps, out=keep)
        low = torch.full((), first.low, dtype=out.dtype, device=out.device)
        torch.where(keep, out, low, out=out)


def _select_streaming(stream: _Stream, k: int) -> _Steps:
    """Generator (see :func:`_drive`): the keep-masks of the ``k`` lowest keys of ``stream``."""
    device = stream.device
    if k <= 0 or k >= stream.total:
        return [torch.full((numel,), k <= 0, dtype=torch.bool, device=device) for numel in stream.sizes]
    stream.allocate()
    threshold, below, ties = yield from _kth_key(stream, k, stream.total)
    if stream.owns_buffers:  # the histograms are done with: their memory is free for the masks
        stream.buffers.drop("hist")
    return (yield from _mask_pass(stream, threshold, k - below, ties))


def _mask_pass(stream: _Stream, threshold: int, ties_to_prune: int, ties: int) -> _Steps:
    """Generator: write the masks: keys above ``threshold`` kept, the first ``ties_to_prune`` ties pruned.

    Without a split (every tie pruned) this is one comparison per entry. With one, a guess of
    where the split lies (ties assumed spread evenly) says which chunks prune their ties (before
    it) and which keep them (after it); the ties of each chunk are counted on the way and read
    in one sync, and only the chunks that the guess got wrong are computed again, with the split
    as a tensor program (a ``cumsum`` of the ties): no read per chunk, no ``nonzero``.
    """
    device = stream.device
    keeps, targets = stream.allocate()
    keeps = list(keeps)
    split = ties_to_prune < ties
    guess = (stream.total * ties_to_prune) // ties if split else 0
    counts, wrote_ge, position = [], [], 0
    for (chunk, key), target in zip(stream.chunks(), targets, strict=True):
        ge = split and position >= guess
        if split:
            tie = torch.eq(key, threshold, out=stream.buffers.get("tie", torch.bool, chunk.size))
            counts.append(torch.count_nonzero(tie))
            wrote_ge.append(ge)
        _compare(key, threshold, ge, target)
        position += chunk.size
    if split:
        (tie_counts,) = yield [torch.stack(counts)]
        before = 0
        for chunk, target, count, ge in zip(stream.plan, targets, tie_counts, wrote_ge, strict=True):
            if count:
                pruned = min(max(ties_to_prune - before, 0), count)  # ties of this chunk to prune
                if not ((pruned == count and not ge) or (pruned == 0 and ge)):
                    _split_ties(stream.fill(chunk), threshold, pruned, target)
            before += count
    for index, numel in enumerate(stream.sizes):
        if keeps[index] is None:
            keeps[index] = torch.ones(numel, dtype=torch.bool, device=device)
    return keeps


# The tie split of a chunk runs over pieces of this many keys, so that its temporaries (the ties,
# their ranks) are a piece's, not a chunk's.
_SPLIT_PIECE = 1 << 16


def _split_ties(key: torch.Tensor, threshold: int, pruned: int, target: torch.Tensor) -> None:
    """``target``: keys above ``threshold`` kept, and the ties at it after the first ``pruned``.

    A running count of the ties seen (a 0-dim tensor, never read) carries the ranks from piece
    to piece: no host read.
    """
    seen = torch.zeros((), dtype=torch.int64, device=key.device)
    for start in range(0, key.numel(), _SPLIT_PIECE):
        part = key[start : start + _SPLIT_PIECE]
        tie = torch.eq(part, threshold)
        rank = torch.cumsum(tie, 0, dtype=torch.int64).add_(seen)  # ranks among all ties so far
        keep = target[start : start + _SPLIT_PIECE]
        _compare(part, threshold, False, keep)
        keep.logical_or_(tie.logical_and_(rank > pruned))
        seen = rank[-1]


def _compare(key: torch.Tensor, threshold: int | torch.Tensor, ge: bool, target: torch.Tensor) -> None:
    """``target = key > threshold`` (``>=`` with ``ge``), ``target`` a bool tensor.

    On the CPU a comparison writes uint8 faster than bool (docs/performance.md), so it writes
    the 0/1 bytes of ``target`` through a uint8 view.
    """
    op = torch.ge if ge else torch.gt
    op(key, threshold, out=target.view(torch.uint8) if key.device.type == "cpu" else target)


def _select_rows(
    sources: Sequence[tuple[int, KeyFn]],
    indices: list[int],
    numel: int,
    k: int,
    dtype: torch.dtype,
    device: torch.device | str,
    buffers: _Buffers,
    keeps: list[torch.Tensor | None],
) -> _Steps:
    """Generator: the masks of the sources ``indices`` (all of ``numel`` entries, count ``k``) in rows.

    Batches of at most ``ROWS`` entries: their keys side by side in the key buffer, viewed as
    ``(rows, numel)``; ``kthvalue`` along the rows gives each row's threshold, a comparison its
    mask, and rows whose threshold ties are split get a ``cumsum`` of their ties. The masks are
    rows of one bool tensor per batch. One host read for the whole group.
    """
    rows_per = max(1, min(CHUNK, ROWS) // numel)  # kthvalue copies its rows: small batches
    stream = _Stream([sources[i] for i in indices], device, buffers, cache=False)
    stream.one_nan = True
    pending = []
    for first in range(0, len(indices), rows_per):
        batch = _Chunk([(b, 0, numel) for b in range(first, min(first + rows_per, len(indices)))])
        rows = len(batch.pieces)
        key = buffers.get("key", dtype, batch.size)
        _fill(stream, batch, key)
        key = key.view(rows, numel)
        threshold = key.kthvalue(k, dim=1, keepdim=True).values
        target = torch.empty(rows, numel, dtype=torch.bool, device=device)
        _compare(key, threshold, False, target)
        # A row splits its ties when more than k keys are at most its threshold.
        at_most = rows * numel - torch.count_nonzero(target)
        for (b, _, _), row in zip(batch.pieces, target, strict=True):
            keeps[indices[b]] = row
        pending.append((batch, threshold, target, at_most > rows * k))
    (splits,) = yield [torch.stack([p[3] for p in pending])]
    for (batch, threshold, target, _), split in zip(pending, splits, strict=True):
        if split:
            key = buffers.get("key", dtype, batch.size)
            _fill(stream, batch, key)
            key = key.view(len(batch.pieces), numel)
            tie = torch.eq(key, threshold)
            below = torch.lt(key, threshold).sum(1, keepdim=True, dtype=torch.int32)
            rank = torch.cumsum(tie, 1, dtype=torch.int32)
            torch.logical_or(torch.gt(key, threshold), tie & (rank > k - below), out=target)
    return None


def lowest_in_rows(
    key: torch.Tensor, k: int, out: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Eager: ``out`` (``(rows, n)`` bool) keeps the keys of each row of ``key`` above its k-th lowest.

    Returns the thresholds (``(rows, 1)``) and a 0-dim bool tensor that is True when some row
    holds more than ``k`` keys at or below its threshold: its ties must then be split by
    position (:func:`split_rows`, with the same keys). ``(None, None)`` for ``k <= 0`` or
    ``k >= n`` (every row kept or pruned whole). ``topk`` of the ``k`` lowest (unsorted) and
    their maximum is the threshold: faster than ``kthvalue`` along rows on the CPU.
    """
    rows, n = key.shape
    if k <= 0 or k >= n:
        out.fill_(k <= 0)
        return None, None
    threshold = key.topk(k, dim=1, largest=False, sorted=False).values.amax(1, keepdim=True)
    _compare(key, threshold, False, out)
    return threshold, (rows * n - torch.count_nonzero(out)) > rows * k


def split_rows(key: torch.Tensor, threshold: torch.Tensor, k: int, out: torch.Tensor) -> None:
    """Fix ``out`` of :func:`lowest_in_rows` where rows tie at their threshold: the first ties
    (by position) of each row are pruned until the row has lost exactly ``k``."""
    tie = torch.eq(key, threshold)
    below = torch.lt(key, threshold).sum(1, keepdim=True, dtype=torch.int32)
    rank = torch.cumsum(tie, 1, dtype=torch.int32)
    torch.logical_or(torch.gt(key, threshold), tie & (rank > k - below), out=out)


def _kth_key(stream: _Stream, k: int, total: int) -> _Steps:
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
        next_shift = max(shift - _DIGIT, 0)
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
        if not stream.one_nan and stream.dtype == torch.int32 and low + (1 << shift) > _INF32:
            # The k-th key may be +inf or a NaN: start again with every NaN on one key.
            stream.one_nan = True
            return (yield from _kth_key(stream, k + below, total))
    return low, below, in_range


def _before_and_at(cumulative: torch.Tensor, digit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From cumulative counts: how many lie before bin ``digit`` (a 1-element tensor) and in it."""
    at = cumulative.index_select(0, digit)
    before = cumulative.index_select(0, (digit - 1).clamp(min=0)) * (digit > 0)
    return before, at - before


def _kth_key_in_sampled_window(stream: _Stream, k: int, total: int) -> _Steps:
    """Generator: :func:`_kth_key` in one pass when a sample locates the k-th key closely
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
    if threshold >= _INF32 and not stream.one_nan:
        return None  # the k-th key is +inf or a NaN: the radix select merges the NaN keys
    return threshold, below_v + skipped_v, ties


def _sample_window(stream: _Stream, k: int, total: int) -> _Steps:
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
        _fill_one(key_fn, local, stop, sample[filled : filled + stop - local], True)
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
    sample: torch.Tensor, scratch: torch.Tensor, buffers: _Buffers, ranks: tuple[int, ...]
) -> _Steps:
    """Generator: the keys of the given ranks (1-based) among the int32 keys ``sample``, exactly.

    A radix select of two 16-bit digits over the sample, for all ranks at once: the top digits
    (one histogram), then the low digits among the keys that share each rank's top digit (one
    histogram per rank). Two host reads; digits go to ``scratch`` (the sample's size) and counts
    to the call's histogram buffer, so nothing of the sample's size is allocated (a sort would
    allocate a copy and int64 indices).
    """
    half = 1 << (_DIGIT - 1)
    ones = torch.ones((), dtype=torch.int32, device=sample.device).expand(sample.numel())
    torch.bitwise_right_shift(sample, _DIGIT, out=scratch).add_(half)  # top digit, non-negative
    cumulative = buffers.get("hist", torch.int32, 1 << _DIGIT).zero_().index_add_(0, scratch, ones).cumsum_(0)
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
        low = (top - half) << _DIGIT  # the lowest key with this top digit
        # keys below and above the top digit's keys clamp to the bins around them (as in _histogram)
        floor, ceiling = max(low - 1, key_min), min(low + (1 << _DIGIT), key_max)
        digit = torch.clamp(sample, floor, ceiling, out=scratch).sub_(floor)
        hist = buffers.get("hist", torch.int32, (1 << _DIGIT) + 2).zero_().index_add_(0, digit, ones)
        offset = 1 if floor < low else 0
        cumulative = hist[offset : offset + (1 << _DIGIT)].cumsum_(0)
        found.append(torch.searchsorted(cumulative, torch.tensor([rank - skipped], device=sample.device)))
        del hist, cumulative
    request = [torch.cat(found)]
    (lows,) = yield request
    del request
    return tuple(((top - half) << _DIGIT) + low for top, low in zip(tops_v, lows, strict=True))


def _histogram(stream: _Stream, low: int, shift: int, next_shift: int) -> tuple[torch.Tensor, int]:
    """Counts of ``(key - low) >> next_shift`` over keys in ``[low, low + 2**shift)``.

    Returns the histogram and the index of its first in-range bin; the bins just before and
    after the in-range ones count the keys below and above the range.
    """
    key_min, key_max = torch.iinfo(stream.dtype).min, torch.iinfo(stream.dtype).max
    width = torch.iinfo(stream.dtype).bits
    bins = 1 << (shift - next_shift)
    if shift == width:
        # The whole key range: the digit is the top bits, offset to be non-negative.
        offset = 0 if stream.nonnegative else 1 << (_DIGIT - 1)
        first = -offset + (1 << (_DIGIT - 1))
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
        buffers: _Buffers,
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
