"""Unstructured masks: any single entry can be pruned.

Each function here is a pure function of a pytree of tensors: it returns a pytree of the same
structure holding ``torch.bool`` masks of the same shapes (``True`` = kept) and modifies
nothing. Each is a score function over the selection layer, :mod:`fprune.select`, where the
selection rule (exact counts, tie-break by position, NaN last) is documented.
"""

from __future__ import annotations

import torch

from fprune import _amount, _random, _tree
from fprune._types import Masks, Params, Scores
from fprune.select import EACH, NM, Global, Rows, gather_inputs, given_scores, ranking, select_inputs

__all__ = [
    "identity",
    "l1_unstructured",
    "random_unstructured",
    "global_unstructured",
    "rowwise_unstructured",
    "n_m",
]


def identity(params: Params) -> Masks:
    """Masks that keep everything.

    Example:
        >>> import torch, fprune
        >>> fprune.identity({"w": torch.randn(2, 3)})["w"].all()
        tensor(True)
    """
    flat = _tree.flatten(params, "params")
    return _tree.unflatten(flat, [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves])


# Masks are not differentiable: no_grad spares building an autograd graph over the scores
# when params require grad (dict(model.named_parameters())).
@torch.no_grad()
def l1_unstructured(
    params: Params,
    amount: _amount.Amount,
    *,
    importance_scores: Scores = None,
    masks: Masks = None,
    where: _tree.Where = None,
    signed: bool = False,
) -> Masks:
    """Prune, in every leaf on its own, the ``amount`` entries of lowest magnitude.

    Args:
        params: a pytree of tensors, e.g. ``dict(model.named_parameters())``.
        amount: a float in [0, 1] (fraction of each leaf's remaining entries, rounded with
            Python's ``round``) or an int (a count per leaf); or per-leaf amounts: a dict keyed
            like a flat params dict (``{"fc.weight": 0.5}``) or a pytree shaped like params
            (``None``: skip). Leaves it leaves out are not pruned; an unknown key raises.
        importance_scores: a pytree like ``params``; entries are ranked by ``|importance_scores|``
            instead of ``|params|`` (the magnitude, as torch does).
        masks: prior masks; only entries they keep can be pruned, and ``amount`` is relative
            to those. Pruned entries stay pruned.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune (``name`` is the key
            of a flat dict, dotted path otherwise); the others keep their prior mask, or all True.
        signed: rank ``importance_scores`` (or the params when none are given) by value, the
            lowest pruned first, instead of by magnitude.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks (``True`` = kept).

    Raises:
        TypeError / ValueError: on a bad ``amount``, non-tensor leaves, or trees that do not match.

    Example:
        >>> import torch, fprune
        >>> m = fprune.l1_unstructured({"w": torch.tensor([3.0, -1.0, 2.0, 0.5])}, 0.5)
        >>> m["w"]
        tensor([ True, False,  True, False])
    """
    rank = ranking(signed)
    inputs = gather_inputs(params, amount, importance_scores, masks, where)
    return select_inputs(inputs, given_scores(inputs), amount, EACH, rank=rank)


@torch.no_grad()
def random_unstructured(
    params: Params,
    amount: _amount.Amount,
    *,
    generator: _random.Generator = None,
    masks: Masks = None,
    where: _tree.Where = None,
) -> Masks:
    """Prune, in every leaf on its own, ``amount`` entries chosen uniformly at random.

    Args:
        params: a pytree of tensors.
        amount: a fraction in [0, 1] of each leaf's remaining entries, or a count; or
            per-leaf amounts, as in :func:`l1_unstructured`.
        generator: ``None`` (torch's global generator), a ``torch.Generator``, or an integer
            seed (int or integer tensor) for stateless hash-based randomness that also works
            under ``vmap`` (batch the seed) and ``torch.compile``.
        masks: prior masks; only entries they keep can be pruned.
        where: picks the leaves to prune, as in :func:`l1_unstructured`.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Example:
        >>> import torch, fprune
        >>> m = fprune.random_unstructured({"w": torch.zeros(10)}, 3, generator=0)
        >>> int((~m["w"]).sum())
        3
    """
    _random.check_generator(generator)
    inputs = gather_inputs(params, amount, None, masks, where)
    leaves = inputs.params.leaves
    draws = _random.Draws(generator, lambda i: leaves[i].shape, lambda i: leaves[i].device)
    return select_inputs(inputs, draws, amount, EACH)


Normalize = bool | str | None


@torch.no_grad()
def global_unstructured(
    params: Params,
    amount: _amount.Amount,
    *,
    importance_scores: Scores = None,
    masks: Masks = None,
    normalize: Normalize = False,
    where: _tree.Where = None,
    signed: bool = False,
    min_keep: int | float | None = None,
) -> Masks:
    """Prune the ``amount`` lowest-scoring entries across all leaves together (one ranking).

    This is the global magnitude threshold over every flattened parameter, computed without
    concatenating the scores: the selection streams over the leaves (see the README's
    "Selection rule"). Ties across leaves are broken by leaf order (optree's flatten order,
    a dict's keys sorted), then by position within the leaf.

    Args:
        params: a pytree of tensors.
        amount: a fraction in [0, 1] of all remaining entries (of the selected leaves), or a count.
        importance_scores: a pytree like ``params``; entries are ranked by ``|importance_scores|``
            instead of ``|params|`` (as torch's ``L1Unstructured`` does).
        masks: prior masks; only entries they keep can be pruned, ``amount`` is relative to them.
        normalize: ``False`` (torch's behaviour), ``"l1"`` or ``"l2"`` (or ``True`` for
            ``"l2"``): divide each leaf's scores by their norm over its kept entries before the
            ranking. The ranking then ignores each leaf's scale, but larger leaves get smaller
            normalized scores (about ``1/n`` or ``1/sqrt(n)``) and are pruned first: it does not
            keep a layer from being pruned entirely (README, "Normalization", has figures).
        where: picks the leaves that take part, as in :func:`l1_unstructured`.
        signed: rank ``importance_scores`` (or the params) by value, the lowest pruned first,
            instead of by magnitude (GraSP's signed score).
        min_keep: protection against layer collapse: every leaf keeps at least this many
            entries (an int) or this fraction of its entries (a float, ``round(min_keep *
            numel)``), or all that prior masks left it if that is less. The count pruned is
            unchanged: leaves at their floor stop contributing and the rest of the count goes
            to the others, in the same order. A count the floors cannot allow raises
            ``ValueError`` (under a transform it is capped). See :class:`fprune.select.Global`.

    Warns:
        UserWarning: in eager code, when the call prunes every remaining entry of a leaf.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Example:
        >>> import torch, fprune
        >>> params = {"a": torch.tensor([0.1, 5.0]), "b": torch.tensor([0.2, 0.3, 4.0])}
        >>> masks = fprune.global_unstructured(params, 0.6)
        >>> masks["a"], masks["b"]
        (tensor([False,  True]), tensor([False, False,  True]))
    """
    scope = Global(normalize=normalize, min_keep=min_keep)
    rank = ranking(signed)
    inputs = gather_inputs(params, amount, importance_scores, masks, where)
    return select_inputs(inputs, given_scores(inputs), amount, scope, rank=rank)


@torch.no_grad()
def rowwise_unstructured(
    params: Params,
    amount: _amount.Amount,
    *,
    dim: int = 0,
    importance_scores: Scores = None,
    masks: Masks = None,
    where: _tree.Where = None,
    signed: bool = False,
) -> Masks:
    """Prune, in every slice along ``dim`` of every leaf on its own, its lowest-scoring entries.

    Every index along ``dim`` is its own comparison group (Wanda's per-output selection with
    ``dim=0`` on a Linear weight): each slice loses ``round(amount * remaining)`` of the entries
    it still has (or ``amount`` of them, for an int). The slices of a 1-d leaf are single
    entries: leave biases out with ``where``.

    Args:
        params: a pytree of tensors.
        amount: a fraction in [0, 1] of each slice's remaining entries, or a count per slice;
            or per-leaf amounts, as in :func:`l1_unstructured`.
        dim: the dim whose indices are the groups (``0``: the rows of a weight matrix).
        importance_scores: a pytree like ``params``; entries are ranked by ``|importance_scores|``.
        masks: prior masks; only entries they keep can be pruned.
        where: picks the leaves to prune, as in :func:`l1_unstructured`.
        signed: rank by value, the lowest pruned first, instead of by magnitude.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Raises:
        TypeError / ValueError: a bad ``amount``, or an int ``amount`` above what a slice has left.
        IndexError: ``dim`` out of range for a leaf.

    Example:
        >>> import torch, fprune
        >>> w = torch.tensor([[1.0, -4.0, 2.0, 3.0], [0.1, 0.2, 0.3, -9.0]])
        >>> fprune.rowwise_unstructured({"w": w}, 0.5)["w"]
        tensor([[False,  True, False,  True],
                [False, False,  True,  True]])
    """
    rank = ranking(signed)
    inputs = gather_inputs(params, amount, importance_scores, masks, where)
    return select_inputs(inputs, given_scores(inputs), amount, Rows(dim), rank=rank)


@torch.no_grad()
def n_m(
    params: Params,
    n: int,
    m: int,
    *,
    dim: int = -1,
    importance_scores: Scores = None,
    masks: Masks = None,
    where: _tree.Where = None,
    signed: bool = False,
) -> Masks:
    """N:M sparsity: in every group of ``m`` consecutive entries along ``dim``, keep the ``n`` best.

    2:4 sparsity is ``n_m(params, 2, 4)``; for conv weights the input channels are ``dim=1``.
    Ties follow the library's rule: the earlier entry is pruned first, so a group of equal
    scores keeps its last ``n``. Entries that prior masks pruned stay pruned: a group keeps
    ``min(n, alive)`` entries.

    Args:
        params: a pytree of tensors; each selected leaf's size along ``dim`` is a multiple of ``m``.
        n: entries kept per group, ``0 <= n <= m``.
        m: the group size.
        dim: the dim along which groups of ``m`` consecutive entries are formed.
        importance_scores: a pytree like ``params``; entries are ranked by ``|importance_scores|``.
        masks: prior masks; what they pruned stays pruned.
        where: picks the leaves to prune, as in :func:`l1_unstructured`.
        signed: rank by value, the lowest pruned first, instead of by magnitude.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Raises:
        TypeError: ``n`` or ``m`` not an int.
        ValueError: ``n > m``, ``n < 0``, or a leaf whose size along ``dim`` is not a multiple of ``m``.
        IndexError: ``dim`` out of range for a leaf.

    Example:
        >>> import torch, fprune
        >>> w = torch.tensor([[0.1, -3.0, 2.0, 0.5, 1.0, 1.0, 1.0, 1.0]])
        >>> fprune.n_m({"w": w}, 2, 4)["w"]
        tensor([[False,  True,  True, False, False, False,  True,  True]])
    """
    scope = NM(n, m, dim)
    rank = ranking(signed)
    inputs = gather_inputs(params, None, importance_scores, masks, where, check_amount=False)
    return select_inputs(inputs, given_scores(inputs), None, scope, rank=rank)
