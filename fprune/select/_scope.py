"""Private: :class:`Scope`, the base every scope of :mod:`fprune.select` derives from.

A scope is a small frozen object that says, for one call of the selection layer:

* how ``amount`` is checked and spread over the leaves (:meth:`Scope.leaf_amounts`, run once per
  call, before anything is selected);
* what it ranks and how the keep-decisions expand to masks, once: :meth:`Scope.masks`, written
  against an executor object that runs it, :class:`fprune.select._local.Executor` for the
  tensors of one process (the engine of :mod:`fprune._select`) or
  :class:`fprune.select._sharded.Executor` for ``DTensor`` leaves (the radix selects and
  collectives of :mod:`fprune.distributed`). A scope that ranks groups of entries hands the
  executor a :class:`Grouped` plan (which groups, how an entry adds to its group's score, how a
  group's keep-decision expands to its entries).

:meth:`Scope.local` and :meth:`Scope.sharded` are the two entry points (they build the executor);
a scope that no plan expresses overrides them instead of :meth:`Scope.masks`.

:func:`fprune.select.select_inputs` checks the scope (an instance of :class:`Scope`), asks it for
the per-leaf amounts and hands the call to the executor of the leaves; nothing else dispatches on
the kind of scope.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

from fprune import _inputs
from fprune.select import _local, _sharded


class Scope:
    """How a selection is scoped: the base of :class:`Each`, :class:`Global`, :class:`Channels`,
    :class:`Rows`, :class:`NM` and :class:`Blocks`.

    A new scope derives from it (a frozen dataclass), sets :attr:`fractional`, and writes
    :meth:`masks` once against an executor (docs/selection.md has :class:`Blocks` as the worked
    example).
    """

    #: Whether the scope takes an ``amount`` (a fraction of what it ranks, a count or a count
    #: rule). ``False`` for a scope whose count is fixed by the scope itself (:class:`NM`).
    fractional: ClassVar[bool] = True

    #: How a score leaf given per group is described in messages ("one score per channel"), or
    #: ``None`` when score leaves must have their param's shape.
    group_scores: ClassVar[str | None] = None

    #: Whether the scope ranks a norm of each group's scores rather than the scores themselves
    #: (:class:`Channels`, :class:`Blocks`): a score's sign is then lost.
    reduces: ClassVar[bool] = False

    def leaf_amounts(self, inputs: _inputs.Inputs, amount: Any) -> list[Any]:
        """The checks of ``amount``; one amount per leaf of ``inputs.params`` (``None``: not
        pruned). Called once per call, before any score is made."""
        if not self.fractional:
            if amount is not None:
                raise ValueError(f"The scope {self!r} takes no amount; expected amount=None, got {amount!r}.")
            return [0 if c else None for c in inputs.chosen]
        return _inputs.leaf_amounts(inputs, amount)

    def takes_group_scores(self, scores: torch.Tensor, param: torch.Tensor) -> bool:
        """Whether ``scores`` (not of ``param``'s shape) is a valid score leaf given per group."""
        return False

    def masks(self, ex: Any) -> dict[int, torch.Tensor]:
        """The keep-masks ``{leaf index: mask}`` of the leaves the call prunes, written once
        against ``ex``: a :class:`fprune.select._local.Executor` (masks of the leaves' shapes) or
        a :class:`fprune.select._sharded.Executor` (masks of this rank's shards)."""
        raise NotImplementedError(f"{type(self).__name__} writes neither masks() nor local()/sharded().")

    def local(self, run: Any) -> dict[int, torch.Tensor]:
        """The keep-masks of one process (``run``: a :class:`fprune.select._local.Run`)."""
        return self.masks(_local.Executor(run))

    def sharded(self, call: Any, source: Any) -> dict[int, torch.Tensor]:
        """The keep-masks of this rank's shards (``call``: a
        :class:`fprune.distributed._backend.Call`; ``source``: the ranking's score source)."""
        return self.masks(_sharded.Executor(call, source))


class Grouping(Protocol):
    """How one leaf's entries form groups (tiles, channels), for a :class:`Grouped` plan: the
    dense forms run on a whole leaf (one process), :meth:`ids` on any set of entries (a shard)."""

    @property
    def n(self) -> int:
        """The number of groups."""
        ...

    def sum(self, terms: torch.Tensor) -> torch.Tensor:
        """Per group, the sum of ``terms`` (the leaf's shape): shape ``(n,)`` or any of ``n``."""
        ...

    def any(self, keep: torch.Tensor) -> torch.Tensor:
        """Per group, whether ``keep`` (bool, the leaf's shape) holds a True."""
        ...

    def ids(self, positions: torch.Tensor) -> torch.Tensor:
        """The group of each entry at ``positions`` (flat row-major positions in the leaf)."""
        ...

    def expand(self, keep: torch.Tensor) -> torch.Tensor:
        """A mask of the leaf's shape from the groups' keep-decisions (``(n,)``, bool)."""
        ...


class Grouped(NamedTuple):
    """A plan: per leaf, groups of entries ranked by the sum of a term of their entries.

    Each leaf in ``leaves`` prunes its amount of the groups ``groupings[j]`` still alive (a group
    is alive while prior masks keep any of its entries; ``what`` names them in messages): those
    whose sums of ``term(scores, prior)`` (entries prior masks pruned must add nothing) are
    lowest, ties by group index; entries prior masks pruned stay pruned. An executor's
    ``grouped(plan)`` runs it.
    """

    leaves: Sequence[int]
    groupings: Sequence[Grouping]
    term: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    what: str
