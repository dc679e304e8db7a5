"""Channel atoms and what is learnt about them: merges (a union-find over atom ids), pins and
inexact marks, attention heads. The op rules record into it (``a.union``, ``a.pin``, ...)."""

from __future__ import annotations

from typing import Any

import torch

from fprune.structure._labels import compress, varies

__all__ = ["Atoms"]

_PAIR = 1 << 31  # atom ids stay below this (encoding pairs of atoms in one int64)


class Atoms:
    """Atom ids and the events recorded about them (see the module docstring).

    Attributes:
        count: atoms made so far (ids ``0 .. count - 1``).
        edges: ``(2, n)`` pairs of atoms to merge.
        pins: ``(atoms, reason)``: these cannot be pruned.
        inexact: ``(atoms, reason)``: removing them changes other values.
        heads: atoms that stand for a whole attention head.
        param_atoms: ``(parameter, dim) -> atoms``: one atom per position along a member dim.
        shapes: parameter (and buffer) shapes.
        roots: the root atom of every atom, once every merge is made.
    """

    def __init__(self) -> None:
        self.count = 0
        self.edges: list[torch.Tensor] = []
        self.pins: list[tuple[torch.Tensor, str]] = []
        self.inexact: list[tuple[torch.Tensor, str]] = []
        self.heads: list[torch.Tensor] = []
        self.param_atoms: dict[tuple[str, int], torch.Tensor] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.roots = torch.empty(0, dtype=torch.int64)

    def new(self, shape: Any) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= int(s)
        atoms = torch.arange(self.count, self.count + n, dtype=torch.int64).reshape(tuple(shape))
        self.count += n
        return atoms

    def atoms_of(self, name: str, dim: int) -> torch.Tensor:
        key = (name, dim)
        if key not in self.param_atoms:
            self.param_atoms[key] = self.new((self.shapes[name][dim],))
        return self.param_atoms[key]

    def union(self, a: torch.Tensor, b: torch.Tensor) -> None:
        a, b = compress(*torch.broadcast_tensors(a, b))
        a, b = a.reshape(-1), b.reshape(-1)
        keep = (a >= 0) & (b >= 0) & (a != b)
        if bool(keep.any()):
            a, b = a[keep], b[keep]
            if a.numel() > 64:  # shapes repeat atoms along batch and space: keep each pair once
                pairs = torch.unique(torch.minimum(a, b) * _PAIR + torch.maximum(a, b))
                a, b = pairs // _PAIR, pairs % _PAIR
            self.edges.append(torch.stack([a, b]))

    def union_all(self, atoms: torch.Tensor) -> None:
        """Merge every atom in ``atoms``."""
        flat = atoms.reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel() > 1:
            flat = torch.unique(flat)
            self.union(flat[:1].expand(flat.numel() - 1), flat[1:])

    def per_channel(self, x: torch.Tensor, channel: int) -> torch.Tensor:
        """One atom per index along ``channel``: the atoms of each slice, merged."""
        cols = x.movedim(channel, 0).reshape(x.shape[channel], -1)
        rep = cols.amax(dim=1)
        self.union(cols, rep[:, None])
        return rep

    def pin(self, atoms: torch.Tensor, reason: str) -> None:
        flat = compress(atoms).reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel():
            self.pins.append((torch.unique(flat), reason))

    def mark_inexact(self, atoms: torch.Tensor, reason: str) -> None:
        flat = compress(atoms).reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel():
            self.inexact.append((torch.unique(flat), reason))

    def mark_inexact_along(self, x: torch.Tensor, dim: int, reason: str) -> None:
        if varies(x, dim):
            self.mark_inexact(x, reason)

    def components(self) -> torch.Tensor:
        """The root atom of every atom (union-find by label propagation with pointer jumping)."""
        parent = torch.arange(self.count, dtype=torch.int64)
        if not self.edges:
            return parent
        edges = torch.cat(self.edges, dim=1)
        a, b = edges[0], edges[1]
        while True:
            pa, pb = parent[a], parent[b]
            if torch.equal(pa, pb):
                return parent
            low = torch.minimum(pa, pb)
            parent.scatter_reduce_(0, pa, low, reduce="amin")
            parent.scatter_reduce_(0, pb, low, reduce="amin")
            while True:
                nxt = parent[parent]
                if torch.equal(nxt, parent):
                    break
                parent = nxt

    def root_flags(self, roots: torch.Tensor, events: list[tuple[torch.Tensor, str]]) -> dict[int, str]:
        """Root atom -> the first reason recorded for any atom under it."""
        flags: dict[int, str] = {}
        for atoms, reason in events:
            for r in torch.unique(roots[atoms]).tolist():
                flags.setdefault(r, reason)
        return flags
