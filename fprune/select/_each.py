"""Private: the :class:`Each` scope (every leaf on its own)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fprune.select._executor import Executor
from fprune.select._scope import Scope


@dataclass(frozen=True)
class Each(Scope):
    """Every leaf on its own: ``amount`` of each leaf's remaining entries are pruned (the lowest
    scores, ties by position)."""

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        return ex.per_entry(ex.pruned())


#: The per-leaf scope.
EACH = Each()
