"""Private: dynamic sparse training, :func:`dynamic_sparse` and its two named instances,
:func:`sparse_evolutionary` (SET) and :func:`rigl`, with their state, :class:`DynamicSparseState`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from fprune import _amount, _random, _tree, distributions
from fprune.pruners import _core
from fprune.pruners._core import Pruner, Schedule
from fprune.pruners._criteria import (
    Criterion,
    CriterionScores,
    GivenGrads,
    Leaf,
    gradient_magnitude,
    magnitude,
    uniform_random,
)
from fprune.select import EACH, gather_inputs, given_scores, select_inputs


class DynamicSparseState(NamedTuple):
    """The state of :func:`dynamic_sparse` (and so of :func:`sparse_evolutionary`, :func:`rigl`).

    Attributes:
        masks: bool masks shaped like ``params``.
        step: 0-dim int64 tensor, the number of updates done.
        regrown: bool tensors shaped like ``params``: the entries the last update regrew.
        seed: 0-dim int64 tensor, the seed of the pruner's stateless randomness.
    """

    masks: Any
    step: torch.Tensor
    regrown: Any
    seed: torch.Tensor


# torch.load(weights_only=True) refuses classes it does not know; this state is tensors only.
torch.serialization.add_safe_globals([DynamicSparseState])


class _Exchange:
    """SET/RigL's count: ``k = min(round(fraction * active), inactive)``, to drop among the
    active entries (``remaining`` is the active count) or to grow among the inactive ones
    (``remaining`` is the inactive count)."""

    def __init__(self, fraction: Any, grow: bool):
        self.fraction = fraction
        self.grow = grow

    def __call__(self, remaining: Any, size: Any) -> Any:
        active = size - remaining if self.grow else remaining
        return _core.minimum(_amount.round_count(self.fraction, active), size - active)

    def __repr__(self) -> str:
        return f"exchange({_core.shown(self.fraction)}, {'grow' if self.grow else 'drop'})"


def dynamic_sparse(
    sparsity: float,
    *,
    drop: Criterion = magnitude,
    grow: Criterion,
    drop_fraction: float | Schedule,
    every: int,
    end: int,
    distribution: str = "erk",
    where: _tree.Where = None,
    seed: Any = 0,
) -> Pruner:
    """Dynamic sparse training with a drop and a grow criterion: SET, RigL and their kin.

    ``init`` draws random masks with each selected leaf at its sparsity (``distribution``:
    ``"erk"`` or ``"uniform"``, see :mod:`fprune.distributions`; each leaf prunes
    ``round(fraction * numel)`` entries of lowest seeded draw). At update steps before ``end``,
    each leaf drops ``k = min(round(drop_fraction(step) * active), inactive)`` of its active
    entries, those of lowest ``drop`` score, and regrows ``k`` of the entries inactive before
    the update (the ones just dropped excluded), those of highest ``grow`` score, so every
    leaf's sparsity stays constant. Ties go to the first position; NaN scores are dropped and
    grown last. ``state.regrown`` marks the regrown entries: start them at zero with
    :func:`zero_regrown`.

    A criterion is one function of a :class:`Leaf` returning scores shaped like its
    parameter, higher = more important; it runs eagerly, under ``vmap`` and
    ``torch.compile``, and on DTensor params (torch ops on DTensors give DTensors)::

        def momentum_grow(leaf):          # grow where the gradient is large and the weight small
            return leaf.grad.abs() / (1 + leaf.param.abs())

    Args:
        sparsity: the overall fraction of selected entries to prune, in [0, 1].
        drop: the drop criterion (default :func:`magnitude`).
        grow: the grow criterion (:func:`uniform_random` for SET, :func:`gradient_magnitude`
            for RigL).
        drop_fraction: a fraction in [0, 1] or a schedule ``step -> fraction`` (such as
            :func:`fprune.schedules.cosine_decay` with bound parameters).
        every: update the masks every ``every`` steps (an int >= 1).
        end: no updates from this step on (exclusive; an int >= 1).
        distribution: how ``sparsity`` is spread over leaves: ``"erk"`` or ``"uniform"``.
        where: picks the leaves to prune; by default those with two dimensions or more.
        seed: an int or a 0-dim integer tensor (a batched one under ``vmap``): the initial
            masks' draws and ``leaf.seed`` (hashed with the step).

    Returns:
        A :class:`Pruner` whose state is a :class:`DynamicSparseState`.

    Example:
        >>> import torch, fprune
        >>> def small_weights_first(leaf):            # a drop criterion: prune the largest
        ...     return -leaf.param.abs()
        >>> pruner = fprune.dynamic_sparse(0.5, drop=small_weights_first,
        ...     grow=fprune.pruners.uniform_random, drop_fraction=0.5, every=1, end=9)
        >>> params = {"w": torch.arange(16.0).reshape(4, 4)}
        >>> state = pruner.init(params)
        >>> masks, state = pruner.update(params, state)
        >>> int(masks["w"].sum()), int(state.regrown["w"].sum())
        (8, 4)
    """
    sparsity = _core.check_fraction("sparsity", sparsity)
    for name, criterion in (("drop", drop), ("grow", grow)):
        if not callable(criterion):
            raise TypeError(
                f"Expected {name} to be a criterion, a callable leaf -> scores, got {criterion!r}."
            )
    if distribution not in ("erk", "uniform"):
        raise ValueError(f'Expected distribution to be "erk" or "uniform", got {distribution!r}.')
    drop_fraction = _core.check_schedule("drop_fraction", drop_fraction)
    every = _core.check_every(every)
    end = _core.check_end(end)
    _core.check_where(where)
    seed = _core.check_seed(seed)
    spread = distributions.erk if distribution == "erk" else distributions.uniform
    pick = _core.weights if where is None else where

    def init(params: Any) -> DynamicSparseState:
        flat = _tree.flatten(params, "params")
        seed_t = _core.seed_tensor(seed, _core.device_of(flat))
        selected = [i for i, c in enumerate(_core.chosen(flat, pick)) if c]
        fractions = _selected_fractions(flat, selected, sparsity, spread)
        amounts = {_tree.dotted(flat.paths[i]): fractions[i] for i in selected}
        inputs = gather_inputs(_core.detached(flat), amounts, None, None, pick)
        leaves = inputs.params.leaves
        draws = _random.Draws(seed_t, lambda i: leaves[i].shape, lambda i: leaves[i].device)
        masks = _tree.flatten(select_inputs(inputs, draws, amounts, EACH), "masks").leaves
        nothing = _tree.unflatten(flat, [torch.zeros_like(m) for m in masks])
        return DynamicSparseState(
            **_core.core_fields(flat, masks, _core.first_step(flat)), regrown=nothing, seed=seed_t
        )

    def update(
        params: Any, state: DynamicSparseState, *, grads: Any = None
    ) -> tuple[Any, DynamicSparseState]:
        flat = _tree.flatten(params, "params")
        prior = _core.check_state(state, flat, DynamicSparseState)
        step = state.step
        is_update = _core.is_update(step, every, end)
        if _core.skip(step, is_update):
            return _core.advance(
                flat, prior, state, regrown=_tree.unflatten(flat, [torch.zeros_like(m) for m in prior])
            )
        fraction = _core.schedule_value(drop_fraction, step, "drop_fraction")
        step_seed = _core.step_seed(state.seed, step)
        plain = [p.detach() for p in flat.leaves]
        detached = _tree.unflatten(flat, plain)
        given = GivenGrads(flat, grads)
        leaves = [
            Leaf(p, m, step_seed, i, _tree.dotted(path), given)
            for i, (path, p, m) in enumerate(zip(flat.paths, plain, prior, strict=True))
        ]
        # Drop: the k active entries of lowest drop score (prior masks: only active ones count).
        rule = _Exchange(fraction, grow=False)
        inputs = gather_inputs(detached, rule, None, state.masks, pick)
        if drop is magnitude:  # the same ranking, by the named score source: no |param| copy
            dropped = select_inputs(inputs, given_scores(inputs), rule, EACH, rank="magnitude")
        else:
            dropped = select_inputs(inputs, CriterionScores(drop, leaves, False), rule, EACH)
        kept = _tree.flatten(dropped, "masks")
        # Grow: the k entries inactive before the update of highest grow score.
        rule = _Exchange(fraction, grow=True)
        inactive = _tree.unflatten(flat, [~m for m in prior])
        grow_inputs = gather_inputs(detached, rule, None, inactive, pick)
        not_grown = _tree.flatten(
            select_inputs(grow_inputs, CriterionScores(grow, leaves, True), rule, EACH), "masks"
        )
        eager = _core.readable(step)
        masks, regrown = [], []
        for m, keep, stay, chosen in zip(prior, kept.leaves, not_grown.leaves, inputs.chosen, strict=True):
            if not chosen:
                masks.append(m.clone())
                regrown.append(torch.zeros_like(m))
                continue
            grown = ~m & ~stay
            new = keep | grown
            masks.append(new if eager else torch.where(is_update, new, m))
            regrown.append(grown if eager else grown & is_update)
        return _core.finish(flat, masks, state, regrown=_tree.unflatten(flat, regrown))

    return Pruner(init, update)


def _selected_fractions(
    flat: _tree.Flat, selected: list[int], sparsity: Any, spread: Callable[..., Any]
) -> dict:
    """Per-leaf fractions of the selected leaves, ``spread`` over those leaves only."""
    sub = {str(j): flat.leaves[i] for j, i in enumerate(selected)}
    fractions = spread(sub, sparsity) if sub else {}
    return {i: fractions[str(j)] for j, i in enumerate(selected)}


def sparse_evolutionary(
    sparsity: float,
    *,
    distribution: str = "erk",
    drop_fraction: float | Schedule,
    every: int,
    end: int,
    where: _tree.Where = None,
    seed: Any = 0,
) -> Pruner:
    """Sparse Evolutionary Training (SET, Mocanu et al., 2018): drop by magnitude, regrow at random.

    :func:`dynamic_sparse` with ``drop=magnitude`` and ``grow=uniform_random``: each leaf
    drops its ``k`` active entries of lowest magnitude and regrows ``k`` at random among those
    inactive before the update. Randomness is a stateless hash of the seed, the step and the
    leaf number.

    Args:
        sparsity: the overall fraction of selected entries to prune, in [0, 1].
        distribution: how ``sparsity`` is spread over leaves: ``"erk"`` or ``"uniform"``.
        drop_fraction: a fraction in [0, 1] or a schedule ``step -> fraction`` (such as
            :func:`fprune.schedules.cosine_decay` with bound parameters).
        every: update the masks every ``every`` steps (an int >= 1).
        end: no updates from this step on (exclusive; an int >= 1).
        where: picks the leaves to prune; by default those with two dimensions or more.
        seed: an int or a 0-dim integer tensor (a batched one under ``vmap``).

    Returns:
        A :class:`Pruner`; its ``update`` ignores ``grads``.

    Example:
        >>> import torch, fprune
        >>> params = {"w": torch.randn(8, 8), "b": torch.zeros(8)}
        >>> pruner = fprune.sparse_evolutionary(0.75, distribution="uniform", drop_fraction=0.5,
        ...                                     every=1, end=10)
        >>> state = pruner.init(params)
        >>> masks, state = pruner.update(params, state)
        >>> int(masks["w"].sum()), int(state.regrown["w"].sum()), bool(masks["b"].all())
        (16, 8, True)
    """
    return dynamic_sparse(
        sparsity,
        drop=magnitude,
        grow=uniform_random,
        drop_fraction=drop_fraction,
        every=every,
        end=end,
        distribution=distribution,
        where=where,
        seed=seed,
    )


def rigl(
    sparsity: float,
    *,
    distribution: str = "erk",
    drop_fraction: float | Schedule,
    every: int,
    end: int,
    where: _tree.Where = None,
    seed: Any = 0,
) -> Pruner:
    """RigL (Evci et al., 2020): drop by magnitude, regrow by dense-gradient magnitude.

    :func:`dynamic_sparse` with ``drop=magnitude`` and ``grow=gradient_magnitude``: the ``k``
    entries regrown in each leaf are those of largest ``|grads|`` among the entries inactive
    before the update (the ones just dropped excluded); ``update`` requires ``grads``, the
    *dense* gradient (computed through ``fprune.masked_call(..., straight_through=True)``, or
    of dense weights). The seed only draws the initial masks.

    Args:
        sparsity: the overall fraction of selected entries to prune, in [0, 1].
        distribution: ``"erk"`` or ``"uniform"``.
        drop_fraction: a fraction in [0, 1] or a schedule ``step -> fraction``.
        every: update the masks every ``every`` steps (an int >= 1).
        end: no updates from this step on (exclusive; an int >= 1).
        where: picks the leaves to prune; by default those with two dimensions or more.
        seed: an int or a 0-dim integer tensor.

    Returns:
        A :class:`Pruner`; its ``update`` needs ``grads=`` shaped like ``params``, a tensor
        for every leaf: a ``None`` gradient raises ``ValueError`` (pass zeros for a layer that
        took no part in the loss).

    Example:
        >>> import torch, fprune
        >>> params = {"w": torch.ones(2, 4)}
        >>> grads = {"w": torch.arange(8.0).reshape(2, 4)}
        >>> pruner = fprune.rigl(0.5, distribution="uniform", drop_fraction=0.5, every=1, end=10)
        >>> state = pruner.init(params)
        >>> before = state.masks["w"]
        >>> masks, state = pruner.update(params, state, grads=grads)
        >>> int(masks["w"].sum())                         # the sparsity is constant
        4
        >>> bool((state.regrown["w"] & before).any())     # regrown among the inactive ones
        False
    """
    return dynamic_sparse(
        sparsity,
        drop=magnitude,
        grow=gradient_magnitude,
        drop_fraction=drop_fraction,
        every=every,
        end=end,
        distribution=distribution,
        where=where,
        seed=seed,
    )
