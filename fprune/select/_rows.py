"""Private: the :class:`Rows` scope (every index along a dim its own group, with its own count)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from fprune import _amount
from fprune.select import _inputs
from fprune.select._executor import Executor, Within
from fprune.select._scope import Scope


@dataclass(frozen=True)
class Rows(Scope):
    """Per leaf, every index along ``dim`` is its own group (the slice ``leaf.select(dim, r)``).

    Each slice loses ``amount`` of its own remaining entries (a fraction: ``round(amount *
    remaining)``; an int: that count in every slice). One tensor program whatever the path (a
    stable sort per row).
    """

    dim: int = 0

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        """Every leaf's dim checked, then each slice's count from its remaining entries (an int
        amount above what a slice has left raises)."""
        leaves, params, amounts = ex.pruned(), ex.inputs.params.leaves, ex.amounts
        dims = [_inputs.check_axis(self.dim, params[i], f" at {ex.name(i)}") for i in leaves]

        def count(i: int, alive: torch.Tensor, size: int) -> Any:
            return _amount.count(amounts[i], alive, "parameters", ex.name(i), size=size) + (size - alive)

        def check(i: int, least: int) -> None:
            if amounts[i] > least:
                raise ValueError(
                    f"amount={amounts[i]} is more than the {least} parameters left to prune in a "
                    f"slice of {ex.name(i)} along dim {self.dim}; expected a count of at most "
                    f"{least} (or a fraction in [0, 1])."
                )

        limited = [i for i in leaves if isinstance(amounts[i], numbers.Integral)]
        return ex.within(Within(leaves, dims, None, count, check, limited))
