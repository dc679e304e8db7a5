"""Private: :class:`Scope`, the base every scope of :mod:`fprune.select` derives from.

A scope is a small frozen object that says, for one call of the selection layer:

* how ``amount`` is checked and spread over the leaves (:meth:`Scope.leaf_amounts`, run once per
  call, before anything is selected);
* what it ranks and how the keep-decisions expand to masks, once: :meth:`Scope.masks`, written
  against an :class:`~fprune.select._executor.Executor` (the protocol of the local and the
  sharded executor), with the plans of :mod:`fprune.select._executor`.

It knows no executor: :func:`fprune.select.select_inputs` checks the scope (an instance of
:class:`Scope`), asks it for the per-leaf amounts and hands it the executor of the leaves;
nothing else dispatches on the kind of scope.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from fprune.select import _inputs
from fprune.select._executor import Executor


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

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        """The keep-masks ``{leaf index: mask}`` of the leaves the call prunes, written once
        against ``ex``: masks of the leaves' shapes in one process, of this rank's shards for
        ``DTensor`` leaves."""
        raise NotImplementedError(f"{type(self).__name__} does not write masks().")
