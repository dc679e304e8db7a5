"""Unstructured masks: any single entry can be pruned.

Each function here is a pure function of a pytree of tensors: it returns a pytree of the same
structure holding ``torch.bool`` masks of the same shapes (``True`` = kept) and modifies
nothing. The selection rule (exact counts, tie-break by position, NaN last) is documented in
:mod:`fprune._select` and in the README.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from fprune import _amount, _distributed, _inputs, _random, _select, _tree

__all__ = ["identity", "l1_unstructured", "random_unstructured", "global_unstructured"]


def identity(params: Any) -> Any:
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
    params: Any,
    amount: _amount.Amount,
    *,
    importance_scores: Any = None,
    masks: Any = None,
    where: _tree.Where = None,
) -> Any:
    """Prune, in every leaf on its own, the ``amount`` entries of lowest magnitude.

    Args:
        params: a pytree of tensors, e.g. ``dict(model.named_parameters())``.
        amount: a float in [0, 1] (fraction of each leaf's remaining entries, rounded with
            Python's ``round``) or an int (a count per leaf).
        importance_scores: a pytree like ``params``; entries are ranked by ``|importance_scores|``
            instead of ``|params|`` (the magnitude, as torch does).
        masks: prior masks; only entries they keep can be pruned, and ``amount`` is relative
            to those. Pruned entries stay pruned.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune (``name`` is the key
            of a flat dict, dotted path otherwise); the others keep their prior mask, or all True.

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
    if _distributed.holds_dtensor(params, importance_scores, masks):
        return _distributed.l1_unstructured(
            params, amount, importance_scores=importance_scores, masks=masks, where=where
        )
    inputs = _inputs.gather(params, amount, importance_scores, masks, where)
    new = {}
    for i, (p, chosen) in enumerate(zip(inputs.params.leaves, inputs.chosen)):
        if chosen:
            scores = inputs.scores[i]
            new[i] = _prune_leaf(inputs, i, amount, p if scores is None else scores, torch.abs)
    return _inputs.finish(inputs, new)


@torch.no_grad()
def random_unstructured(
    params: Any,
    amount: _amount.Amount,
    *,
    generator: _random.Generator = None,
    masks: Any = None,
    where: _tree.Where = None,
) -> Any:
    """Prune, in every leaf on its own, ``amount`` entries chosen uniformly at random.

    Args:
        params: a pytree of tensors.
        amount: a fraction in [0, 1] of each leaf's remaining entries, or a count.
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
    inputs = _inputs.gather(params, amount, None, masks, where)
    new = {}
    for i, (p, chosen) in enumerate(zip(inputs.params.leaves, inputs.chosen)):
        if chosen:
            scores = _random.uniform(p.shape, generator, i, p.device)
            new[i] = _prune_leaf(inputs, i, amount, scores, None)
    return _inputs.finish(inputs, new)


def _prune_leaf(inputs, i, amount, values, transform) -> torch.Tensor:
    """One leaf's mask: prune the lowest-scoring entries among those the prior mask keeps."""
    p, prior = inputs.params.leaves[i], inputs.prior[i]
    alive = _inputs.remaining(prior, p.numel(), inputs.traced)
    name = _tree.describe("params", inputs.params.paths[i])
    k = _amount.count(amount, alive, "parameters", name) + (p.numel() - alive)
    dtype = _select.key_dtype([values])
    (keep,) = _select.prune_lowest(
        [(p.numel(), _select.keys(values, prior, dtype, transform))],
        k,
        traced=inputs.traced,
        device=p.device,
    )
    return keep.view(p.shape)


Normalize = Union[bool, str, None]
_NORMS = {"l1": 1.0, "l2": 2.0}


@torch.no_grad()
def global_unstructured(
    params: Any,
    amount: _amount.Amount,
    *,
    importance_scores: Any = None,
    masks: Any = None,
    normalize: Normalize = False,
    where: _tree.Where = None,
) -> Any:
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
            ranking, so that no layer is wiped out just because its scale is small.
        where: picks the leaves that take part, as in :func:`l1_unstructured`.

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Example:
        >>> import torch, fprune
        >>> params = {"a": torch.tensor([0.1, 5.0]), "b": torch.tensor([0.2, 0.3, 4.0])}
        >>> masks = fprune.global_unstructured(params, 0.6)
        >>> masks["a"], masks["b"]
        (tensor([False,  True]), tensor([False, False,  True]))
    """
    norm = _check_normalize(normalize)
    if _distributed.holds_dtensor(params, importance_scores, masks):
        return _distributed.global_unstructured(
            params, amount, importance_scores=importance_scores, masks=masks, norm=norm, where=where
        )
    inputs = _inputs.gather(params, amount, importance_scores, masks, where)
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    if not chosen:
        return _inputs.finish(inputs, {})
    sizes = [inputs.params.leaves[i].numel() for i in chosen]
    alive = [_inputs.remaining(inputs.prior[i], n, inputs.traced) for i, n in zip(chosen, sizes)]
    total_alive = sum(alive)
    k = _amount.count(amount, total_alive, "parameters") + (sum(sizes) - total_alive)
    values = [
        inputs.params.leaves[i] if inputs.scores[i] is None else inputs.scores[i] for i in chosen
    ]
    dtype = _select.key_dtype(values)
    sources = []
    for i, v, n in zip(chosen, values, sizes):
        transform = _score_transform(v, inputs.prior[i], norm, dtype)
        sources.append((n, _select.keys(v, inputs.prior[i], dtype, transform)))
    device = inputs.params.leaves[chosen[0]].device
    keeps = _select.prune_lowest(sources, k, traced=inputs.traced, device=device)
    new = {i: keep.view(inputs.params.leaves[i].shape) for i, keep in zip(chosen, keeps)}
    return _inputs.finish(inputs, new)


def _check_normalize(normalize: Normalize) -> Optional[float]:
    if normalize is None or normalize is False:
        return None
    if normalize is True:
        return _NORMS["l2"]
    if isinstance(normalize, str) and normalize in _NORMS:
        return _NORMS[normalize]
    raise ValueError(
        f"Expected normalize to be False, True, 'l1' or 'l2', got {normalize!r}."
    )


def _score_transform(
    values: torch.Tensor,
    keep: Optional[torch.Tensor],
    norm: Optional[float],
    key_dtype: torch.dtype,
) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """How one leaf's values become its scores (magnitudes, maybe normalized), chunk by chunk."""
    if norm is None:
        return torch.abs
    kept = values if keep is None else torch.where(keep, values, torch.zeros((), dtype=values.dtype))
    scale = torch.linalg.vector_norm(kept.to(torch.float64), ord=norm)
    work = torch.float32 if key_dtype == torch.int32 else torch.float64
    scale = torch.clamp(scale, min=torch.finfo(work).tiny).to(work)
    return lambda chunk: chunk.to(work).abs() / scale
