"""The result: every set of merged atoms is one channel; channels that cover the same
(parameter, dim, number of positions) and share their flags form one :class:`Group`."""

from __future__ import annotations

import dataclasses

import torch

from fprune.structure._propagate import Propagation
from fprune.structure._types import Group, Member, Structure

__all__ = ["build"]


@dataclasses.dataclass
class _Pairs:
    """Every (root, member) pair, sorted by root then member: where its positions start in ``p``,
    how many there are, and the first of them."""

    p: torch.Tensor  # positions, grouped by pair, ascending within each
    root: list[int]
    member: list[int]
    count: list[int]
    start: list[int]
    first: list[int]


def _pairs(a: Propagation, members: list[tuple[str, int]]) -> _Pairs:
    # Every (root, member, position), sorted: each root's positions in each member.
    r = torch.cat([a.roots[a.param_atoms[key]] for key in members])
    j = torch.cat(
        [torch.full((len(a.param_atoms[key]),), i, dtype=torch.int64) for i, key in enumerate(members)]
    )
    p = torch.cat([torch.arange(len(a.param_atoms[key])) for key in members])
    width = len(members)
    order = torch.argsort(r * width + j, stable=True)  # positions already ascending
    r, j, p = r[order], j[order], p[order]
    keys, counts = torch.unique_consecutive(r * width + j, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    return _Pairs(
        p=p,
        root=(keys // width).tolist(),
        member=(keys % width).tolist(),
        count=counts.tolist(),
        start=starts.tolist(),
        first=p[starts].tolist(),
    )


def build(a: Propagation) -> Structure:
    """The :class:`Structure` of an analysis whose roots are final."""
    pinned = a.root_flags(a.roots, a.pins)
    inexact = a.root_flags(a.roots, a.inexact)
    head_roots = set(torch.unique(a.roots[torch.cat(a.heads)]).tolist()) if a.heads else set()
    rank = {name: i for i, name in enumerate(a.order)}
    members = sorted(a.param_atoms, key=lambda key: (rank[key[0]], key[1]))
    aliases = tuple(sorted((alias, n) for alias, n in a.aliases.items() if alias != n))
    shapes = tuple((name, a.shapes[name]) for name in a.order)
    if not members:
        return Structure((), aliases, shapes)
    pairs = _pairs(a, members)
    per_root: dict[int, list[int]] = {}  # root -> its pair numbers
    for n, root in enumerate(pairs.root):
        per_root.setdefault(root, []).append(n)
    buckets: dict[tuple, list[int]] = {}
    for root, numbers in per_root.items():
        sig = (
            tuple((pairs.member[n], pairs.count[n]) for n in numbers),
            root in pinned,
            root in inexact,
            root in head_roots,
        )
        buckets.setdefault(sig, []).append(root)
    built = [_group(sig, rs, pairs, per_root, members, pinned, inexact) for sig, rs in buckets.items()]
    built.sort(key=lambda item: item[0])
    return Structure(_unique_names([g for _, g in built]), aliases, shapes)


def _group(
    sig: tuple,
    rs: list[int],
    pairs: _Pairs,
    per_root: dict[int, list[int]],
    members: list[tuple[str, int]],
    pinned: dict[int, str],
    inexact: dict[int, str],
) -> tuple[tuple[int, int], Group]:
    """``(sort key, group)`` of the roots ``rs`` that share the signature ``sig``."""
    first_pair = {root: per_root[root][0] for root in rs}
    rs.sort(key=lambda root: (pairs.member[first_pair[root]], pairs.first[first_pair[root]]))
    group_members = []
    for slot, (jj, k) in enumerate(sig[0]):
        pair_starts = torch.tensor([pairs.start[per_root[root][slot]] for root in rs])
        index = pairs.p[pair_starts[:, None] + torch.arange(k)[None, :]]
        param, dim = members[jj]
        group_members.append(Member(param, dim, index))
    head = rs[0]
    first = group_members[0]
    reason = pinned.get(head)
    group = Group(
        name=f"{first.param}:{first.dim}",
        size=len(rs),
        members=tuple(group_members),
        prunable=reason is None,
        reason=reason,
        exact=head not in inexact,
        inexact_reason=inexact.get(head),
        kind="head" if sig[3] else "channel",
    )
    return (sig[0][0][0], pairs.first[first_pair[head]]), group


def _unique_names(groups: list[Group]) -> tuple[Group, ...]:
    """Groups named alike get ``#1``, ``#2``, ... after the first."""
    seen: dict[str, int] = {}
    result = []
    for g in groups:
        if g.name in seen:
            seen[g.name] += 1
            g = dataclasses.replace(g, name=f"{g.name}#{seen[g.name]}")
        else:
            seen[g.name] = 0
        result.append(g)
    return tuple(result)
