"""Iterative global pruning on an exponential schedule, re-scoring before every round.

Exported as :func:`fprune.iterative`. Eager code: it counts the entries left after every round.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from fprune import _amount, _warn
from fprune._types import Masks, Params, Scores
from fprune.methods._unstructured import global_unstructured
from fprune.select import LayerCollapseWarning, _inputs

__all__ = ["iterative"]


def iterative(
    score_fn: Callable[[Masks], Scores],
    params: Params,
    amount: _amount.Amount,
    *,
    rounds: int,
    masks: Masks = None,
    where: Any = None,
    signed: bool = False,
    min_keep: int | float | None = None,
) -> Masks:
    """Global pruning in ``rounds`` steps, with fresh scores before each step.

    Let ``n`` be the number of entries of the selected leaves that the prior ``masks`` keep.
    After round ``r`` of ``R`` the masks keep ``round(n * (1 - amount) ** (r / R))`` of them
    (an exponential schedule, as SynFlow uses); the last round is exact: it keeps
    ``n - round(amount * n)``, the count :func:`fprune.global_unstructured` would keep. Before
    each round ``score_fn(masks)`` is called exactly once, first with the prior ``masks`` as
    given (``None`` if none), then with the masks of the previous round; the entries of lowest
    ``|score|`` (lowest score with ``signed=True``) among those still kept are pruned
    (one global ranking over the selected leaves,
    :func:`fprune.global_unstructured` with ``importance_scores=``). With one round it is
    :func:`fprune.global_unstructured` on ``score_fn(masks)``.

    SynFlow (Tanaka et al. 2020) is ``iterative(lambda m: fprune.scores.synflow(model, params,
    x, masks=m), params, 0.99, rounds=100, where=lambda name, p: p.dim() > 1)``; iterative SNIP
    the same with :func:`fprune.scores.snip`.

    Args:
        score_fn: ``score_fn(masks) -> scores``, a pytree shaped like ``params``.
        params: a pytree of tensors.
        amount: the fraction in [0, 1] of the entries the prior masks keep to prune in all, or
            a count (then the schedule's ratio is the kept fraction it implies). A Python
            number: this function counts in eager code.
        rounds: the number of rounds, an int >= 1.
        masks: prior masks; what they prune stays pruned, ``amount`` is relative to what they keep.
        where: ``where(name, tensor) -> bool`` picks the leaves that take part.
        signed: ``True`` ranks scores by value (lowest pruned first) instead of by magnitude,
            as GraSP's signed score needs.
        min_keep: protection against layer collapse in every round, as in
            :func:`fprune.global_unstructured`: each leaf keeps at least this many entries (an
            int) or this fraction of its entries (a float). The schedule's counts are unchanged.

    Warns:
        LayerCollapseWarning: once per call, naming the round and the leaves, when a round
            prunes every remaining entry of a leaf (pass ``min_keep=`` to prevent it).

    Returns:
        A pytree like ``params`` of ``torch.bool`` masks.

    Raises:
        TypeError / ValueError: a bad ``score_fn``, ``amount``, ``rounds``, trees that do not
            match, or an ``amount`` above what remains; scores that do not match ``params``
            raise from the selection.

    Example:
        >>> import torch, fprune
        >>> params = {"w": torch.arange(1.0, 101.0)}
        >>> seen = []
        >>> def score_fn(masks):
        ...     seen.append(100 if masks is None else int(masks["w"].sum()))
        ...     return fprune.scores.magnitude(params, masks=masks)
        >>> masks = fprune.iterative(score_fn, params, 0.99, rounds=2)
        >>> seen, int(masks["w"].sum())               # kept: 100, round(100 * 0.01 ** 0.5), 1
        ([100, 10], 1)
    """
    if not callable(score_fn):
        raise TypeError(f"Expected score_fn to be a callable masks -> scores, got {score_fn!r}.")
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral):
        raise TypeError(f"Expected rounds to be an int >= 1, got {rounds!r}.")
    if rounds < 1:
        raise ValueError(f"Expected rounds to be an int >= 1, got {rounds!r}.")
    if isinstance(amount, torch.Tensor):
        raise TypeError(
            "Expected amount to be an int or a float: iterative counts in eager code, got a tensor."
        )
    if not isinstance(signed, bool):
        raise TypeError(f"Expected signed to be a bool, got {signed!r}.")
    inputs = _inputs.gather(params, amount, None, masks, where)
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    start = sum(_inputs.remaining(inputs.prior[i], inputs.params.leaves[i].numel(), False) for i in chosen)
    final_keep = start - _amount.count(amount, start, "parameters", "params (the leaves where= selects)")
    if start == 0:
        ratio = 1.0
    elif isinstance(amount, numbers.Integral):
        ratio = final_keep / start
    else:
        ratio = 1.0 - float(amount)
    current, alive = masks, start
    collapsed = []
    for r in range(1, rounds + 1):
        keep = final_keep if r == rounds else round(start * ratio ** (r / rounds))
        keep = max(final_keep, min(alive, keep))
        scores = score_fn(current)
        # fprune's warnings of the round are gathered (not caught with warnings.catch_warnings,
        # which would reset Python's record of the warnings already shown)
        with _warn.collected() as caught:
            current = global_unstructured(
                params,
                alive - keep,
                importance_scores=scores,
                masks=current,
                where=where,
                signed=signed,
                min_keep=min_keep,
            )
        for message, category in caught:
            if issubclass(category, LayerCollapseWarning):
                collapsed.append(f"round {r}: {message}")
            else:
                _warn.warn(message, category)
        alive = keep
    if collapsed:
        _warn.warn(
            f"iterative pruning collapsed a layer ({len(collapsed)} of {rounds} rounds); the first, "
            f"{collapsed[0]}",
            LayerCollapseWarning,
        )
    return current
