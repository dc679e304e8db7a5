"""Private: validating ``amount`` and turning it into a count, exactly as torch.nn.utils.prune does.

A float in [0, 1] is a fraction and the count is ``round(amount * n)`` with Python's ``round``
(half to even); an int is the count itself. A floating-point tensor is a fraction too: it lets
``vmap`` run one call over many sparsity levels (then the count is a tensor).
"""

from __future__ import annotations

import math
import numbers
from typing import Union

import torch

Amount = Union[int, float, torch.Tensor]


def check_amount(amount: Amount) -> Amount:
    """Validate ``amount`` on its own (not yet against a size); returns it unchanged."""
    if isinstance(amount, torch.Tensor):
        if not amount.is_floating_point():
            raise TypeError(
                f"Expected amount to be an int, a float or a floating-point tensor, got a tensor "
                f"of dtype {amount.dtype}."
            )
        if amount.dim() != 0:
            raise ValueError(
                f"Expected amount to be a 0-dim tensor (use vmap to batch it), got shape "
                f"{tuple(amount.shape)}."
            )
        return amount
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(
            f"Invalid type for amount: {amount!r}. Must be int or float (a fraction in [0, 1] "
            f"or a non-negative count)."
        )
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise ValueError(
                f"amount={amount} should either be a float in the range [0, 1] or a "
                f"non-negative integer"
            )
    elif math.isnan(amount) or not 0.0 <= float(amount) <= 1.0:
        raise ValueError(
            f"amount={amount} should either be a float in the range [0, 1] or a non-negative "
            f"integer"
        )
    return amount


def is_static(amount: Amount) -> bool:
    """True when the amount is a Python number (the count can be known without running anything)."""
    return not isinstance(amount, torch.Tensor)


def count(amount: Amount, n: Union[int, torch.Tensor], what: str, where: str = ""):
    """How many of ``n`` entries (or channels) to prune; ``what`` and ``where`` name them in errors.

    ``n`` is an int in eager code, or a 0-dim integer tensor when it depends on prior masks
    under a transform. The result is an int exactly when both are Python numbers.
    """
    if isinstance(n, torch.Tensor) or isinstance(amount, torch.Tensor):
        n_t = torch.as_tensor(n)
        if isinstance(amount, numbers.Integral):
            # Under a transform the remaining size is a tensor and cannot be checked; prune
            # at most everything that remains.
            return torch.clamp(n_t, max=int(amount)).to(torch.int64)
        fraction = torch.as_tensor(amount, dtype=torch.float64, device=n_t.device)
        return torch.round(fraction * n_t.to(torch.float64)).to(torch.int64)
    if isinstance(amount, numbers.Integral):
        if amount > n:
            raise ValueError(
                f"amount={amount} should be smaller than the number of {what} to prune={n}"
                + (f" in {where}" if where else "")
            )
        return int(amount)
    return round(amount * n)
