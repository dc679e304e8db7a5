"""The selection engine's plain reference, shared by the tests of tests/engine.

``reference`` gives keep-masks from one Python sort; ``sources_of`` builds the engine's
``(numel, keys)`` sources (``_engine.keys``) from scores and prior masks, the input of
``_engine.prune_lowest``.
"""

import math

import torch

from fprune.select import _engine, _histogram, _keys, _stream

CPU = torch.device("cpu")


ENGINE_MODULES = (_stream, _histogram, _keys, _engine)


def owner(name: str):
    """The module of the selection engine that defines ``name`` (a tunable or a private step),
    for tests that patch it."""
    return next(m for m in ENGINE_MODULES if name in vars(m))


def reference(scores, keeps, k, transform):
    """Keep-masks from one Python sort: prior-pruned first, then by value (NaN last), then position."""
    entries = []
    for s, keep in zip(scores, keeps, strict=True):
        values = transform(s) if transform is not None else s
        wide = torch.float32 if _engine.key_dtype(scores) == torch.int32 else torch.float64
        values = values.to(wide).reshape(-1).tolist()
        kept = [True] * len(values) if keep is None else keep.reshape(-1).tolist()
        for v, alive in zip(values, kept, strict=True):
            rank = (1, (1, 0.0) if math.isnan(v) else (0, v + 0.0)) if alive else (0, (0, 0.0))
            entries.append((rank, len(entries)))
    pruned = {position for _, position in sorted(entries)[:k]}
    masks, start = [], 0
    for s in scores:
        masks.append(torch.tensor([start + i not in pruned for i in range(s.numel())], dtype=torch.bool))
        start += s.numel()
    return masks


def sources_of(scores, keeps, transform):
    """One ``(numel, keys)`` source per score tensor, keyed in the dtype the scores share."""
    dtype = _engine.key_dtype(scores)
    return [
        (s.numel(), _engine.keys(s, keep, dtype, transform)) for s, keep in zip(scores, keeps, strict=True)
    ]
