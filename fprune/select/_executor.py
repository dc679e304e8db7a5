"""Private: the executor protocol, what every scope's :meth:`~fprune.select.Scope.masks` is written
against, and the plans a scope hands it.

Two classes implement :class:`Executor`: :class:`fprune.select._local.Executor` (the tensors of
one process, over the engine of :mod:`fprune.select._engine`) and
:class:`fprune.select._sharded.Executor` (``DTensor`` shards, over the collectives and radix
selects of :mod:`fprune.distributed`). A scope never learns which one runs it: whatever splits a
group across ranks is the sharded executor's business. The primitives:

* :meth:`Executor.per_entry`: each leaf's own lowest entries (``Each``);
* :meth:`Executor.grouped`: per leaf, groups of entries ranked by a score per group (a sum or a
  max of a per-entry term, or a reduction of a whole group, or scores given per group), pruned
  whole (``Channels``, ``Blocks``): a :class:`Grouped` plan;
* :meth:`Executor.within`: per leaf, groups (slices along a dim, or runs of ``m`` consecutive
  entries) that each prune their own count of entries (``Rows``, ``NM``): a :class:`Within` plan;
* the global ranking (``Global``): :meth:`Executor.alive`, :meth:`Executor.count`,
  :meth:`Executor.values`, :meth:`Executor.prior`, :meth:`Executor.norms`,
  :meth:`Executor.lowest_each`, :meth:`Executor.rank_all`, :meth:`Executor.emptied` and
  :meth:`Executor.unchanged`, with which ``Global`` writes its counts, floors, normalization and
  layer-collapse warning itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from fprune.select._inputs import Inputs

Masks = dict[int, torch.Tensor]
Term = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


class Grouping(Protocol):
    """How one leaf's entries form groups (tiles, channels), for a :class:`Grouped` plan: the
    dense forms run on a whole leaf (one process), :meth:`ids` on any set of entries (a shard).

    A grouping may also have ``shard(shape, offset, local_shape) -> (grouping, ids, whole)``:
    the grouping of a shard's entries (its groups are the global groups ``ids``; ``whole``:
    every one of them lies in the shard), which the sharded executor then uses instead of
    :meth:`ids` (channels: a shard's channels along their dim).
    """

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


class Batch(NamedTuple):
    """Local runs of small alike leaves of a :class:`Grouped` plan (no prior masks, a Python
    amount): ``fits(i, values)`` says whether leaf ``i``'s scores may join a run, ``scores(indices,
    values)`` gives a run's group scores ``(leaves, n)`` from its stacked values, and
    ``masks(indices, keep)`` the run's masks from its ``(leaves, n)`` keep-decisions."""

    fits: Callable[[int, torch.Tensor], bool]
    scores: Callable[[list, list], torch.Tensor]
    masks: Callable[[list, torch.Tensor], list]


class Grouped(NamedTuple):
    """A plan: per leaf, its groups of entries pruned whole, the lowest scores first.

    Each leaf in ``leaves`` prunes its amount of the groups ``groupings[j]`` still alive (a
    group is alive while prior masks keep any of its entries; ``what`` names them in messages,
    ``names[j]`` the leaf): those of lowest score, ties by group index; entries prior masks
    pruned stay pruned. A group's score is, by default, the ``reduce`` (``"sum"`` or ``"max"``)
    of ``term(scores, prior)`` over its entries (entries prior masks pruned must add nothing),
    then ``finish(reduced, dtype of the scores)``; ``score(i, values, prior, grouping)`` gives
    it directly from whole groups' entries where the scope has its own reduction (a norm), and
    with ``given`` a score leaf of one score per group (1-d, ``n``) is used as it is.
    ``split(i)`` is called before leaf ``i``'s groups are combined across ranks (it raises
    where the scope's ``score`` cannot be split). ``ranked``: the call's ranking
    (``rank="magnitude"``) applies to the group scores. ``nan``: a NaN among a group's entries
    shows in its score (the NaN warning then reads the group scores). ``batch``: runs of small
    leaves for the local executor.
    """

    leaves: Sequence[int]
    groupings: Sequence[Grouping]
    term: Term | None
    what: str
    names: Sequence[str] | None = None
    reduce: str = "sum"
    finish: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None
    score: Callable[[int, torch.Tensor, torch.Tensor | None, Any], torch.Tensor] | None = None
    given: bool = False
    split: Callable[[int], None] | None = None
    ranked: bool = False
    nan: bool = False
    batch: Batch | None = None

    def name(self, ex: Executor, j: int) -> str:
        return ex.name(self.leaves[j]) if self.names is None else self.names[j]

    def scores(self, i: int, values: torch.Tensor, prior: torch.Tensor | None, grouping: Any) -> torch.Tensor:
        """Group scores of whole groups (``grouping``) from their entries' ``values``."""
        if self.score is not None:
            return self.score(i, values, prior, grouping)
        assert self.term is not None
        summed = grouping.sum(self.term(values, prior))
        return summed if self.finish is None else self.finish(summed, values.dtype)


class Within(NamedTuple):
    """A plan: per leaf, groups that each prune their own count of their entries.

    Leaf ``leaves[j]``'s groups lie along ``dims[j]``: with ``size=None`` every index along it is
    a group (the slice ``leaf.select(dim, r)``: ``Rows``); with ``size=m`` every run of ``m``
    consecutive entries along it, in every line (``NM``; the dim's size a multiple of ``m``).
    ``counts(i, alive, size)`` is each group's count to prune among its ``alive`` entries (an
    integer tensor, one per group) out of ``size``; entries prior masks pruned rank lowest. In
    eager calls, ``check(i, least)`` sees the fewest entries a group of leaf ``i`` keeps, for the
    leaves in ``limited`` (an int amount above it raises), before any score is made.
    """

    leaves: Sequence[int]
    dims: Sequence[int]
    size: int | None
    counts: Callable[[int, torch.Tensor, int], Any]
    check: Callable[[int, int], None] | None = None
    limited: Sequence[int] = ()


class Executor(Protocol):
    """One call of the selection layer as a scope's :meth:`~fprune.select.Scope.masks` sees it:
    ``inputs`` (the checked arguments), ``amount`` (as the caller gave it), ``amounts`` (one per
    leaf, ``None``: not pruned), ``source`` (the ranking's score source: ``None`` for signed
    values, or :data:`fprune.select._keys.MAGNITUDE`) and ``traced`` (a transform is active)."""

    inputs: Inputs
    amount: Any
    amounts: list
    source: Any
    traced: bool

    def pruned(self) -> list[int]:
        """The leaves with an amount (the scope's ``leaf_amounts``), in leaf order."""
        ...

    def name(self, i: int) -> str:
        """How messages name leaf ``i``."""
        ...

    def per_entry(self, leaves: list[int]) -> Masks:
        """Each leaf's amount of its remaining entries, its lowest scores."""
        ...

    def grouped(self, plan: Grouped) -> Masks:
        """The masks of a :class:`Grouped` plan."""
        ...

    def within(self, plan: Within) -> Masks:
        """The masks of a :class:`Within` plan."""
        ...

    # The global ranking's primitives.

    def alive(self, leaves: list[int]) -> list[Any]:
        """Entries the prior masks keep, per leaf (over every rank)."""
        ...

    def count(self, amount: Any, remaining: Any, size: Any) -> Any:
        """The count to prune among ``remaining`` of ``size`` entries (an int where eager)."""
        ...

    def unchanged(self, leaves: list[int], new: Any) -> Masks | None:
        """The masks when ``new`` (the count to prune) leaves nothing to do and the executor
        can say so without a pass; ``None`` otherwise."""
        ...

    def values(self, leaves: list[int]) -> list[torch.Tensor]:
        """The scores of ``leaves`` (this process's part)."""
        ...

    def prior(self, i: int) -> torch.Tensor | None:
        """Leaf ``i``'s prior mask (this process's part), or ``None``."""
        ...

    def norms(
        self,
        leaves: list[int],
        values: list[torch.Tensor],
        priors: list,
        order: float,
        norm_of: Callable[[torch.Tensor, torch.Tensor | None, float], torch.Tensor],
    ) -> list[torch.Tensor]:
        """Each leaf's ``order``-norm over its kept entries (``norm_of`` on a whole leaf)."""
        ...

    def lowest_each(self, items: list) -> list[torch.Tensor]:
        """Keep-masks of ``(leaf index, key_fn, k, key dtype)`` items, each its ``k`` lowest."""
        ...

    def rank_all(
        self,
        leaves: list[int],
        values: list[torch.Tensor],
        priors: list,
        transforms: list,
        protect: list,
        dtype: torch.dtype,
        k: Any,
        plain: bool,
    ) -> list[torch.Tensor]:
        """Keep-masks pruning the ``k`` lowest keys over every leaf together (``plain``: no
        transform but the ranking's, no protected entries)."""
        ...

    def emptied(self, alive: list[Any]) -> list[int]:
        """Positions (in the last :meth:`rank_all`'s leaves) of leaves it pruned whole that had
        entries left; eager single-process calls only (``[]`` otherwise)."""
        ...
