"""Structured masks: whole channels (slices along one ``dim``) are pruned together.

A channel of a leaf is the slice ``leaf.select(dim, c)``. Each function ranks the channels of
every leaf on its own and prunes ``amount`` of those the prior masks still keep (a channel is
kept while any of its entries is), exactly as ``torch.nn.utils.prune`` does.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Union

import torch

from fprune import _amount, _distributed, _inputs, _random, _select, _tree

__all__ = ["ln_structured", "random_structured"]

Norm = Union[int, float, str]


# Masks are not differentiable: no_grad spares building an autograd graph over the scores
# when params require grad (dict(model.named_parameters())).
@torch.no_grad()
def ln_structured(
    params: Any,
    amount: _amount.Amount,
    n: Norm,
    dim: int,
    *,
    importance_scores: Any = None,
    masks: Any = None,
    where: _tree.Where = None,
) -> Any:
    """Prune, in every leaf, the ``amount`` channels along ``dim`` of lowest L``n`` norm.

    Args:
        params: a pytree of tensors with at least 2 dims each (use ``where`` to skip biases).
        amount: a fraction in [0, 1] of each leaf's remaining channels, or a count.
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
    if _distributed.holds_dtensor(params, importance_scores, masks):
        return _distributed.ln_structured(
            params, amount, n, dim, importance_scores=importance_scores, masks=masks, where=where,
            check_dim=_check_dim,
        )
    inputs = _inputs.gather(params, amount, importance_scores, masks, where)

    def channel_scores(i: int, p: torch.Tensor, d: int) -> torch.Tensor:
        values, prior = inputs.scores[i], inputs.prior[i]
        if values is None:
            values = p if prior is None else torch.where(prior, p, torch.zeros((), dtype=p.dtype))
        others = [x for x in range(p.dim()) if x != d]
        return torch.norm(values, p=n, dim=others)

    return _prune_channels(inputs, amount, dim, channel_scores)


@torch.no_grad()
def random_structured(
    params: Any,
    amount: _amount.Amount,
    dim: int,
    *,
    generator: _random.Generator = None,
    masks: Any = None,
    where: _tree.Where = None,
) -> Any:
    """Prune, in every leaf, ``amount`` channels along ``dim`` chosen uniformly at random.

    Args:
        params: a pytree of tensors with at least 2 dims each.
        amount: a fraction in [0, 1] of each leaf's remaining channels, or a count.
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
    inputs = _inputs.gather(params, amount, None, masks, where)

    def channel_scores(i: int, p: torch.Tensor, d: int) -> torch.Tensor:
        return _random.uniform((p.shape[d],), generator, i, p.device)

    return _prune_channels(inputs, amount, dim, channel_scores)


def _check_norm(n: Any) -> None:
    if isinstance(n, str):
        if n not in ("fro", "nuc"):
            raise ValueError(f"Expected n to be a number, inf, -inf, 'fro' or 'nuc', got {n!r}.")
    elif isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(f"Expected n to be a number, inf, -inf, 'fro' or 'nuc', got {n!r}.")


def _check_dim(dim: Any, p: torch.Tensor, location: str = "", hint: str = "") -> int:
    """torch's structured checks, ``dim`` normalized: >= 2 dims (ValueError), an int ``dim``
    (TypeError) in range (IndexError). ``location`` names the tensor, ``hint`` says what to do.
    """
    if p.dim() < 2:
        raise ValueError(
            f"Structured pruning can only be applied to multidimensional tensors. Found tensor "
            f"of shape {tuple(p.shape)} with {p.dim()} dims{location}; {hint}"
        )
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"Expected dim to be an int, got {dim!r}.")
    if not -p.dim() <= dim < p.dim():
        raise IndexError(
            f"Invalid index {dim} for tensor of size {tuple(p.shape)}{location}: expected dim in "
            f"[{-p.dim()}, {p.dim() - 1}]."
        )
    return int(dim) % p.dim()


def _prune_channels(
    inputs: _inputs.Inputs,
    amount: _amount.Amount,
    dim: int,
    channel_scores: Callable[[int, torch.Tensor, int], torch.Tensor],
) -> Any:
    flat = inputs.params
    dims = {
        i: _check_dim(
            dim,
            p,
            f" at {_tree.describe('params', path)}",
            "leave such leaves out with where=lambda name, p: p.dim() > 1.",
        )
        for i, (path, p, chosen) in enumerate(zip(flat.paths, flat.leaves, inputs.chosen))
        if chosen
    }
    new = {}
    for i, d in dims.items():
        p, prior = flat.leaves[i], inputs.prior[i]
        others = [x for x in range(p.dim()) if x != d]
        alive_channels = None if prior is None else prior.any(dim=others) if others else prior
        channels = p.shape[d]
        alive = _inputs.remaining(alive_channels, channels, inputs.traced)
        name = _tree.describe("params", flat.paths[i])
        k = _amount.count(amount, alive, "channels", f"{name} along dim {d}") + (channels - alive)
        scores = channel_scores(i, p, d)
        dtype = _select.key_dtype([scores])
        (keep,) = _select.prune_lowest(
            [(channels, _select.keys(scores, alive_channels, dtype))],
            k,
            traced=inputs.traced,
            device=p.device,
        )
        shape = [1] * p.dim()
        shape[d] = channels
        keep = keep.view(shape).expand(p.shape)
        new[i] = keep.contiguous() if prior is None else keep & prior
    return _inputs.finish(inputs, new)
