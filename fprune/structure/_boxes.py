"""Every value stays a box: after propagation, couple or pin channels so that any pruning of
the prunable groups leaves each value's kept entries the product of kept indices per dim (what
compaction can rebuild)."""

from __future__ import annotations

import torch

from fprune.structure._labels import compress, varies
from fprune.structure._propagate import Propagation

__all__ = ["rectangular"]


def rectangular(a: Propagation) -> torch.Tensor:
    """The roots of every atom, after coupling (or pinning) channels so that any pruning of
    the prunable groups leaves every value a box.

    :func:`~fprune.structure.compact` keeps, along each dim of a value, the indices that
    hold a kept entry, so it can only rebuild values whose kept entries are the product of
    those per-dim sets. For every pruning of the groups that holds when each entry of a
    channel lies in a slice (along some dim) made of that channel's entries alone: pruning
    the channel then empties the slice. Where that fails (a channel shuffle's view splits
    the channels of two branches into ``(2, c/2)``), the channels that share slices along
    the dim needing the fewest merges become one channel (the shuffle pairs channel ``i``
    of each half); where no dim can do it (a slice mixing channels with entries that carry
    none), the channels are unprunable, with the node as the reason. Repeated until every
    value passes: merges and pins only ever make more slices pass.
    """
    boxes = _boxed(a)
    settled: set[str] = set()
    while True:
        roots = a.components()
        merged = _settle_entries(a, roots, settled)
        if not _fix_boxes(a, boxes, roots) and not merged:
            return roots


def _boxed(a: Propagation) -> list[tuple[str, torch.Tensor]]:
    """``(node, label)`` for every value whose atoms vary along 2 or more dims, each label
    cut to one index along the dims on which it is constant (the others need no check)."""
    found = []
    for name, label in a.labels.items():
        if not isinstance(label, torch.Tensor) or label.dim() < 2:
            continue
        x = compress(label)
        if sum(s > 1 for s in x.shape) >= 2:
            found.append((name, x))
    return found


def _settle_entries(a: Propagation, roots: torch.Tensor, settled: set[str]) -> bool:
    """Parameters whose entries got an atom each (see ``Propagation.label``): where their channels
    now run along one dim only (each slice across it is one channel), that dim becomes a
    member; otherwise the parameter is used whole and every channel it touches is pinned.
    True when a member merged with atoms the dim already had (roots must be recomputed).
    """
    merged = False
    for name, (atoms, use) in a.entries.items():
        if name in settled:
            continue
        settled.add(name)
        r = roots[atoms]
        along = []
        for d in range(r.dim()):
            others = [k for k in range(r.dim()) if k != d]
            if r.shape[d] > 1 and bool((r.amax(dim=others) == r.amin(dim=others)).all()):
                along.append(d)
        varying = [d for d in range(r.dim()) if r.shape[d] > 1 and varies(r, d)]
        if len(along) == 1 and varying == along:
            d = along[0]
            row = atoms.movedim(d, 0).reshape(atoms.shape[d], -1)[:, 0]
            if (name, d) in a.param_atoms:
                a.union(a.param_atoms[(name, d)], row)
                merged = True
            else:
                a.param_atoms[(name, d)] = row
        else:  # channels along several dims, or one channel over the whole tensor
            reason = f"parameter {name} used whole by {use}: its channels run along no single dim"
            a.pin(atoms, reason)
            for d in varying:
                if (name, d) in a.param_atoms:
                    a.pin(a.param_atoms[(name, d)], reason)
    return merged


def _fix_boxes(a: Propagation, boxes: list[tuple[str, torch.Tensor]], roots: torch.Tensor) -> bool:
    """Couple or pin the channels of values in ``boxes`` that are not boxes; True if any."""
    pinned = torch.zeros(a.count, dtype=torch.bool)
    for atoms, _ in a.pins:
        pinned[roots[atoms]] = True
    changed = False
    for name, x in boxes:
        r = torch.where(x >= 0, roots[x.clamp(min=0)], -1)
        r = torch.where((r >= 0) & ~pinned[r.clamp(min=0)], r, -1)  # never pruned: as no channel
        if int(r.amax()) < 0:
            continue
        uniform = []  # per dim: which slices hold one prunable channel only
        ok = r < 0
        for d in range(r.dim()):
            others = [k for k in range(r.dim()) if k != d]
            hi, lo = r.amax(dim=others, keepdim=True), r.amin(dim=others, keepdim=True)
            uniform.append((hi == lo) & (lo >= 0))
            ok = ok | uniform[-1]
        bad = ~ok
        if not bool(bad.any()):
            continue
        changed = True
        best, best_cost = None, None
        for d in range(r.dim()):
            if r.shape[d] == 1:
                continue
            others = [k for k in range(r.dim()) if k != d]
            hit = bad.any(dim=others)  # slices along d holding an entry to fix
            if bool((r.amin(dim=others)[hit] < 0).any()):
                continue  # such a slice also holds entries that always stay
            cost = sum(
                int(torch.unique(r.select(d, i)).numel()) - 1 for i in torch.nonzero(hit).reshape(-1).tolist()
            )
            if best_cost is None or cost < best_cost:
                best, best_cost = d, cost
        if best is None:
            a.pin(
                r[bad],
                f"compact could not keep node {name} rectangular without them "
                f"(its kept entries would not form a box)",
            )
            continue
        others = [k for k in range(r.dim()) if k != best]
        for i in torch.nonzero(bad.any(dim=others)).reshape(-1).tolist():
            piece = r.select(best, i)
            a.union(piece, piece.reshape(-1)[:1])
    return changed
