"""Private: the selection within groups, shared by the executors of :mod:`fprune.select`.

* :func:`lowest_in_groups`: the program of the ``Rows`` and ``NM`` scopes (a stable sort per
  group, ties to the first position), and :func:`lowest_in_groups_of_one_count`, the same
  masks when every group prunes the same count (a selection instead of a sort; eager calls);
* :func:`channel_scores` and :func:`check_reduced`: a channel's score in the ``Channels`` scope,
  given directly (one per channel) or reduced from its entries' scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Reduce = int | float | str | Callable[[torch.Tensor, list[int]], torch.Tensor] | None


def lowest_in_groups(keys: torch.Tensor, k: Any) -> torch.Tensor:
    """Keep-masks pruning the ``k[g]`` lowest keys of every group ``keys[g]`` (the last dim).

    ``k`` is an int or an integer tensor shaped like ``keys`` without its last dim; ties go to
    the first position (a stable sort). A tensor program: it runs under every transform.
    """
    k = torch.as_tensor(k, device=keys.device)
    order = torch.argsort(keys, dim=-1, stable=True)
    positions = torch.arange(keys.shape[-1], device=keys.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(-1, order, positions)
    return ranks >= k.unsqueeze(-1) if k.dim() else ranks >= k


def lowest_in_groups_of_one_count(keys: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`lowest_in_groups` when every group prunes the same ``k`` (a Python int), by a
    selection instead of a sort: the ``k``-th lowest key of each group (``kthvalue``), every key
    below it pruned, and of the keys equal to it the first ``k - (number below)`` by position, so
    ties go to the first position as the stable sort gives them. Linear in the group size where
    the sort is not (a third of its time on groups of thousands). For eager calls: ``k`` is a
    Python number."""
    size = keys.shape[-1]
    if k <= 0 or size == 0:
        return torch.ones_like(keys, dtype=torch.bool)
    if k >= size:
        return torch.zeros_like(keys, dtype=torch.bool)
    threshold = keys.kthvalue(k, dim=-1, keepdim=True).values
    below = keys < threshold
    ties = keys == threshold
    need = k - below.sum(-1, keepdim=True, dtype=torch.int32)
    ties &= ties.cumsum(-1, dtype=torch.int32) <= need
    below |= ties
    return below.logical_not_()


def channel_scores(
    values: torch.Tensor, shape: Sequence[int], d: int, reduce: Reduce, name: str
) -> torch.Tensor:
    """One score per channel of a leaf of ``shape`` along ``d``: given directly (1-d, one per
    channel), or reduced from the entries' scores ``values`` (of ``shape``) by a norm order or a
    callable."""
    shape = tuple(shape)
    if values.dim() == 1 and values.shape[0] == shape[d]:
        return values
    if tuple(values.shape) != shape:
        raise ValueError(
            f"Expected the scores of {name} to have its shape {shape} or one score per "
            f"channel ({shape[d]},), got {tuple(values.shape)}."
        )
    if reduce is None:
        raise ValueError(
            f"Channels(reduce=None) takes one score per channel, shape ({shape[d]},); got the "
            f"full shape {tuple(values.shape)} for {name}."
        )
    others = [x for x in range(len(shape)) if x != d]
    if callable(reduce):
        return check_reduced(reduce(values, others), shape[d], name)
    return torch.norm(values, p=reduce, dim=others)


def check_reduced(out: Any, channels: int, name: str) -> torch.Tensor:
    """A ``Channels(reduce=callable)`` result must be real, one score per channel (metadata only)."""
    if not isinstance(out, torch.Tensor) or out.dtype == torch.bool or out.is_complex():
        kind = f"a tensor of dtype {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"Expected Channels' reduce to return a real tensor for {name}, got {kind}.")
    if tuple(out.shape) != (channels,):
        raise ValueError(
            f"Channels' reduce returned shape {tuple(out.shape)} for {name}; expected "
            f"one score per channel, shape ({channels},)."
        )
    return out
