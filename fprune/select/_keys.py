"""Private: the order-preserving integer keys the selection engine ranks (:mod:`fprune.select._engine`).

A score becomes an integer key whose order is the selection's order (``-0.0`` equals ``0.0``, NaN
above ``+inf``, entries that prior masks pruned below everything); :func:`keys` makes them a
chunk at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fprune import _torch

KeyFn = Callable[[int, int], torch.Tensor]

ABS32 = 0x7FFFFFFF
INF32 = 0x7F800000  # bits of float32 +inf
NAN32 = INF32 + 1  # the one key of every float32 NaN: just above +inf
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
    # In place on the fresh tensors each step makes (functionalized under transforms).
    key = (bits >> (width - 1)).bitwise_and_(torch.iinfo(dtype).max).bitwise_xor_(bits)
    return key.masked_fill_(torch.isnan(x), NAN32 if dtype == torch.int32 else _NAN64)


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
            torch.bitwise_and(chunk.view(torch.int32), ABS32, out=out)
            if one_nan:
                torch.clamp(out, max=NAN32, out=out)  # every NaN payload -> one NaN key
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
