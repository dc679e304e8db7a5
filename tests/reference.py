"""A naive, obviously-correct reference for fprune's selection contract (pure Python lists).

Independent of fprune's code: it sorts candidate entries by (is NaN, value, position) and prunes
the first ``k``. Used by the property tests to pin down exact counts and the tie-break rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _order_key(value: float, position: int):
    nan = math.isnan(value)
    return (nan, 0.0 if nan else value + 0.0, position)


def count(amount, n: int) -> int:
    return amount if isinstance(amount, int) else round(amount * n)


def lowest(
    scores: Sequence[torch.Tensor],
    amount,
    prior: Sequence[torch.Tensor | None] | None = None,
) -> list[torch.Tensor]:
    """Keep-masks that prune ``amount`` of the entries the prior keeps, across all ``scores``."""
    values, keep, bounds = [], [], []
    for i, s in enumerate(scores):
        flat = [float(v) for v in s.reshape(-1).tolist()]
        p = [True] * len(flat) if prior is None or prior[i] is None else prior[i].reshape(-1).tolist()
        bounds.append((len(values), len(values) + len(flat)))
        values += flat
        keep += [bool(x) for x in p]
    candidates = sorted((i for i in range(len(values)) if keep[i]), key=lambda i: _order_key(values[i], i))
    for i in candidates[: count(amount, len(candidates))]:
        keep[i] = False
    return [
        torch.tensor(keep[a:b], dtype=torch.bool).reshape(s.shape)
        for (a, b), s in zip(bounds, scores, strict=True)
    ]


def channel_lowest(channel_scores: torch.Tensor, amount, alive: torch.Tensor | None) -> torch.Tensor:
    """Keep-vector over channels: prune ``amount`` of the alive channels with lowest score."""
    return lowest([channel_scores], amount, None if alive is None else [alive])[0]
