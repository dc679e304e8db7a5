"""Private: the eager engine's view of its sources: chunks of keys in reused buffers, and the
masks they are written into (:mod:`fprune.select._engine`)."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import Any, cast

import torch

from fprune.select._keys import ABS32, NAN32, KeyFn, Keys, Magnitude, orderable

# Entries per chunk in the eager path: its buffers are a few of these (4 MiB each for int32).
CHUNK = 1 << 20
# Leaves of fewer entries than this are packed side by side into shared chunks (their keys
# written into the chunk buffer one after the other, their masks views of one bool tensor per
# chunk); larger leaves get chunks of their own.
PACK = 1 << 18
# On CUDA, chunks of this many entries (a 4 MiB chunk is shorter than the launches of its ops).
CUDA_CHUNK = 1 << 24

# A selection generator (see _drive): yields the tensors it needs read, is sent their values.
Steps = Generator[list[torch.Tensor], Any, Any]


class Chunk:
    """Entries whose keys sit side by side in the key buffer: ``(source, start, stop)`` pieces."""

    __slots__ = ("pieces", "runs", "size")

    def __init__(self, pieces: list[tuple[int, int, int]]) -> None:
        self.pieces = pieces
        self.runs: list | None = None  # how fill_keys writes the keys, worked out on first use
        self.size = sum(stop - start for _, start, stop in pieces)


def _plan(sizes: Sequence[int], chunk: int) -> list[Chunk]:
    """Chunks in tie-break order: small sources packed whole, large ones cut into chunks of their own.

    Packed chunks hold up to ``max(largest source, min(PACK, max(total / 8, 2**17)))`` entries
    (at most ``chunk``), so the buffers are no larger than the largest leaf's chunk needs, or an
    eighth of the data, or ``PACK`` entries.
    """
    chunks: list[Chunk] = []
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
                chunks.append(Chunk(current))
            current, filled = [], 0
        if numel >= PACK or numel > chunk:
            for start in range(0, numel, chunk):
                chunks.append(Chunk([(index, start, min(start + chunk, numel))]))
        else:
            current.append((index, 0, numel))
            filled += numel
    if current:
        chunks.append(Chunk(current))
    return chunks


class Buffers:
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


class Stream:
    """The eager path's view of the sources: a plan of chunks and the key buffers they fill."""

    def __init__(
        self, sources: Sequence[tuple[int, KeyFn]], device: torch.device | str, buffers: Buffers, cache: bool
    ) -> None:
        self.sources = list(sources)
        self.sizes = [numel for numel, _ in self.sources]
        self.total = sum(self.sizes)
        self.chunk = CHUNK if torch.device(device).type != "cuda" else max(CHUNK, CUDA_CHUNK)
        self.plan = _plan(self.sizes, self.chunk)
        self.device = device
        self.buffers = buffers
        live = [(numel, key_fn) for numel, key_fn in self.sources if numel > 0]
        self.dtype = dtype_of(live)
        self.nonnegative = all(getattr(key_fn, "nonnegative", False) for _, key_fn in live)
        # Distinct NaN keys are harmless unless the threshold reaches +inf (see kth_key). Keys
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

    def scratch(self, chunk: Chunk, key: torch.Tensor) -> torch.Tensor:
        """Where a pass may write a chunk's derived values (digits, comparisons): over its keys
        (they are made again for each pass), unless they are the cached keys of a single chunk."""
        return self.work_buffer[: chunk.size] if key is self.cached else key

    def chunks(self) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """``(chunk, keys)`` for every chunk, in tie-break order."""
        for chunk in self.plan:
            yield chunk, self.fill(chunk)

    def fill(self, chunk: Chunk) -> torch.Tensor:
        if self.cached is not None:
            return self.cached
        key = self.buffers.get("key", self.dtype, chunk.size)
        fill_keys(self, chunk, key)
        if self.cache:
            self.cached = key
        return key


def dtype_of(sources: Sequence[tuple[int, KeyFn]]) -> torch.dtype:
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


def fill_keys(stream: Stream, chunk: Chunk, out: torch.Tensor) -> None:
    """Write the keys of ``chunk`` into ``out`` side by side; runs of alike leaves in one call."""
    runs = chunk.runs
    if runs is None:
        runs = chunk.runs = _runs(stream, chunk.pieces)
    position = 0
    for size, single, run in runs:
        segment = out[position : position + size]
        if single is not None:
            fill_one(single[0], single[1], single[2], segment, stream.one_nan)
        else:
            _fill_run(run, segment, stream)
        position += size


# A run of alike Keys: the first one, the scores of each piece, their prior keep-masks.
_Run = tuple["Keys", list[torch.Tensor], list[torch.Tensor] | None]


def _runs(stream: Stream, pieces: list[tuple[int, int, int]]) -> list:
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


def fill_one(key_fn: KeyFn, start: int, stop: int, out: torch.Tensor, one_nan: bool) -> None:
    if isinstance(key_fn, Keys):
        key_fn.into(start, stop, out, one_nan)
    else:
        out.copy_(key_fn(start, stop))


def _fill_run(run: _Run, out: torch.Tensor, stream: Stream) -> None:
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
        torch.bitwise_and(out, ABS32, out=out)
        if stream.one_nan:
            torch.clamp(out, max=NAN32, out=out)
    else:
        values = stream.buffers.get("values", dtype, size)
        torch.cat(scores, out=values)
        out.copy_(orderable(values if first.transform is None else first.transform(values), first.dtype))
    if keeps is not None:
        keep = stream.buffers.get("keep", torch.bool, size)
        torch.cat(keeps, out=keep)
        low = torch.full((), first.low, dtype=out.dtype, device=out.device)
        torch.where(keep, out, low, out=out)
