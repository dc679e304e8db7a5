"""Private: :func:`movement` pruning (Sanh et al., 2020) and its state, :class:`MovementState`."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fprune import _tree
from fprune.pruners import _core
from fprune.pruners._core import Pruner, Schedule
from fprune.select import EACH, gather_inputs, given_scores, select_inputs


class MovementState(NamedTuple):
    """The state of :func:`movement`.

    Attributes:
        masks: bool masks shaped like ``params``.
        step: 0-dim int64 tensor, the number of updates done.
        scores: tensors shaped like ``params`` (float32 or wider): the accumulated
            ``-grad * param`` of the selected leaves (zero for the others).
    """

    masks: Any
    step: torch.Tensor
    scores: Any


# torch.load(weights_only=True) refuses classes it does not know; this state is tensors only.
torch.serialization.add_safe_globals([MovementState])


def movement(schedule: Schedule, *, every: int, scope: Any = EACH, where: _tree.Where = None) -> Pruner:
    """Movement pruning (Sanh et al., 2020): prune the weights that move toward zero.

    Every ``update`` adds ``-grad * param`` to the score of each selected entry: the paper's
    hard movement score, ``S = -sum_t grad_t * param_t`` (its learning rate of the scores is a
    scale, so it changes no ranking). At update steps (``step % every == 0``) the
    ``round(schedule(step) * size)`` entries of lowest score within ``scope`` are pruned,
    ranked among all selected entries, the pruned ones too: as in the paper, the mask is
    recomputed from the scores, so an entry comes back when its score rises again. The scores
    include this step's gradient. The masks start all ``True``. A NaN gradient or weight
    makes that entry's score NaN from then on: it ranks above ``+inf``, so it is kept (the
    selection warns).

    Args:
        schedule: ``step -> fraction`` (the paper's cubic schedule is
            :func:`fprune.schedules.polynomial`), checked as in :func:`gradual_magnitude`.
        every: update the masks every ``every`` steps (an int >= 1); the scores accumulate
            at every step.
        scope: ``EACH`` (each leaf to the fraction: the paper's top-k per weight matrix, the
            default), ``Global()`` (one ranking over all selected leaves) or ``Rows(dim)``
            (within each row); not a scope that ranks norms of groups (``Channels``,
            ``Blocks``), which would lose the scores' sign.
        where: picks the leaves to prune; by default those with two dimensions or more.

    Returns:
        A :class:`Pruner` whose state is a :class:`MovementState`; its ``update`` needs
        ``grads=``, the dense gradient (``fprune.masked_call(..., straight_through=True)``:
        the paper's straight-through estimator gives the scores that gradient).

    Example:
        >>> import torch, fprune
        >>> pruner = fprune.movement(lambda step: 0.5, every=1)
        >>> params = {"w": torch.tensor([[1.0, 1.0, -1.0, -1.0]])}
        >>> state = pruner.init(params)
        >>> grads = {"w": torch.tensor([[1.0, -1.0, 1.0, -1.0]])}   # entries 1 and 2 grow
        >>> masks, state = pruner.update(params, state, grads=grads)
        >>> masks["w"], state.scores["w"]
        (tensor([[False,  True,  True, False]]), tensor([[-1.,  1.,  1., -1.]]))
    """
    if not callable(schedule):
        raise TypeError(f"Expected schedule to be a callable step -> fraction, got {schedule!r}.")
    every = _core.check_every(every)
    scope = _core.pruner_scope(scope, "movement", "EACH, Global() or Rows(dim)")
    if scope.reduces:
        raise ValueError(
            f"Expected scope to be EACH, Global() or Rows(dim) (movement scores are signed, and "
            f"{scope!r} ranks norms of groups), got {scope!r}."
        )
    _core.check_where(where)
    pick = _core.weights if where is None else where

    def init(params: Any) -> MovementState:
        flat = _tree.flatten(params, "params")
        masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
        # float32 at least: a sum over thousands of steps in bfloat16 loses the small terms.
        scores = [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for p in flat.leaves]
        return MovementState(
            **_core.core_fields(flat, masks, _core.first_step(flat)), scores=_tree.unflatten(flat, scores)
        )

    def update(params: Any, state: MovementState, *, grads: Any = None) -> tuple[Any, MovementState]:
        flat = _tree.flatten(params, "params")
        prior = _core.check_state(state, flat, MovementState)
        if grads is None:
            raise TypeError("movement's update needs grads=, the dense gradient shaped like params.")
        given = _tree.check_scores(flat, grads, "grads", _core.NONE_GRAD + " (its scores then stay).")
        old = _tree.check_scores(flat, state.scores, "state.scores")
        scores = _tree.unflatten(
            flat,
            [
                s - g.detach() * p.detach() if c else s
                for s, g, p, c in zip(old, given, flat.leaves, _core.chosen(flat, pick), strict=True)
            ],
        )
        is_update = _core.is_update(state.step, every)
        if _core.skip(state.step, is_update):
            return _core.advance(flat, prior, state, scores=scores)
        rule = _core.Target(_core.schedule_value(schedule, state.step, "schedule"))
        inputs = gather_inputs(_core.detached(flat), rule, scores, None, pick)
        new = _tree.flatten(select_inputs(inputs, given_scores(inputs), rule, scope), "masks")
        masks = _core.merge(new.leaves, prior, inputs.chosen, is_update, _core.readable(state.step))
        return _core.finish(flat, masks, state, scores=scores)

    return Pruner(init, update)
