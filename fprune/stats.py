"""How much of a mask tree is pruned: :func:`sparsity` (traceable tensors), :func:`report` (a table),
:func:`batched_report` (a table per member of a batched result, such as a ``vmap`` over levels)."""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import torch

from fprune import _torch, _tree, packed

__all__ = ["Sparsity", "sparsity", "report", "batched_report", "SparsityReport", "LayerRow"]


class Sparsity(NamedTuple):
    """Fractions pruned: ``per_leaf`` (a tree like the masks) and ``overall`` (all entries)."""

    per_leaf: Any
    overall: torch.Tensor


def sparsity(masks: Any, where: _tree.Where = None) -> Sparsity:
    """The fraction of entries pruned (``False``), per leaf and over the leaves together.

    Values are 0-dim float64 tensors (float32 where the masks are on a device without float64,
    such as MPS: within a relative 1.2e-7 of the exact fraction), so this also runs under
    ``vmap`` and ``torch.compile``; ``float(...)`` turns one into a number. An empty tree (or
    one where ``where`` picks nothing) has overall sparsity 0. Bit-packed masks
    (:func:`fprune.pack_masks`) are unpacked first.

    Args:
        masks: a pytree of masks (bool, 0/1 of any dtype, or bit-packed).
        where: picks the leaves ``overall`` counts, as for the pruning functions
            (``where(name, mask)`` or ``where(mask)``): pass the ``where`` you pruned with to
            get the sparsity of what was pruned (``overall`` then leaves out, say, the biases
            that stayed dense). ``per_leaf`` still has every leaf. ``None``: every leaf.

    Returns:
        A :class:`Sparsity`: ``per_leaf`` (a tree like ``masks``) and ``overall``.

    Example:
        >>> import torch, fprune
        >>> s = fprune.sparsity({"a": torch.tensor([True, False]), "b": torch.tensor([False, False])})
        >>> float(s.per_leaf["a"]), float(s.overall)
        (0.5, 0.75)
        >>> masks = {"fc.weight": torch.tensor([False, False, False, True]), "fc.bias": torch.ones(1) > 0}
        >>> is_weight = lambda name, m: name.endswith("weight")
        >>> float(fprune.sparsity(masks).overall), float(fprune.sparsity(masks, where=is_weight).overall)
        (0.6, 0.75)
    """
    flat = _tree.flatten(_unpacked(masks), "masks")
    chosen = _tree.selected(flat, where)
    pruned = [(~_tree.as_bool(m)).sum(dtype=torch.int64) for m in flat.leaves]
    sizes = [m.numel() for m in flat.leaves]
    dtype = _fraction_dtype(flat.leaves)
    device = flat.leaves[0].device if flat.leaves else None
    per_leaf = [
        (c.to(dtype) / n) if n else torch.zeros((), dtype=dtype, device=m.device)
        for c, n, m in zip(pruned, sizes, flat.leaves, strict=True)
    ]
    total = sum(n for n, c in zip(sizes, chosen, strict=True) if c)
    counted = [p for p, c in zip(pruned, chosen, strict=True) if c]
    overall = (
        cast(torch.Tensor, sum(counted)).to(dtype) / total
        if total
        else torch.zeros((), dtype=dtype, device=device)
    )
    return Sparsity(_tree.unflatten(flat, per_leaf), overall)


def _unpacked(masks: Any) -> Any:
    """Masks with bit-packed leaves unpacked, as ``apply_masks`` takes them (a Python check)."""
    return packed.unpack_masks(masks) if packed.holds_packed(masks) else masks


def _fraction_dtype(leaves: list[torch.Tensor]) -> torch.dtype:
    """float64, or float32 where a mask lives on a device without float64 (MPS).

    A float32 fraction is the float32 nearest to the count (exact below 2**24 entries) divided
    by the size: within a relative 1.2e-7 of the exact fraction (float64's is within 1.1e-16).
    """
    if all(_torch.has_float64(d) for d in {m.device for m in leaves}):
        return torch.float64
    return torch.float32


class LayerRow(NamedTuple):
    """One row of a :class:`SparsityReport`: a leaf (or the total), its counts and sparsity."""

    name: str
    shape: tuple
    kept: int
    pruned: int

    @property
    def numel(self) -> int:
        return self.kept + self.pruned

    @property
    def sparsity(self) -> float:
        """The fraction pruned (0.0 for an empty leaf)."""
        return self.pruned / self.numel if self.numel else 0.0


class SparsityReport(NamedTuple):
    """Per-leaf counts of a mask tree: ``rows`` (one :class:`LayerRow` per leaf) and ``total``.

    ``str(report)`` (or :meth:`to_markdown`) is a markdown table; :meth:`to_dicts` gives the
    rows as plain dicts (for ``pandas.DataFrame``, JSON or a logger); :attr:`collapsed` names
    the rows pruned whole.
    """

    rows: list
    total: LayerRow

    @property
    def collapsed(self) -> list:
        """The names of the rows pruned whole (no entry kept; an empty leaf is not one): the
        layers a global selection collapsed."""
        return [r.name for r in self.rows if r.numel and not r.kept]

    def to_markdown(self) -> str:
        lines = ["| parameter | shape | kept | pruned | sparsity |", "|---|---|---:|---:|---:|"]
        for row in self.rows:
            lines.append(
                f"| {row.name} | {tuple(row.shape)} | {row.kept} | {row.pruned} | {row.sparsity:.2%} |"
            )
        t = self.total
        lines.append(f"| **{t.name}** | {t.numel} entries | {t.kept} | {t.pruned} | {t.sparsity:.2%} |")
        return "\n".join(lines)

    def to_dicts(self) -> list:
        """The rows and then the total, as dicts with keys name, shape, kept, pruned, sparsity."""
        return [
            {
                "name": r.name,
                "shape": tuple(r.shape),
                "kept": r.kept,
                "pruned": r.pruned,
                "sparsity": r.sparsity,
            }
            for r in [*self.rows, self.total]
        ]

    def __str__(self) -> str:
        return self.to_markdown()


def report(masks: Any, where: _tree.Where = None) -> SparsityReport:
    """A per-leaf sparsity table of ``masks``: name, shape, kept, pruned, sparsity, and a total.

    Counts are Python ints (one host read per call, so this is for eager code; use
    :func:`sparsity` under transforms). Bit-packed masks (:func:`fprune.pack_masks`) are unpacked.

    Args:
        masks: a pytree of masks (bool, 0/1 of any dtype, or bit-packed).
        where: ``where(name, mask) -> bool`` (or ``where(mask)``) picks the rows (``name`` as
            for the pruning functions: the key of a flat dict, the dotted path otherwise); the
            total is over the rows picked. ``None``: every leaf.

    Returns:
        A :class:`SparsityReport`; ``print`` it for a markdown table.

    Example:
        >>> import torch, fprune
        >>> masks = {"fc.weight": torch.tensor([[True, False], [False, False]]),
        ...          "fc.bias": torch.ones(2, dtype=torch.bool)}
        >>> print(fprune.report(masks))
        | parameter | shape | kept | pruned | sparsity |
        |---|---|---:|---:|---:|
        | fc.bias | (2,) | 2 | 0 | 0.00% |
        | fc.weight | (2, 2) | 1 | 3 | 75.00% |
        | **total** | 6 entries | 3 | 3 | 50.00% |
        >>> fprune.report(masks, where=lambda name, m: name.endswith("weight")).total.sparsity
        0.75
        >>> fprune.report({"a": torch.zeros(3, dtype=torch.bool), "b": torch.ones(2) > 0}).collapsed
        ['a']
    """
    flat = _tree.flatten(_unpacked(masks), "masks")
    chosen = _tree.selected(flat, where)
    picked = [(path, m) for path, m, c in zip(flat.paths, flat.leaves, chosen, strict=True) if c]
    kept_counts = []
    if picked:  # one host read for all rows
        counts = [_tree.as_bool(m).sum(dtype=torch.int64) for _, m in picked]
        kept_counts = torch.stack(counts).tolist()
    rows = [
        LayerRow(_tree.dotted(path), tuple(m.shape), kept, m.numel() - kept)
        for (path, m), kept in zip(picked, kept_counts, strict=True)
    ]
    total = LayerRow("total", (), sum(r.kept for r in rows), sum(r.pruned for r in rows))
    return SparsityReport(rows, total)


def batched_report(masks: Any, where: _tree.Where = None) -> list:
    """One :func:`report` per member of a batched mask tree: the leading dim of every leaf.

    A ``vmap`` over sparsity levels (a tensor ``amount``) gives masks stacked along a new first
    dim, one member per level. Under ``vmap`` no selection can read its values, so a global
    selection that prunes a whole leaf at some level does not warn (an eager call warns with
    :class:`fprune.select.LayerCollapseWarning`); this table per level shows it, and
    ``[r.collapsed for r in batched_report(masks)]`` names the collapsed leaves of every level.
    Counts are Python ints (one host read for all members and rows).

    Args:
        masks: a pytree of batched masks (bool, 0/1 of any dtype, or bit-packed), every leaf
            of one or more dims with the same size along the first, the batch.
        where: ``where(name, mask) -> bool`` (or ``where(mask)``) picks the rows, as for
            :func:`report` (``mask`` is the batched leaf). ``None``: every leaf.

    Returns:
        A list of :class:`SparsityReport`, one per member, in batch order; each row's shape is
        the leaf's without the batch dim.

    Raises:
        ValueError: a leaf of no dims, or leaves whose first dims differ.

    Example:
        >>> import torch, fprune
        >>> params = {"big": torch.arange(1.0, 13.0).reshape(3, 4), "small": torch.full((2, 2), 0.1)}
        >>> levels = torch.tensor([0.2, 0.5])
        >>> per_level = torch.vmap(lambda a: fprune.global_unstructured(params, a))(levels)
        >>> [r.collapsed for r in fprune.batched_report(per_level)]
        [[], ['small']]
        >>> print(fprune.batched_report(per_level)[1])
        | parameter | shape | kept | pruned | sparsity |
        |---|---|---:|---:|---:|
        | big | (3, 4) | 8 | 4 | 33.33% |
        | small | (2, 2) | 0 | 4 | 100.00% |
        | **total** | 16 entries | 8 | 8 | 50.00% |
    """
    flat = _tree.flatten(_unpacked(masks), "masks")
    sizes = set()
    for path, m in zip(flat.paths, flat.leaves, strict=True):
        if m.dim() == 0:
            raise ValueError(
                f"Expected every leaf of masks to have a batch dim first (a batched result), got "
                f"{_tree.describe('masks', path)} of shape ()."
            )
        sizes.add(m.shape[0])
    if len(sizes) > 1:
        shapes = {_tree.dotted(path): tuple(m.shape) for path, m in zip(flat.paths, flat.leaves, strict=True)}
        raise ValueError(
            f"Expected the leaves of masks to share their first dim (the batch), got shapes {shapes}."
        )
    members = sizes.pop() if sizes else 0
    chosen = _tree.selected(flat, where)
    picked = [(path, m) for path, m, c in zip(flat.paths, flat.leaves, chosen, strict=True) if c]
    kept_counts: list = [[] for _ in picked]
    if picked and members:  # one host read for all members and rows
        counts = [_tree.as_bool(m).reshape(members, -1).sum(dim=1, dtype=torch.int64) for _, m in picked]
        kept_counts = torch.stack(counts).tolist()
    reports = []
    for b in range(members):
        rows = [
            LayerRow(_tree.dotted(path), tuple(m.shape[1:]), kept[b], m[0].numel() - kept[b])
            for (path, m), kept in zip(picked, kept_counts, strict=True)
        ]
        total = LayerRow("total", (), sum(r.kept for r in rows), sum(r.pruned for r in rows))
        reports.append(SparsityReport(rows, total))
    return reports
