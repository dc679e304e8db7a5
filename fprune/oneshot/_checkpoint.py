"""A transformers checkpoint directory, read one tensor at a time, and its copy written in the
source's layout: each output shard has its source shard's header and offsets, so every tensor's
bytes go to a known place as soon as they are final."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import struct
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PARTIAL = ".partial"  # the suffix of an output shard until the run finishes
# Files copied beside the weights when the source has them (generation config, tokenizer).
EXTRAS = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
_CHUNK = 16 << 20  # bytes copied at a time


class Entry(NamedTuple):
    """Where one tensor's bytes are: its shard file, dtype and shape as written, and the
    absolute byte range ``[start, end)`` in the file."""

    shard: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class Checkpoint(NamedTuple):
    """A checkpoint directory's weights: the shards (file name -> header size in bytes,
    header included), every tensor's entry, and the index file's name (None for one shard)."""

    path: pathlib.Path
    shards: dict[str, int]
    entries: dict[str, Entry]
    index_file: str | None


def _not_a_checkpoint(source: Any, why: str) -> ValueError:
    return ValueError(
        f"Expected source to be a transformers checkpoint directory (config.json, and "
        f"{SINGLE} or {INDEX} with its shards), got {str(source)!r}: {why}."
    )


def read(source: Any) -> Checkpoint:
    """The checkpoint at ``source``, its index and every shard's header checked."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"Expected source to be a path (str or os.PathLike), got {type(source).__name__}.")
    path = pathlib.Path(source)
    if not path.is_dir():
        raise _not_a_checkpoint(source, "no such directory")
    if not (path / CONFIG).is_file():
        raise _not_a_checkpoint(source, f"it has no {CONFIG}")
    if (path / INDEX).is_file():
        index: str | None = INDEX
        try:
            weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as error:
            raise _not_a_checkpoint(source, f"its {INDEX} holds no weight_map ({error})") from error
        if not isinstance(weight_map, dict):
            raise _not_a_checkpoint(source, f"the weight_map of its {INDEX} is not a dict")
        shards = sorted(set(weight_map.values()))
    elif (path / SINGLE).is_file():
        index, weight_map, shards = None, {}, [SINGLE]
    else:
        raise _not_a_checkpoint(source, f"it has neither {SINGLE} nor {INDEX}")
    missing = [shard for shard in shards if not (path / str(shard)).is_file()]
    if missing:
        raise ValueError(
            f"The index {str(path / INDEX)!r} maps tensors to shard(s) {', '.join(map(repr, missing))}, "
            f"which are not in the checkpoint directory; the checkpoint is incomplete."
        )
    sizes: dict[str, int] = {}
    entries: dict[str, Entry] = {}
    for shard in shards:
        sizes[shard], found = _header(path / shard)
        for name, entry in found.items():
            if name in entries:
                raise ValueError(f"Tensor {name!r} is in two shards, {entries[name].shard!r} and {shard!r}.")
            entries[name] = entry
    for name, shard in weight_map.items():
        if name not in entries or entries[name].shard != shard:
            raise ValueError(
                f"The index {str(path / INDEX)!r} maps tensor {name!r} to shard {shard!r}, whose "
                f"header has no such tensor; the checkpoint is inconsistent."
            )
    if index is not None:
        unlisted = sorted(name for name in entries if name not in weight_map)
        if unlisted:
            raise ValueError(
                f"The index {str(path / INDEX)!r} leaves out tensor(s) {', '.join(map(repr, unlisted[:5]))} "
                f"that shard {entries[unlisted[0]].shard!r} holds; the checkpoint is inconsistent."
            )
    return Checkpoint(path, sizes, entries, index)


def _header(file: pathlib.Path) -> tuple[int, dict[str, Entry]]:
    """A safetensors file's header: ``(8 + header length, {tensor: entry})``."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if length < 2 or 8 + length > size:
            raise ValueError(f"{str(file)!r} is not a safetensors file (its header length is wrong).")
        try:
            header = json.loads(f.read(length))
        except ValueError as error:
            raise ValueError(f"{str(file)!r} is not a safetensors file ({error}).") from error
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        entries[name] = Entry(
            file.name, info["dtype"], tuple(info["shape"]), 8 + length + begin, 8 + length + end
        )
    return 8 + length, entries


# Reading

_TORCH_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


class Reader:
    """Tensors read one at a time from a checkpoint's shards into fresh memory, with
    ``os.preadv`` at the offsets of the shard's header. No memory map: the pages of a private
    mapping that a process then writes (the pruned weights, in place) would stay in its memory
    as long as the mapping, so memory would grow with every block."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.files: dict[str, int] = {}

    def get(self, key: str) -> torch.Tensor:
        entry = self.checkpoint.entries[key]
        if entry.dtype not in _TORCH_DTYPES:
            raise ValueError(
                f"Tensor {key!r} in {entry.shard!r} has dtype {entry.dtype}, which torch has not."
            )
        if entry.shard not in self.files:
            self.files[entry.shard] = os.open(self.checkpoint.path / entry.shard, os.O_RDONLY)
        out = torch.empty(entry.end - entry.start, dtype=torch.uint8)
        view, at = memoryview(out.numpy()).cast("B"), entry.start  # type: ignore[arg-type]
        while len(view):
            done = os.preadv(self.files[entry.shard], [view], at)
            if not done:
                raise OSError(f"{entry.shard}: unexpected end of file reading tensor {key!r}")
            view, at = view[done:], at + done
        return out.view(_TORCH_DTYPES[entry.dtype]).reshape(entry.shape)

    def close(self) -> None:
        for fd in self.files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.files.clear()


# Writing


def write_at(fd: int, data: Any, offset: int) -> None:
    """All of ``data`` (bytes-like) written at ``offset`` of the open file ``fd``."""
    view = memoryview(data).cast("B")
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


class Writer:
    """The output directory's shards, each written under a temporary name in its source's
    layout, renamed when :meth:`finish` is called; the index and ``config.json`` last."""

    def __init__(self, checkpoint: Checkpoint, output: pathlib.Path) -> None:
        self.checkpoint, self.output = checkpoint, output
        self.files: dict[str, int] = {}
        self.pending: set[str] = set()

    def start(self, deferred: Iterable[str]) -> None:
        """Each shard's header, and the bytes of every tensor but those ``deferred`` (written
        later with :meth:`write`), copied from the source."""
        later = set(deferred)
        self.pending = set(later)
        by_shard: dict[str, list[Entry]] = {shard: [] for shard in self.checkpoint.shards}
        for name, entry in self.checkpoint.entries.items():
            if name not in later:
                by_shard[entry.shard].append(entry)
        for shard, header in self.checkpoint.shards.items():
            fd = os.open(self.output / (shard + PARTIAL), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self.files[shard] = fd
            with open(self.checkpoint.path / shard, "rb") as src:
                _copy(src.fileno(), fd, [(0, header)] + [(e.start, e.end) for e in by_shard[shard]])

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Tensor ``name``'s bytes at its offset (its dtype and shape are the source's)."""
        entry = self.checkpoint.entries[name]
        data = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy()
        if len(data) != entry.end - entry.start or tuple(tensor.shape) != entry.shape:
            raise AssertionError(f"{name}: {tuple(tensor.shape)} {tensor.dtype} is not the source's layout")
        write_at(self.files[entry.shard], data, entry.start)
        self.pending.discard(name)

    def finish(self) -> None:
        """Every shard flushed and renamed; then the index, then config.json."""
        if self.pending:
            raise RuntimeError(f"prune_pretrained: tensors never written: {sorted(self.pending)[:5]}")
        for shard, fd in list(self.files.items()):
            os.fsync(fd)
            os.close(fd)
            del self.files[shard]
        for shard in self.checkpoint.shards:
            os.replace(self.output / (shard + PARTIAL), self.output / shard)
        for name in ([self.checkpoint.index_file] if self.checkpoint.index_file else []) + [CONFIG]:
            copy_file(self.checkpoint.path / name, self.output / name)

    def abort(self) -> None:
        """Close and remove the shards written so far (the output stays without config.json)."""
        for fd in self.files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.files.clear()
        for shard in self.checkpoint.shards:
            with contextlib.suppress(OSError):
                os.unlink(self.output / (shard + PARTIAL))


def _copy(src: int, dst: int, ranges: list[tuple[int, int]]) -> None:
    """Byte ranges of ``src`` written at the same offsets of ``dst``, a chunk at a time."""
    for start, end in _merged(ranges):
        at = start
        while at < end:
            chunk = os.pread(src, min(_CHUNK, end - at), at)
            if not chunk:
                raise OSError(f"unexpected end of file at byte {at}")
            write_at(dst, chunk, at)
            at += len(chunk)


def _merged(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return (tuple(r) for r in out)  # type: ignore[misc]


def copy_file(src: pathlib.Path, dst: pathlib.Path) -> None:
    """``src`` copied to ``dst`` through a temporary name (``dst`` appears whole or not at all)."""
    temp = dst.with_name(dst.name + PARTIAL)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with open(src, "rb") as f:
            _copy(f.fileno(), fd, [(0, os.fstat(f.fileno()).st_size)])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    os.close(fd)
    os.replace(temp, dst)


def copy_extras(checkpoint: Checkpoint, output: pathlib.Path) -> None:
    """The generation config and tokenizer files the source has, copied as they are."""
    for name in EXTRAS:
        if (checkpoint.path / name).is_file():
            shutil.copyfile(checkpoint.path / name, output / name)
