"""How much of a mask tree is pruned."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fprune import _tree

__all__ = ["Sparsity", "sparsity"]


class Sparsity(NamedTuple):
    """Fractions pruned: ``per_leaf`` (a tree like the masks) and ``overall`` (all entries)."""

    per_leaf: Any
    overall: torch.Tensor


def sparsity(masks: Any) -> Sparsity:
    """The fraction of entries pruned (``False``), per leaf and over all leaves together.

    Values are 0-dim float64 tensors, so this also runs under ``vmap`` and ``torch.compile``;
    ``float(...)`` turns one into a number. An empty tree has overall sparsity 0.

    Example:
        >>> import torch, fprune
        >>> s = fprune.sparsity({"a": torch.tensor([True, False]), "b": torch.tensor([False, False])})
        >>> float(s.per_leaf["a"]), float(s.overall)
        (0.5, 0.75)
    """
    flat = _tree.flatten(masks, "masks")
    pruned = [(~_tree.as_bool(m)).sum(dtype=torch.int64) for m in flat.leaves]
    sizes = [m.numel() for m in flat.leaves]
    per_leaf = [
        (c.to(torch.float64) / n) if n else torch.zeros((), dtype=torch.float64)
        for c, n in zip(pruned, sizes)
    ]
    total = sum(sizes)
    overall = (
        sum(pruned).to(torch.float64) / total if total else torch.zeros((), dtype=torch.float64)
    )
    return Sparsity(_tree.unflatten(flat, per_leaf), overall)
