"""Structured masks: whole channels (slices along one ``dim``) are pruned together.

A channel of a leaf is the slice ``leaf.select(dim, c)``. Each function ranks the channels of
every leaf on its own and prunes ``amount`` of those the prior masks still keep (a channel is
kept while any of its entries is), exactly as ``torch.nn.utils.prune`` does. Both are score
functions over the :class:`fprune.select.Channels` scope. :func:`block_structured` prunes
whole tiles of each matrix instead (the :class:`fprune.select.Blocks` scope).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from fprune import _amount, _random, _tree
from fprune._types import Masks, Params, Scores
from fprune.select import Blocks, Channels, gather_inputs, given_scores, select_inputs

__all__ = ["ln_structured", "random_structured", "block_structured"]

Norm = int | float | str


# Masks are not differentiable: no_grad spares building an autograd graph over the scores
# when params require grad (dict(model.named_parameters())).
@torch.no_grad()
def ln_structured(
    params: Params,
    amount: _amount.Amount,
    n: Norm,
    dim: int,
    *,
    importance_scores: Scores = None,
    masks: Masks = None,
    where: _tree.Where = None,
) -> Masks:
    """Prune, in every leaf, the ``amount`` channels along ``dim`` of lowest L``n`` norm.

    Args:
        params: a pytree of tensors with at least 2 dims each (use ``where`` to skip biases).
        amount: a fraction in [0, 1] of each leaf's remaining channels, or a count; or
            per-leaf amounts, as in :func:`fprune.l1_unstructured`.
        n: the norm's order, as ``torch.norm``'s ``p``: an int, a float, ``inf``, ``-inf``,
            ``'fro'`` or ``'nuc'``.
        dim: the dimension that indexes channels (``0``: output channels of conv/linear weights).
        importance_scores: a pytree like ``params``; channel scores are their norms. Without it,
            the norms are those of the pruned values (entries prior masks pruned count as zero).
        masks: prior masks; only channels they keep can be pruned. Entries they pruned stay pruned.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Raises:
        ValueError: a leaf with fewer than 2 dims, a bad ``amount``.
        IndexError: ``dim`` out of range for a leaf.

    Example:
        >>> import torch, fprune
        >>> w = torch.tensor([[1.0, 1.0], [0.1, 0.1], [2.0, 0.0]])
        >>> fprune.ln_structured({"w": w}, 1, n=2, dim=0)["w"]
        tensor([[ True,  True],
                [False, False],
                [ True,  True]])
    """
    _check_norm(n)
    inputs = gather_inputs(params, amount, importance_scores, masks, where)

    def values(i: int) -> torch.Tensor:
        # The entries' scores; the channel's is their L``n`` norm. Without importance_scores,
        # the pruned values (what prior masks pruned counts as zero), as torch ranks them.
        given, p, prior = inputs.scores[i], inputs.params.leaves[i], inputs.prior[i]
        if given is not None:
            return given
        return p if prior is None else torch.where(prior, p, torch.zeros((), dtype=p.dtype))

    return select_inputs(inputs, values, amount, Channels(dim, reduce=n))


@torch.no_grad()
def random_structured(
    params: Params,
    amount: _amount.Amount,
    dim: int,
    *,
    generator: _random.Generator = None,
    masks: Masks = None,
    where: _tree.Where = None,
) -> Masks:
    """Prune, in every leaf, ``amount`` channels along ``dim`` chosen uniformly at random.

    Args:
        params: a pytree of tensors with at least 2 dims each.
        amount: a fraction in [0, 1] of each leaf's remaining channels, or a count; or
            per-leaf amounts, as in :func:`fprune.l1_unstructured`.
        dim: the dimension that indexes channels.
        generator: ``None`` (global generator), a ``torch.Generator``, or an integer seed
            (stateless, works under ``vmap`` and ``torch.compile``).
        masks: prior masks; only channels they keep can be pruned.
        where: picks the leaves to prune.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Example:
        >>> import torch, fprune
        >>> m = fprune.random_structured({"w": torch.ones(4, 3)}, 0.5, dim=0, generator=1)
        >>> m["w"].all(dim=1).sum().item(), (m["w"].any(dim=1) == m["w"].all(dim=1)).all().item()
        (2, True)
    """
    _random.check_generator(generator)
    inputs = gather_inputs(params, amount, None, masks, where)
    leaves = inputs.params.leaves
    # One draw per channel (dim is checked by the scope, before any draw is made).
    draws = _random.Draws(generator, lambda i: (leaves[i].shape[dim],), lambda i: leaves[i].device)
    return select_inputs(inputs, draws, amount, Channels(dim, reduce=None))


def _check_norm(n: Any) -> None:
    if isinstance(n, str):
        if n not in ("fro", "nuc"):
            raise ValueError(f"Expected n to be a number, inf, -inf, 'fro' or 'nuc', got {n!r}.")
    elif isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(f"Expected n to be a number, inf, -inf, 'fro' or 'nuc', got {n!r}.")


@torch.no_grad()
def block_structured(
    params: Params,
    amount: _amount.Amount,
    shape: tuple[int, int],
    *,
    p: float = 2,
    importance_scores: Scores = None,
    masks: Masks = None,
    where: _tree.Where = None,
) -> Masks:
    """Prune, in every matrix, the ``amount`` tiles of ``shape`` whose values have the lowest
    ``p``-norm: a score function over the :class:`fprune.select.Blocks` scope (its docstring
    says how edge tiles and leaves of more than 2 dims are cut).

    Args:
        params: a pytree of tensors with at least 2 dims each (use ``where`` to skip biases).
        amount: a fraction in [0, 1] of each leaf's remaining tiles, or a count; or per-leaf
            amounts, as in :func:`fprune.l1_unstructured`.
        shape: the tile, ``(rows, columns)``.
        p: the order of the tiles' norm.
        importance_scores: a pytree like ``params``; tile scores are the norms of theirs.
        masks: prior masks; a tile is alive while they keep any of its entries.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Example:
        >>> import torch, fprune
        >>> w = {"w": torch.tensor([[1.0, 1.0, 0.1, 0.1], [1.0, 1.0, 0.1, 0.1]])}
        >>> fprune.block_structured(w, 1, (2, 2))["w"]
        tensor([[ True,  True, False, False],
                [ True,  True, False, False]])
    """
    inputs = gather_inputs(params, amount, importance_scores, masks, where)
    return select_inputs(inputs, given_scores(inputs), amount, Blocks(shape, p))
