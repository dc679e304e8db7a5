"""Private: the :class:`NM` scope (``n`` of every ``m`` consecutive entries kept)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from fprune.select import _inputs
from fprune.select._executor import Executor, Within
from fprune.select._scope import Scope


@dataclass(frozen=True)
class NM(Scope):
    """Per leaf, every group of ``m`` consecutive entries along ``dim`` keeps its ``n`` highest.

    Entries that prior masks pruned stay pruned: a group keeps ``min(n, alive)``. The size of
    a leaf along ``dim`` must be a multiple of ``m``. Takes no ``amount`` (pass ``None``).
    One tensor program whatever the path (a stable sort per group).
    """

    fractional = False

    n: int
    m: int
    dim: int = -1

    def __post_init__(self) -> None:
        for name, value in (("n", self.n), ("m", self.m)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"Expected {name} to be an int, got {value!r}.")
        if self.m < 1:
            raise ValueError(f"Expected m >= 1 (the group size), got m={self.m}.")
        if not 0 <= self.n <= self.m:
            raise ValueError(
                f"Expected 0 <= n <= m (n entries kept in every group of m), got n={self.n}, m={self.m}."
            )

    def leaf_amounts(self, inputs: Any, amount: Any) -> list[Any]:
        if amount is not None:
            raise ValueError(
                f"The NM scope keeps n={self.n} of every {self.m} entries and takes no amount; "
                f"expected amount=None, got {amount!r}."
            )
        return [0 if c else None for c in inputs.chosen]

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        """Every leaf's dim and size checked; each run of ``m`` prunes all but ``min(n, alive)``."""
        leaves, params = ex.pruned(), ex.inputs.params.leaves
        dims = [_inputs.check_axis(self.dim, params[i], f" at {ex.name(i)}") for i in leaves]
        for i, d in zip(leaves, dims, strict=True):
            size = params[i].shape[d]
            if size % self.m:
                raise ValueError(
                    f"Expected the size of {ex.name(i)} along dim {self.dim}, {size}, to be a "
                    f"multiple of m={self.m} (groups of m consecutive entries)."
                )
        n = self.n

        def count(i: int, alive: torch.Tensor, size: int) -> torch.Tensor:
            return size - torch.clamp(alive, max=n)

        return ex.within(Within(leaves, dims, self.m, count))
