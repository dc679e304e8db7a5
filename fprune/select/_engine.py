"""Private: the selection engine: count-exact selection of the lowest scores, within one leaf or across many.

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

from collections.abc import Sequence
from typing import Any

import torch

from fprune import _torch
from fprune._torch import is_traced as is_traced  # re-exported (torch internals live in _torch)
from fprune.select import _stream
from fprune.select._groups import lowest_in_groups
from fprune.select._histogram import DIGIT, kth_key
from fprune.select._keys import MAGNITUDE as MAGNITUDE
from fprune.select._keys import KeyFn, Keys
from fprune.select._keys import key_dtype as key_dtype
from fprune.select._keys import keys as keys
from fprune.select._keys import orderable as orderable
from fprune.select._keys import pruned_key as pruned_key
from fprune.select._stream import Buffers, Chunk, Steps, Stream, dtype_of, fill_keys


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
    stream = Stream(sources, device, Buffers(device), cache=True)
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
            small.setdefault((numel, k, dtype_of([(numel, key_fn)])), []).append(index)
        else:
            large.append(index)
    buffers = Buffers(device)
    streams = [Stream([sources[i]], device, buffers, cache=False) for i in large]
    for stream in streams:  # every mask first, before any scratch (see Stream.allocate)
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


# prune_lowest_each selects sources of at most this many entries in batched rows, in batches of
# at most ROWS entries (or one source).
EACH_SMALL = 1 << 14
ROWS = 1 << 16


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


def _drive(generators: list[Steps]) -> list:
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
    for shift in range(width - DIGIT, -1, -DIGIT):
        hist = torch.zeros((1 << DIGIT) + 1, dtype=torch.int64, device=device)
        for a, b in slices:
            part = flat[a:b]
            digit = part >> shift
            if prefix is None:
                digit = digit + (1 << (DIGIT - 1))  # the top digit is signed
            else:
                digit = torch.where((part >> (shift + DIGIT)) == prefix, digit & 0xFFFF, 1 << DIGIT)
            ones = torch.ones((), dtype=torch.int64, device=device).expand(b - a)
            hist = hist.index_add(0, digit.to(torch.int64), ones)
        counts = hist[: 1 << DIGIT]
        cumulative = counts.cumsum(0)
        digit_of_k = torch.searchsorted(cumulative, (want - below).reshape(1))
        below = below + (cumulative - counts).gather(0, digit_of_k).reshape(())
        found = digit_of_k.reshape(())
        prefix = found - (1 << (DIGIT - 1)) if prefix is None else (prefix << DIGIT) | found
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


def _select_streaming(stream: Stream, k: int) -> Steps:
    """Generator (see :func:`_drive`): the keep-masks of the ``k`` lowest keys of ``stream``."""
    device = stream.device
    if k <= 0 or k >= stream.total:
        return [torch.full((numel,), k <= 0, dtype=torch.bool, device=device) for numel in stream.sizes]
    stream.allocate()
    threshold, below, ties = yield from kth_key(stream, k, stream.total)
    if stream.owns_buffers:  # the histograms are done with: their memory is free for the masks
        stream.buffers.drop("hist")
    return (yield from _mask_pass(stream, threshold, k - below, ties))


def _mask_pass(stream: Stream, threshold: int, ties_to_prune: int, ties: int) -> Steps:
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
    buffers: Buffers,
    keeps: list[torch.Tensor | None],
) -> Steps:
    """Generator: the masks of the sources ``indices`` (all of ``numel`` entries, count ``k``) in rows.

    Batches of at most ``ROWS`` entries: their keys side by side in the key buffer, viewed as
    ``(rows, numel)``; ``kthvalue`` along the rows gives each row's threshold, a comparison its
    mask, and rows whose threshold ties are split get a ``cumsum`` of their ties. The masks are
    rows of one bool tensor per batch. One host read for the whole group.
    """
    rows_per = max(1, min(_stream.CHUNK, ROWS) // numel)  # kthvalue copies its rows: small batches
    stream = Stream([sources[i] for i in indices], device, buffers, cache=False)
    stream.one_nan = True
    pending = []
    for first in range(0, len(indices), rows_per):
        batch = Chunk([(b, 0, numel) for b in range(first, min(first + rows_per, len(indices)))])
        rows = len(batch.pieces)
        key = buffers.get("key", dtype, batch.size)
        fill_keys(stream, batch, key)
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
            fill_keys(stream, batch, key)
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


# ---------------------------------------------------------------------------------------------
# The rule on one tensor held whole


def lowest(scores: torch.Tensor, k: Any, *, rows: bool = False) -> torch.Tensor:
    """True at the ``k`` lowest ``scores`` (real, any shape), the rule of every scope: ties go to
    the earlier entry in row-major order. With ``rows``, the ``k`` lowest of every row (the last
    dim), by the per-group program of ``Rows`` and ``NM``. ``k`` an int, or an integer tensor (0-dim;
    with ``rows``, shaped like ``scores`` without its last dim). For code that holds its scores
    whole (``fprune.reconstruct``); re-exported as ``fprune.select.lowest``."""
    if rows:
        flat = scores.reshape(-1, scores.shape[-1]) if scores.dim() else scores.reshape(1, 1)
        dtype = key_dtype([flat])
        keyed = keys(flat, None, dtype)(0, flat.numel()).view(flat.shape)
        k = k.reshape(-1) if isinstance(k, torch.Tensor) and k.dim() else k
        return ~lowest_in_groups(keyed, k).view(scores.shape)
    flat = scores.reshape(-1)
    traced = isinstance(k, torch.Tensor) or is_traced([flat])
    (keep,) = prune_lowest(
        [(flat.numel(), keys(flat, None, key_dtype([flat])))], k, traced=traced, device=flat.device
    )
    return ~keep.view(scores.shape)
