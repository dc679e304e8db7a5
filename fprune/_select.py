"""Private: count-exact selection of the lowest scores, within one leaf or across many.

The selection contract, shared by every pruning function in fprune:

* Exactly ``k`` entries are pruned: the ``k`` with the lowest score.
* Ties are broken by position: among equal scores, the entry that comes first is pruned first.
  "First" is row-major (flat) order inside a tensor and, across leaves, the order in which
  optree flattens the pytree (a dict's keys in sorted order).
* ``-0.0`` equals ``0.0``; NaN ranks above ``+inf`` (a NaN score is pruned last), which is what
  ``torch.topk`` does, so torch's masks are reproduced where scores are NaN too.
* Entries that prior masks already pruned rank below everything, so they stay pruned and the
  count includes them.

Two algorithms compute the same masks:

* eager (Python-int ``k``, no transform active): a streaming radix select over order-preserving
  integer keys of the scores, chunk by chunk and leaf by leaf. No concatenated copy of the
  scores is ever built; temporaries are bounded by the chunk size.
* traced (under ``vmap``, ``grad``, ``torch.compile``, or with a tensor ``k``): a stable sort of
  the keys and a rank comparison, free of ``.item()``, data-dependent shapes and Python
  branches on values.
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple, Union

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

# Entries per chunk in the eager path: bounds its temporaries to a few tens of MB.
CHUNK = 1 << 22
# Below this many candidates, the eager path sorts them instead of running another radix pass.
CANDIDATES = 1 << 20
_DIGIT = 16

KeyFn = Callable[[int, int], torch.Tensor]


def is_traced(tensors: Sequence[torch.Tensor]) -> bool:
    """True inside torch.compile, jit tracing, a dispatch mode (make_fx, fake tensors) or torch.func."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    if _get_current_dispatch_mode() is not None:
        return True
    is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(is_wrapped(t) for t in tensors)


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

    >>> k = orderable(torch.tensor([-2.0, -0.0, 0.0, 1.0, float("inf"), float("nan")]), torch.int32)
    >>> bool((k[:-1] <= k[1:]).all()), bool(k[1] == k[2])
    (True, True)
    """
    x = scores.to(torch.float32 if dtype == torch.int32 else torch.float64)
    x = torch.where(torch.isnan(x), float("nan"), x + 0.0)  # one NaN; x + 0.0 turns -0.0 into 0.0
    bits = x.view(dtype)
    width = torch.iinfo(dtype).bits
    return bits ^ ((bits >> (width - 1)) & torch.iinfo(dtype).max)


def keys(
    scores: torch.Tensor,
    keep: Union[torch.Tensor, None],
    dtype: torch.dtype,
    transform: Union[Callable[[torch.Tensor], torch.Tensor], None] = None,
) -> KeyFn:
    """A function ``(start, stop) -> keys`` over the flattened entries of one leaf.

    ``transform`` (say ``torch.abs``) turns the values into scores chunk by chunk, so no
    full-size score tensor is made. Entries where ``keep`` is False get the pruned key. Keys
    are computed per call: the eager path holds one chunk of them at a time.
    """
    flat_scores = scores.reshape(-1)
    flat_keep = None if keep is None else keep.reshape(-1)
    low = pruned_key(dtype)

    def key_fn(start: int, stop: int) -> torch.Tensor:
        chunk = flat_scores[start:stop]
        k = orderable(chunk if transform is None else transform(chunk), dtype)
        if flat_keep is not None:
            k = k.masked_fill(~flat_keep[start:stop], low)
        return k

    return key_fn


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


def _prune_lowest_traced(sources, k) -> List[torch.Tensor]:
    flat = torch.cat([key_fn(0, numel) for numel, key_fn in sources])
    order = torch.argsort(flat, stable=True)
    positions = torch.arange(flat.shape[0], device=flat.device)
    ranks = torch.zeros_like(order).scatter(0, order, positions)
    keep = ranks >= k
    return list(torch.split(keep, [numel for numel, _ in sources]))


def _chunks(numel: int):
    for start in range(0, numel, CHUNK):
        yield start, min(start + CHUNK, numel)


def _prune_lowest_streaming(sources, k: int, device) -> List[torch.Tensor]:
    total = sum(numel for numel, _ in sources)
    if k <= 0:
        return [torch.ones(numel, dtype=torch.bool, device=device) for numel, _ in sources]
    if k >= total:
        return [torch.zeros(numel, dtype=torch.bool, device=device) for numel, _ in sources]
    threshold, below = _kth_key(sources, k, total)
    ties_to_prune = k - below  # >= 1: the k-th lowest key itself equals the threshold
    masks = []
    for numel, key_fn in sources:
        keep = torch.empty(numel, dtype=torch.bool, device=device)
        for start, stop in _chunks(numel):
            key = key_fn(start, stop)
            if ties_to_prune == 0:
                torch.ge(key, threshold, out=keep[start:stop])
                continue
            torch.gt(key, threshold, out=keep[start:stop])
            ties = (key == threshold).nonzero().squeeze(1)
            if ties.numel() > ties_to_prune:
                keep[start:stop][ties[ties_to_prune:]] = True
                ties_to_prune = 0
            else:
                ties_to_prune -= ties.numel()
        masks.append(keep)
    return masks


def _kth_key(sources, k: int, total: int) -> Tuple[int, int]:
    """The k-th lowest key (1-based) and how many keys lie strictly below it.

    Radix select on 16-bit digits from the top: a histogram of the next digit among the keys
    that share the digits found so far picks the digit of the k-th key. Once few enough keys
    remain, they are gathered and sorted.
    """
    width = None
    prefix = None  # the key's bits above ``shift + 16`` are ``prefix`` for keys still in range
    shift = 0
    below = 0
    in_range = total
    while True:
        if width is not None and shift + _DIGIT == 0:
            return prefix, below  # every in-range key equals prefix
        if in_range <= CANDIDATES:
            candidates = []
            for numel, key_fn in sources:
                for start, stop in _chunks(numel):
                    key = key_fn(start, stop)
                    candidates.append(key if prefix is None else key[(key >> (shift + _DIGIT)) == prefix])
            ordered = torch.sort(torch.cat(candidates)).values
            threshold = ordered[k - 1]
            below += int(torch.searchsorted(ordered, threshold))
            return int(threshold), below
        hist = None
        for numel, key_fn in sources:
            for start, stop in _chunks(numel):
                key = key_fn(start, stop)
                if width is None:
                    width = torch.iinfo(key.dtype).bits
                    shift = width - _DIGIT
                if prefix is None:
                    digit = (key >> shift).to(torch.int64) + (1 << (_DIGIT - 1))
                else:
                    key = key[(key >> (shift + _DIGIT)) == prefix]
                    digit = ((key >> shift) & ((1 << _DIGIT) - 1)).to(torch.int64)
                counts = torch.bincount(digit, minlength=1 << _DIGIT)
                hist = counts if hist is None else hist + counts
        cumulative = hist.cumsum(0)
        digit = int(torch.searchsorted(cumulative, k))  # first digit whose cumulative count >= k
        skipped = int(cumulative[digit - 1]) if digit > 0 else 0
        below += skipped
        k -= skipped
        in_range = int(hist[digit])
        prefix = digit - (1 << (_DIGIT - 1)) if prefix is None else (prefix << _DIGIT) | digit
        shift -= _DIGIT
