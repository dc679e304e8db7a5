"""Sparsity distributions: how much of each leaf to prune for an overall target.

Each function returns a pytree shaped like ``params`` holding one Python float per selected
leaf, the fraction of that leaf to prune, and ``None`` for the leaves ``where`` does not select,
to be passed as a per-leaf ``amount`` to the local mask functions, where ``None`` means "not
pruned": the leaf is skipped, so, for example, ``ln_structured`` never checks a skipped bias's
dims. (optree treats ``None`` as an empty subtree, so ``optree.tree_map`` over the result skips
those leaves; fprune reads per-leaf amounts with its own walk, where ``None`` is a leaf.) Only shapes are read, never values, so
they work on any params (also inside ``vmap``, where they see each member's shapes).

The fractions are of each leaf's *whole* size, and ``sparsity`` is a fraction of all selected
entries: ``sum(amount[i] * numel[i]) == sparsity * sum(numel[i])`` up to floating-point error,
so that once each leaf's count is rounded (``round(amount * numel)``) the pruned total is within
half an entry per leaf of ``sparsity`` times the total.

``where=None`` selects every leaf, as everywhere in fprune; pass
``where=lambda name, p: p.dim() > 1`` to leave biases and normalization weights dense, as
RigL and jaxpruner do by default.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, List

from fprune import _tree
from fprune._types import Params

__all__ = ["uniform", "erk"]


def uniform(params: Params, sparsity: float, *, where: _tree.Where = None) -> Any:
    """The same fraction ``sparsity`` for every selected leaf.

    Args:
        params: a pytree of tensors (only their shapes are used).
        sparsity: the fraction to prune, a float in [0, 1].
        where: ``where(name, tensor) -> bool`` picks the leaves to prune (all when ``None``);
            the others get ``None`` (not pruned).

    Returns:
        A pytree like ``params`` of Python floats (``None`` for the leaves not selected).

    Raises:
        TypeError / ValueError: on a bad ``sparsity``, ``where`` or non-tensor leaves.

    Example:
        >>> import torch, fprune
        >>> params = {"fc.weight": torch.zeros(4, 3), "fc.bias": torch.zeros(4)}
        >>> fprune.distributions.uniform(params, 0.5, where=lambda name, p: p.dim() > 1)
        {'fc.weight': 0.5, 'fc.bias': None}
    """
    flat = _tree.flatten(params, "params")
    sparsity = _check_sparsity(sparsity)
    chosen = _tree.selected(flat, where)
    return _tree.unflatten(flat, [sparsity if c else None for c in chosen])


def erk(
    params: Params, sparsity: float, *, where: _tree.Where = None, power_scale: float = 1.0
) -> Any:
    """Erdős-Rényi-Kernel fractions (Evci et al. 2020, RigL): thin layers keep more.

    The density (fraction kept) of a selected leaf of shape ``(d_1, ..., d_k)`` is
    ``eps * ((d_1 + ... + d_k) / (d_1 * ... * d_k)) ** power_scale``, kernel dimensions
    included, with one ``eps`` for all leaves chosen so that the selected leaves keep
    ``(1 - sparsity)`` of their entries in all. A leaf whose density would exceed 1 is kept
    dense (``0.0``) and ``eps`` is solved again for the others, until every density is at most 1
    (RigL's ``get_sparsities_erdos_renyi``, which jaxpruner copies, without its rounding of each
    layer's count). ``power_scale < 1`` makes the distribution flatter (``0`` is uniform). A
    0-dim leaf counts as shape ``(1,)``; empty leaves get ``0.0``.

    Args:
        params: a pytree of tensors (only their shapes are used).
        sparsity: the fraction of all selected entries to prune, a float in [0, 1].
        where: picks the leaves to prune (all when ``None``); the others get ``None`` (not
            pruned) and do not count towards the total.
        power_scale: a non-negative exponent for the raw ERK ratio.

    Returns:
        A pytree like ``params`` of Python floats in [0, 1] (``None`` for the leaves not
        selected).

    Raises:
        TypeError / ValueError: on a bad ``sparsity``, ``power_scale``, ``where`` or leaves.

    Example:
        >>> import torch, fprune
        >>> params = {"a": torch.zeros(4, 4), "b": torch.zeros(100, 100)}
        >>> amounts = fprune.distributions.erk(params, 0.9)
        >>> amounts["a"] < amounts["b"]                  # the small layer is pruned less
        True
        >>> round(amounts["a"] * 16 + amounts["b"] * 10000, 6) == round(0.9 * 10016, 6)
        True
    """
    flat = _tree.flatten(params, "params")
    sparsity = _check_sparsity(sparsity)
    power_scale = _check_power_scale(power_scale)
    chosen = _tree.selected(flat, where)
    shapes = [
        (tuple(p.shape) or (1,)) if c and p.numel() > 0 else None
        for p, c in zip(flat.leaves, chosen)
    ]
    fractions = _erk_fractions(shapes, sparsity, power_scale)
    return _tree.unflatten(flat, _unselected_as_none(fractions, chosen))


def _unselected_as_none(fractions: List[float], chosen: List[bool]) -> List[Any]:
    """``None`` (not pruned, in a per-leaf amount) for the leaves ``where`` did not select."""
    return [f if c else None for f, c in zip(fractions, chosen)]


def _erk_fractions(shapes: List[Any], sparsity: float, power_scale: float = 1.0) -> List[float]:
    """ERK pruning fractions for a list of shapes (``None``: not selected, gets ``0.0``)."""
    sizes = [0 if s is None else math.prod(s) for s in shapes]
    live = [i for i, s in enumerate(shapes) if s is not None]
    out = [0.0] * len(shapes)
    if not live or sparsity == 0.0:
        return out
    if sparsity == 1.0:
        for i in live:
            out[i] = 1.0
        return out
    raw = {i: (sum(shapes[i]) / sizes[i]) ** power_scale for i in live}
    total = sum(sizes[i] for i in live)
    dense: set = set()
    while True:
        # eps * sum(raw_i * n_i over sparse leaves) + sum(n_i over dense leaves)
        #     == (1 - sparsity) * total
        free = [i for i in live if i not in dense]
        if not free:  # only reachable through rounding, with sparsity ~ 0: all dense
            return out
        rhs = (1.0 - sparsity) * total - sum(sizes[i] for i in dense)
        eps = rhs / sum(raw[i] * sizes[i] for i in free)
        top = max(raw[i] for i in free)
        if eps * top <= 1.0:
            break
        # As RigL: every leaf at the maximal raw density becomes dense, then solve again.
        dense.update(i for i in free if raw[i] == top)
    for i in live:
        if i not in dense:
            out[i] = min(1.0, max(0.0, 1.0 - eps * raw[i]))
    return out


def _check_sparsity(sparsity: Any) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real):
        raise TypeError(
            f"Expected sparsity to be a float in [0, 1] (the fraction to prune), got {sparsity!r}."
        )
    if math.isnan(sparsity) or not 0.0 <= float(sparsity) <= 1.0:
        raise ValueError(
            f"Expected sparsity to be a float in [0, 1] (the fraction to prune), got {sparsity!r}."
        )
    return float(sparsity)


def _check_power_scale(power_scale: Any) -> float:
    if isinstance(power_scale, bool) or not isinstance(power_scale, numbers.Real):
        raise TypeError(f"Expected power_scale to be a non-negative float, got {power_scale!r}.")
    if not math.isfinite(power_scale) or power_scale < 0:
        raise ValueError(f"Expected power_scale to be a non-negative float, got {power_scale!r}.")
    return float(power_scale)
