"""Private: :func:`gradual_magnitude` (Zhu & Gupta, 2017) and its state, :class:`GradualState`."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fprune import _tree
from fprune.pruners import _core
from fprune.pruners._core import Pruner, Schedule
from fprune.select import Global, gather_inputs, given_scores, select_inputs


class GradualState(NamedTuple):
    """The state of :func:`gradual_magnitude`: the core only.

    Attributes:
        masks: bool masks shaped like ``params``.
        step: 0-dim int64 tensor, the number of updates done.
    """

    masks: Any
    step: torch.Tensor


# torch.load(weights_only=True) refuses classes it does not know; this state is tensors only.
torch.serialization.add_safe_globals([GradualState])


def gradual_magnitude(
    schedule: Schedule, *, every: int, scope: Any = Global(), where: _tree.Where = None
) -> Pruner:
    """Gradual magnitude pruning (Zhu & Gupta, 2017) as an ``(init, update)`` pair.

    At update steps (``step % every == 0``) the pruned fraction of the selected entries
    becomes ``schedule(step)`` (a fraction of the whole, not of what remains), by magnitude,
    within ``scope``: over all selected leaves at once (``Global()``, the default) or in each
    leaf (``EACH``); ``Channels(dim)`` and ``Rows(dim)`` prune whole channels or within each
    row. Pruned weights never come back: if the schedule asks for fewer than are pruned,
    nothing changes. The masks start all ``True``.

    Args:
        schedule: ``step -> fraction`` (e.g. :func:`fprune.schedules.polynomial` with bound
            parameters); it is called with the 0-dim int64 step tensor. A value outside
            [0, 1] or NaN raises ``ValueError`` (a tensor only where it can be read; under a
            transform it is clamped).
        every: update the masks every ``every`` steps (an int >= 1).
        scope: a scope of :mod:`fprune.select`: ``Global()`` (one ranking over all selected
            leaves, optionally ``Global(min_keep=...)``), ``EACH``, ``Channels(dim)`` or
            ``Rows(dim)``.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune; by default those
            with two dimensions or more (biases stay dense).

    Returns:
        A :class:`Pruner` whose state is a :class:`GradualState`.

    Example:
        >>> import functools, torch, fprune
        >>> schedule = functools.partial(fprune.schedules.polynomial, final=0.75, end=4)
        >>> pruner = fprune.gradual_magnitude(schedule, every=2)
        >>> params = {"w": torch.arange(1.0, 9.0).reshape(2, 4), "b": torch.ones(2)}
        >>> state = pruner.init(params)
        >>> for _ in range(5):
        ...     masks, state = pruner.update(params, state)
        >>> masks["w"].int(), masks["b"].all(), int(state.step)
        (tensor([[0, 0, 0, 0],
                [0, 0, 1, 1]], dtype=torch.int32), tensor(True), 5)
    """
    if not callable(schedule):
        raise TypeError(f"Expected schedule to be a callable step -> fraction, got {schedule!r}.")
    every = _core.check_every(every)
    scope = _core.pruner_scope(
        scope, "gradual_magnitude", "Global(), EACH, Channels(dim), Rows(dim) or Blocks(shape)"
    )
    _core.check_where(where)
    pick = _core.weights if where is None else where

    def init(params: Any) -> GradualState:
        flat = _tree.flatten(params, "params")
        masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
        return GradualState(**_core.core_fields(flat, masks, _core.first_step(flat)))

    def update(params: Any, state: GradualState, *, grads: Any = None) -> tuple[Any, GradualState]:
        flat = _tree.flatten(params, "params")
        prior = _core.check_state(state, flat, GradualState)
        is_update = _core.is_update(state.step, every)
        if _core.skip(state.step, is_update):
            return _core.advance(flat, prior, state)
        rule = _core.Target(_core.schedule_value(schedule, state.step, "schedule"))
        inputs = gather_inputs(_core.detached(flat), rule, None, state.masks, pick)
        new = _tree.flatten(
            select_inputs(inputs, given_scores(inputs), rule, scope, rank="magnitude"), "masks"
        )
        return _core.finish(
            flat, _core.merge(new.leaves, prior, inputs.chosen, is_update, _core.readable(state.step)), state
        )

    return Pruner(init, update)
