"""Type aliases for what fprune's public functions take and return.

They document intent in signatures (and ``docs/api.md`` shows them by name). The pytree aliases
(``Params``, ``Masks``, ``Scores``, ``Grads``, ``Amounts``) are ``Any`` to a type checker: a
pytree is any nesting of dicts, lists, tuples and namedtuples that optree flattens, with tensors
at the leaves, and no static type says "shaped like ``params``". The others are exact unions, so
a type checker catches, say, a string passed as ``amount``.

Private modules import these names from here; a public module re-exports the ones its
signatures use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: A pytree of parameter tensors, first of all ``dict(model.named_parameters())``.
Params = Any
#: A pytree shaped like ``Params`` of ``torch.bool`` keep-masks (``True`` = kept).
Masks = Any
#: A pytree shaped like ``Params`` of score tensors (higher = more important).
Scores = Any
#: A pytree shaped like ``Params`` of gradients.
Grads = Any

#: ``rule(remaining, size) -> count``: given what prior masks left (entries or channels, an int
#: or a tensor) and the size they are out of, the count to prune among them.
CountRule = Callable[[Any, Any], Any]
#: How much to prune: an int (a count), a float in [0, 1] or a 0-dim floating tensor (a fraction
#: of what prior masks left, ``round(amount * n)``), or a ``CountRule``.
Amount = int | float | torch.Tensor | CountRule
#: An ``Amount`` for every leaf, or one per leaf: a dict keyed like a flat params dict, or a
#: pytree shaped like ``Params`` (a ``None`` leaf: leave that leaf alone).
Amounts = Any
#: ``where(name, tensor) -> bool`` picks the leaves to prune (``name``: the leaf's path joined
#: by dots, as in ``named_parameters``); ``None`` picks every leaf.
Where = Callable[[str, torch.Tensor], bool] | None
#: The randomness of a random method: ``None`` (torch's global generator), a
#: ``torch.Generator``, or a seed (an int, or a 0-dim integer tensor) for stateless hash-based
#: draws that also run under ``vmap`` and ``torch.compile``.
GeneratorLike = torch.Generator | int | torch.Tensor | None

__all__ = [
    "Params",
    "Masks",
    "Scores",
    "Grads",
    "CountRule",
    "Amount",
    "Amounts",
    "Where",
    "GeneratorLike",
]
