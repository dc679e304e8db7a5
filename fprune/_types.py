"""Type aliases for the pytrees that fprune's public functions take and return.

They document intent in signatures; at run time every one is ``Any`` (a pytree is any nesting
of dicts, lists, tuples and namedtuples that optree flattens, with tensors at the leaves).
"""

from __future__ import annotations

from typing import Any

#: A pytree of parameter tensors, first of all ``dict(model.named_parameters())``.
Params = Any
#: A pytree shaped like ``Params`` of ``torch.bool`` keep-masks (``True`` = kept).
Masks = Any
#: A pytree shaped like ``Params`` of score tensors (higher = more important).
Scores = Any
#: A pytree shaped like ``Params`` of gradients.
Grads = Any

__all__ = ["Params", "Masks", "Scores", "Grads"]
