"""Private: the execution backend of the selection layer for ``DTensor`` leaves.

It knows no scope: the sharded executor (:mod:`fprune.select._sharded`) runs a call here when the
params (or scores, or prior masks) are DTensors, and its primitives select with the :class:`Call`
they get (its counts, scores, per-leaf and global rankings over the mesh) and the collectives of
:mod:`fprune.distributed._comm` and :mod:`fprune.distributed._radix`. Every rank holds its own
shard of each leaf and makes the same call; no parameter is gathered, and the masks are those of
the same call on the full tensors in one process, ties included:

1. **Agreement** (:func:`prepare`). Every rank checks its inputs (every leaf a DTensor on one
   mesh, ``Shard``/``Replicate`` placements, scores and masks placed like the params, the
   scope's checks of ``amount``) and hashes what it was called with (the scope, ``rank``,
   ``amount``, the tree structure, global shapes, dtypes, placements, ``where``'s choice, and
   what a score function says it depends on: ``score.fingerprint()``, a generator's state);
   one tiny ``all_reduce`` compares the hashes. Ranks called differently, or where one rank's
   inputs are invalid, all raise at once instead of waiting in different collectives.
2. **Counts.** The entries (channels, row entries) prior masks keep, summed over the ranks
   where a leaf is sharded: each count is computed from them as in one process
   (:func:`fprune._amount.count`, count rules included).
3. **Scores.** ``score(i)`` is called once per selected leaf, in leaf order, as in one process;
   a DTensor result placed like the leaf gives its local shard, a plain tensor of the full shape
   (draws made on every rank) its slice, and ``score.at(i, positions)`` (where the score
   function has it) the scores of this rank's entries only.
4. **Select** (:mod:`fprune.distributed._radix`). Radix selects over the same integer keys as
   the single-process engine, their histograms summed over the mesh; ties at the threshold are
   split by global row-major position. Rows and N:M groups held whole by a rank, and leaves
   replicated everywhere, are selected locally with the single-process program.
5. **Masks.** Each rank writes its own part and returns DTensors with the params' mesh and
   placements; what the call handed to collectives is kept for
   :func:`fprune.distributed.last_communication`.

docs/distributed.md has what crosses the network, per scope.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _amount
from fprune.distributed import _layout
from fprune.distributed._comm import Comm, agree, comm_of, record
from fprune.distributed._radix import keep_masks, make_ranking, per_leaf, select_all
from fprune.select import _inputs

#: The errors of the checks of a call, raised on every rank.
CHECKS = (TypeError, ValueError, IndexError, NotImplementedError)


def stable_repr(value: Any) -> str:
    """``repr(value)`` without memory addresses (the same on every rank for the same value);
    tensors with their values in full (a tensor's own repr rounds them)."""
    if isinstance(value, torch.Tensor):
        return f"tensor({value.tolist()!r}, {value.dtype})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {stable_repr(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}(" + ", ".join(stable_repr(v) for v in value) + ")"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def reject(error: BaseException, *trees: Any) -> None:
    """Raise ``error`` on this rank and make every other rank of the DTensors' mesh raise too.

    For an error found before the selection's own agreement (in the checks of a mask function's
    arguments): this rank takes part in the agreement's collective with its error, which the
    other ranks' :func:`prepare` reads as "another rank rejected its inputs".
    """
    mesh = _layout.first_mesh(*trees)
    agree(comm_of(mesh), "", error, "fprune's selection")


@dataclass
class Call:
    """One sharded selection after the agreement: what every scope's entry needs."""

    mesh: Any
    comm: Comm
    inputs: _inputs.Inputs
    leaves: list  # a _layout.Leaf per leaf of params
    amounts: list  # one amount per leaf, None where the leaf is not pruned
    score: Callable[[int], Any]
    amount: Any = None  # as the caller gave it

    def values(self, i: int) -> torch.Tensor:
        """This rank's part of leaf ``i``'s scores (``score(i)``, or ``score.at`` where given)."""
        leaf = self.leaves[i]
        at = getattr(self.score, "at", None)
        if callable(at):
            positions = leaf.positions(0, leaf.local_numel)
            return at(i, positions).reshape(leaf.local_shape)
        return _layout.localize(leaf, self.score(i), self.mesh, self.inputs.name(i))

    def prior(self, i: int) -> torch.Tensor | None:
        return _layout.local_bool(self.inputs.prior[i])

    def count(self, i: int, remaining: Any, size: Any, what: str, where: str = "") -> Any:
        """Leaf ``i``'s count to prune among ``remaining`` (as in one process), an int where it
        is one."""
        name = where or self.inputs.name(i)
        return settle(_amount.count(self.amounts[i], remaining, what, name, size=size))

    def alive(self, indices: Sequence[int]) -> list[int]:
        """Entries the prior masks keep, per leaf: summed over ranks only for sharded leaves with
        a prior mask (int32 counts while they fit); the others are known without communication."""
        counts: list = []
        exchanged = []
        for i in indices:
            prior, leaf = self.prior(i), self.leaves[i]
            if prior is None:
                counts.append(leaf.numel)
            elif not _layout.sharded(leaf):
                counts.append(int(prior.sum()))
            else:
                counts.append(None)
                exchanged.append((len(counts) - 1, int(prior.sum()) if leaf.owned else 0, leaf.numel))
        if exchanged:
            dtype = torch.int32 if max(n for *_, n in exchanged) < 2**31 else torch.int64
            sent = torch.tensor([c for _, c, _ in exchanged], dtype=dtype, device=self.comm.device)
            for (j, _, _), value in zip(exchanged, self.comm.all_reduce(sent).tolist(), strict=True):
                counts[j] = int(value)
        return counts

    def per_leaf(self, items: list) -> list:
        """Keep-masks of ``(leaf, key_fn, k, key dtype)`` items, each leaf's ``k`` lowest over the
        mesh (:func:`fprune.distributed._radix.per_leaf`)."""
        return per_leaf(self.comm, items)

    def rank_all(self, k: int, total: int, sources: list, dtype: torch.dtype) -> list:
        """Keep-masks of the ``k`` lowest keys over every ``(leaf, key_fn)`` source and rank."""
        ranking = make_ranking(k, total, sources, dtype)
        select_all(self.comm, [ranking])
        return keep_masks(ranking)


def prepare(
    inputs: _inputs.Inputs,
    score: Callable[[int], Any],
    amount: Any,
    scope: str,
    rank: str,
    amounts: list | None,
    amount_error: BaseException | None = None,
) -> Call:
    """Check a sharded call on every rank and compare the ranks' inputs (one collective).

    ``scope`` describes the scope (its ``repr``) and ``rank`` the ranking, for the comparison;
    ``amounts`` are the scope's amounts per leaf, or ``amount_error`` what its checks of
    ``amount`` raised (after the checks of the leaves). Every error of these checks is raised on
    every rank.
    """
    flat = inputs.params
    mesh = _layout.first_mesh(flat.leaves, inputs.scores, inputs.prior)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"fprune's selection: this rank is not part of the DTensors' mesh {mesh}.")
    comm = comm_of(mesh)
    error, call, description = None, None, ""
    try:
        _layout.check_leaves(
            flat, {"importance_scores": inputs.scores, "masks": inputs.prior}, mesh, inputs.argname
        )
        if inputs.traced:
            raise NotImplementedError(
                "fprune's selection on DTensors runs eagerly only (not under vmap, grad or torch.compile)."
            )
        if amount_error is not None:
            raise amount_error
        assert amounts is not None
        layouts: dict = {}
        leaves = [_layout.Leaf(i, p, mesh, coordinate, layouts) for i, p in enumerate(flat.leaves)]
        fingerprint = getattr(score, "fingerprint", None)
        parts = [
            scope,
            rank,
            stable_repr(amount),
            fingerprint() if callable(fingerprint) else "",
            str(flat.spec),
        ]
        for i, p in enumerate(flat.leaves):
            parts.append(
                f"{tuple(p.shape)}|{p.dtype}|{tuple(p.placements)}|{inputs.chosen[i]}|"
                f"{inputs.scores[i] is not None}|{inputs.prior[i] is not None}"
            )
        description = ";".join(parts)
        call = Call(mesh, comm, inputs, leaves, amounts, score, amount)
    except CHECKS as caught:
        error = caught
    agree(comm, description, error, "fprune's selection")
    assert call is not None
    return call


def finish(call: Call, keeps: dict) -> Any:
    """The mask tree: this rank's keep-masks as DTensors placed like the params."""
    new = {i: call.leaves[i].dtensor(keep, call.mesh) for i, keep in keeps.items()}
    record(call.comm.stats)
    return _inputs.finish(call.inputs, new)


def settle(x: Any) -> Any:
    """A count as an int where it is a 0-dim tensor (sharded calls run eagerly)."""
    return int(x) if isinstance(x, torch.Tensor) and x.dim() == 0 else x
