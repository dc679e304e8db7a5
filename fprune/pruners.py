"""Pruning during training: pruners as pure ``(init, update)`` pairs over the selection layer.

A pruner is a :class:`Pruner` named tuple of two pure functions, in the manner of optax::

    state = pruner.init(params)                                  # state.masks readable at once
    masks, state = pruner.update(params, state, grads=grads)     # once per training step

Each pruner's state is its own named tuple of tensors (:class:`GradualState`,
:class:`DynamicSparseState`, :class:`MovementState`), as each optax transform has its own.
All share a core (:class:`PrunerState`): ``masks`` (bool, shaped like ``params``) and ``step``
(a 0-dim int64 tensor: the number of updates so far), the first two fields; the shared helpers
here read and replace only those, so a pruner with more state adds fields to its own tuple and
edits nothing else. Being tensors only, a state saves with ``torch.save`` and loads with
``torch.load(weights_only=True)`` (this module registers the state classes as safe globals),
stacks and ``vmap``-s over seeds, and threads through a ``torch.compile(fullgraph=True)``
step: ``update`` is a tensor program whose masks and counts may change every step without
recompiling. Whether a step updates the masks is a tensor ``where``, not a Python ``if``;
only where the step is a plain tensor (eager code, or a ``vmap`` that leaves ``state.step``
unbatched) does ``update`` read it on the host, to skip the work of a step that changes
nothing.

Each ``update`` advances ``state.step`` by one; the first update sees step 0. "Every
``every`` steps" means at steps where ``step % every == 0``; ``end`` is exclusive. Only the
leaves ``where(name, tensor)`` selects are pruned; by default (``where=None``) those with two
dimensions or more, so biases and normalization weights stay dense.

Every mask change is a selection of :mod:`fprune.select` (so the selection rule is its: count-
exact, ties to the first position, row-major, leaves in optree's flatten order; NaN scores rank
above ``+inf``; and DTensor params, FSDP2's, go to its sharded backend), with a *count rule*
as its amount, ``rule(remaining, size) -> count``, which the selection applies to what the prior
masks left:

* :func:`gradual_magnitude`: at update steps, the lowest magnitudes among the kept entries,
  until ``round(schedule(step) * size)`` are pruned (one ``Global`` ranking, or per leaf).
* :func:`dynamic_sparse` (SET, RigL, and any other drop/grow pair): per leaf,
  ``k = min(round(drop_fraction(step) * active), inactive)``; drop the ``k`` active entries of
  lowest ``drop`` score, grow the ``k`` entries inactive before the update of highest ``grow``
  score (the lowest of the negated scores: ties to the first position, NaN last).
* :func:`movement`: scores accumulate ``-grad * param`` at every step; at update steps the
  ``round(schedule(step) * size)`` lowest scores are pruned, among all entries (pruned ones
  come back when their score rises).

A drop or grow criterion is one function ``criterion(leaf) -> scores``: it gets a :class:`Leaf`
(``param``, ``grad``, ``mask``, ``seed``, ``index``, ``name``) and returns a tensor shaped like
the parameter, higher = more important. :func:`magnitude`, :func:`gradient_magnitude` and
:func:`uniform_random` are the built-in ones.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, cast

import torch

from fprune import _amount, _random, _tree, distributions
from fprune.select import (
    EACH,
    Global,
    Scope,
    _engine,
    gather_inputs,
    given_scores,
    select_inputs,
)

__all__ = [
    "Pruner",
    "PrunerState",
    "GradualState",
    "DynamicSparseState",
    "MovementState",
    "Leaf",
    "gradual_magnitude",
    "dynamic_sparse",
    "sparse_evolutionary",
    "rigl",
    "movement",
    "magnitude",
    "gradient_magnitude",
    "uniform_random",
    "zero_regrown",
]

Schedule = Callable[[torch.Tensor], float | torch.Tensor]
Criterion = Callable[["Leaf"], torch.Tensor]

_M32 = (1 << 32) - 1


class PrunerState(Protocol):
    """The core every pruner's state shares: its first two fields.

    A pruner's state is a ``NamedTuple`` of tensors whose first fields are ``masks`` and
    ``step``, followed by whatever else that pruner keeps (:class:`GradualState`,
    :class:`DynamicSparseState`, :class:`MovementState`). A type for annotations.

    Attributes:
        masks: bool masks shaped like ``params`` (``True`` = kept): the current masks.
        step: 0-dim int64 tensor, the number of updates done.
    """

    @property
    def masks(self) -> Any: ...

    @property
    def step(self) -> torch.Tensor: ...


class GradualState(NamedTuple):
    """The state of :func:`gradual_magnitude`: the core only.

    Attributes:
        masks: bool masks shaped like ``params``.
        step: 0-dim int64 tensor, the number of updates done.
    """

    masks: Any
    step: torch.Tensor


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


class Pruner(NamedTuple):
    """A pruner: ``init(params) -> state`` and ``update(params, state, *, grads=None) -> (masks, state)``."""

    init: Callable[..., Any]
    update: Callable[..., Any]


# torch.load(weights_only=True) refuses classes it does not know; the states are tensors only.
torch.serialization.add_safe_globals([GradualState, DynamicSparseState, MovementState])

# ---------------------------------------------------------------------------------- checks


def _check_every(every: Any) -> int:
    if isinstance(every, bool) or not isinstance(every, numbers.Integral):
        raise TypeError(f"Expected every to be an int >= 1, got {every!r}.")
    if every < 1:
        raise ValueError(f"Expected every to be an int >= 1 (update every `every` steps), got {every!r}.")
    return int(every)


def _check_end(end: Any) -> int:
    if isinstance(end, bool) or not isinstance(end, numbers.Integral):
        raise TypeError(f"Expected end to be an int >= 1 (the step where mask updates stop), got {end!r}.")
    if end < 1:
        raise ValueError(f"Expected end to be an int >= 1 (the step where mask updates stop), got {end!r}.")
    return int(end)


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected {name} to be a float in [0, 1], got {value!r}.")
    if not 0.0 <= cast(float, value) <= 1.0:
        raise ValueError(f"Expected {name} to be a fraction in [0, 1], got {value!r}.")
    return float(value)


def _check_schedule(name: str, value: Any) -> float | Schedule:
    if callable(value):
        return value  # what it returns is checked at each update (_schedule_value)
    return _check_fraction(name, value)


def _check_seed(seed: Any) -> Any:
    if isinstance(seed, torch.Tensor):
        if seed.dtype.is_floating_point or seed.dtype == torch.bool or seed.is_complex() or seed.dim() != 0:
            raise TypeError(
                f"Expected seed to be an int or a 0-dim integer tensor, got a tensor of dtype "
                f"{seed.dtype} and shape {tuple(seed.shape)}."
            )
        return seed
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"Expected seed to be an int or a 0-dim integer tensor, got {seed!r}.")
    return int(seed)


def _check_where(where: Any) -> None:
    if where is not None and not callable(where):
        raise TypeError(f"Expected where to be None or a callable (name, tensor) -> bool, got {where!r}.")


def _weights(name: str, p: torch.Tensor) -> bool:
    """The default ``where`` of the pruners: leaves of two dimensions or more."""
    return p.dim() > 1


def _chosen(flat: _tree.Flat, where: _tree.Where) -> list[bool]:
    return _tree.selected(flat, _weights if where is None else where)


def _check_state(state: Any, flat: _tree.Flat, kind: type[Any]) -> list[torch.Tensor]:
    """Check that ``state`` is a ``kind`` (the pruner's own state class) whose masks match
    ``params``; return the masks' leaves (the prior masks of the update)."""
    if not isinstance(state, kind):
        raise TypeError(
            f"Expected state to be a {kind.__name__} (from this pruner's init), got {type(state).__name__}."
        )
    masks = _tree.flatten(state.masks, "state.masks")
    if masks.spec != flat.spec:
        raise ValueError(
            f"Expected state.masks to have the structure of params ({flat.spec}), got {masks.spec}."
        )
    for path, m, p in zip(flat.paths, masks.leaves, flat.leaves, strict=True):
        if m.shape != p.shape:
            raise ValueError(
                f"Expected {_tree.describe('state.masks', path)} to have the shape of "
                f"{_tree.describe('params', path)}, {tuple(p.shape)}, got {tuple(m.shape)}."
            )
    return masks.leaves


# ----------------------------------------------------------------------------- steps, state


def _readable(step: torch.Tensor) -> bool:
    """True where ``step`` can be read on the host: a plain tensor outside torch.compile,
    tracing and dispatch modes (this includes a ``vmap`` whose state's step is not batched, as
    all members step together)."""
    # torch.jit.is_tracing is public and documented, but torch.jit's __all__ leaves it out.
    return not (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()  # type: ignore[attr-defined]
        or _engine.is_traced([step])
    )


def _skip(step: torch.Tensor, is_update: torch.Tensor) -> bool:
    """True where the step can be read on the host and is not an update step: the work of a
    step that changes nothing is skipped (for every member at once under such a ``vmap``)."""
    return _readable(step) and not bool(is_update)


def _schedule_value(schedule: float | Schedule, step: torch.Tensor, name: str) -> Any:
    """The fraction ``schedule`` gives at ``step``, checked as an ``amount`` is (``name`` in errors).

    A Python number must be a fraction in [0, 1] (no host read). A tensor must be a 0-dim
    floating-point tensor; where its value can be read (eager code) NaN, below 0 or above 1
    raise; under a transform it cannot be read, so it is clamped (NaN drops nothing), as
    a tensor amount is (:func:`fprune._amount.fraction`).
    """
    if not callable(schedule):
        return schedule
    value = schedule(step)
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.dim() != 0:
            raise TypeError(
                f"Expected {name}(step) to return a float or a 0-dim floating-point tensor (a "
                f"fraction in [0, 1]), got a tensor of dtype {value.dtype} and shape {tuple(value.shape)}."
            )
        if _amount.readable(value):
            # One host read per update step: NaN fails both comparisons.
            if not bool((value >= 0) & (value <= 1)):
                raise ValueError(
                    f"{name}(step={_step_text(step)}) returned {float(value)} (a tensor); expected a "
                    f"fraction in [0, 1] (a percentage or a count is not one)."
                )
            return value
        return torch.where(torch.isnan(value), torch.zeros_like(value), value.clamp(0.0, 1.0))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"Expected {name}(step) to return a float or a 0-dim floating-point tensor (a fraction "
            f"in [0, 1]), got {value!r}."
        )
    if not 0.0 <= cast(float, value) <= 1.0:  # False for NaN too
        raise ValueError(
            f"{name}(step={_step_text(step)}) returned {value!r}; expected a fraction in [0, 1] "
            f"(a percentage or a count is not one)."
        )
    return value


def _step_text(step: torch.Tensor) -> str:
    """The step for an error message: its value where it can be read, else ``state.step``."""
    return str(int(step)) if _amount.readable(step) else "state.step"


def _core(flat: _tree.Flat, masks: list[torch.Tensor], step: torch.Tensor) -> dict[str, Any]:
    """The shared fields of a state, ``masks`` (unflattened like ``params``) and ``step``: a
    pruner builds its state as ``ItsState(**_core(...), more=...)``."""
    return {"masks": _tree.unflatten(flat, masks), "step": step}


def _first_step(flat: _tree.Flat) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=_device(flat))


def _is_update(step: torch.Tensor, every: int, end: int | None = None) -> torch.Tensor:
    """Whether ``step`` updates the masks, as a tensor (traceable)."""
    is_update = step % every == 0
    return is_update if end is None else is_update & (step < end)


def _merge(
    new: list[torch.Tensor],
    prior: list[torch.Tensor],
    chosen: list[bool],
    is_update: torch.Tensor,
    eager: bool,
) -> list[torch.Tensor]:
    """The masks after the step: ``new`` where a leaf is selected and the step updates, else
    ``prior`` (new tensors either way). Eager code got here only at an update step."""
    return [
        (n if eager else torch.where(is_update, n, p)) if c else p.clone()
        for n, p, c in zip(new, prior, chosen, strict=True)
    ]


def _finish(flat: _tree.Flat, masks: list[torch.Tensor], state: Any, **more: Any) -> tuple[Any, Any]:
    """``(masks, state)`` of an update: ``state`` with these masks, ``step + 1`` and ``more``
    (the pruner's own fields)."""
    out = state._replace(**_core(flat, masks, state.step + 1), **more)
    return out.masks, out


def _seed_tensor(seed: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(seed, dtype=torch.int64, device=device)


def _step_seed(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """A seed for this step: the state's seed hashed with the step (stateless, traceable)."""
    return _random.mix32((seed & _M32) ^ _random.mix32((step * 0x2545F491 + 0x6A09E667) & _M32))


def _device(flat: _tree.Flat) -> torch.device:
    return flat.leaves[0].device if flat.leaves else torch.device("cpu")


def _advance(flat: _tree.Flat, prior: list[torch.Tensor], state: Any, **more: Any) -> tuple[Any, Any]:
    """A step that changes no mask: the same masks (new tensors), step + 1, and ``more``."""
    return _finish(flat, [m.clone() for m in prior], state, **more)


def _detached(flat: _tree.Flat) -> Any:
    return _tree.unflatten(flat, [p.detach() for p in flat.leaves])


# ----------------------------------------------------------------------------- count rules
# The amounts of the pruners' selections: rule(remaining, size) -> count, applied by the
# selection layer to what the prior masks left (ints in eager code, tensors under a transform;
# the same rule over the whole mesh for DTensor params). repr() is what sharded ranks compare.


def _minimum(a: Any, b: Any) -> Any:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))
    return min(a, b)


def _at_least_zero(a: Any) -> Any:
    return a.clamp(min=0) if isinstance(a, torch.Tensor) else max(a, 0)


def _shown(fraction: Any) -> str:
    return repr(float(fraction)) if isinstance(fraction, torch.Tensor) else repr(fraction)


class _Target:
    """Prune until ``round(fraction * size)`` of ``size`` are pruned (what prior masks pruned
    counts; pruned entries never come back, so never fewer than they pruned)."""

    def __init__(self, fraction: Any):
        self.fraction = fraction

    def __call__(self, remaining: Any, size: Any) -> Any:
        return _at_least_zero(_amount.round_count(self.fraction, size) - (size - remaining))

    def __repr__(self) -> str:
        return f"target({_shown(self.fraction)})"


class _Exchange:
    """SET/RigL's count: ``k = min(round(fraction * active), inactive)``, to drop among the
    active entries (``remaining`` is the active count) or to grow among the inactive ones
    (``remaining`` is the inactive count)."""

    def __init__(self, fraction: Any, grow: bool):
        self.fraction = fraction
        self.grow = grow

    def __call__(self, remaining: Any, size: Any) -> Any:
        active = size - remaining if self.grow else remaining
        return _minimum(_amount.round_count(self.fraction, active), size - active)

    def __repr__(self) -> str:
        return f"exchange({_shown(self.fraction)}, {'grow' if self.grow else 'drop'})"


# ------------------------------------------------------------------------ gradual magnitude


def _pruner_scope(scope: Any) -> Any:
    """The scope object of ``scope=``, checked: one with a fraction (``NM`` has none)."""
    if not isinstance(scope, Scope):
        raise TypeError(
            f"Expected scope to be a scope of fprune.select (Global(), EACH, Channels(dim), "
            f"Rows(dim), Blocks(shape)), got {scope!r}."
        )
    if not scope.fractional:
        raise ValueError(
            f"gradual_magnitude prunes a fraction that grows with the step; {scope!r} has no "
            "fraction. Expected scope to be Global(), EACH, Channels(dim), Rows(dim) or Blocks(shape)."
        )
    return scope


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
    every = _check_every(every)
    scope = _pruner_scope(scope)
    _check_where(where)
    pick = _weights if where is None else where

    def init(params: Any) -> GradualState:
        flat = _tree.flatten(params, "params")
        masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
        return GradualState(**_core(flat, masks, _first_step(flat)))

    def update(params: Any, state: GradualState, *, grads: Any = None) -> tuple[Any, GradualState]:
        flat = _tree.flatten(params, "params")
        prior = _check_state(state, flat, GradualState)
        is_update = _is_update(state.step, every)
        if _skip(state.step, is_update):
            return _advance(flat, prior, state)
        rule = _Target(_schedule_value(schedule, state.step, "schedule"))
        inputs = gather_inputs(_detached(flat), rule, None, state.masks, pick)
        new = _tree.flatten(
            select_inputs(inputs, given_scores(inputs), rule, scope, rank="magnitude"), "masks"
        )
        return _finish(
            flat, _merge(new.leaves, prior, inputs.chosen, is_update, _readable(state.step)), state
        )

    return Pruner(init, update)


# ------------------------------------------------------------------- dynamic sparse training


class Leaf:
    """What a drop or grow criterion of :func:`dynamic_sparse` sees of one leaf at an update.

    Attributes:
        param: the parameter (detached).
        grad: its gradient, from ``update(..., grads=)``; reading it when ``update`` got no
            ``grads`` raises ``TypeError``.
        mask: its mask before the update (bool).
        seed: a 0-dim int64 tensor, the pruner's seed hashed with the step (batched under a
            ``vmap`` over seeds): the seed of a random criterion.
        index: the leaf's number in the params' flatten order (a random criterion's stream).
        name: the leaf's dotted name (``"0.weight"``).

    ``update`` makes them; to call a criterion by hand, ``Leaf(param, mask, seed, index, name)``
    (its ``grad`` then raises).
    """

    __slots__ = ("_grads", "index", "mask", "name", "param", "seed")

    def __init__(
        self,
        param: torch.Tensor,
        mask: torch.Tensor | None = None,
        seed: torch.Tensor | None = None,
        index: int = 0,
        name: str = "",
        grads: _Grads | None = None,
    ):
        self.param = param
        self.mask = mask
        self.seed = seed
        self.index = index
        self.name = name
        self._grads = grads

    @property
    def grad(self) -> torch.Tensor:
        if self._grads is None:
            raise TypeError(f"This Leaf ({self.name!r}) was made without gradients; it has no grad.")
        return self._grads.leaf(self.index)

    def __repr__(self) -> str:
        return f"Leaf({self.name!r}, shape={tuple(self.param.shape)})"


# optree reads a None leaf as an empty subtree: a None gradient is a missing entry.
_NONE_GRAD = (
    " A None gradient (the .grad of a parameter that took no part in the loss) counts as "
    "missing: pass torch.zeros_like(p) for it"
)


class _Grads:
    """``update``'s ``grads=``, checked against the params when a criterion first reads one."""

    def __init__(self, flat: _tree.Flat, grads: Any):
        self.flat = flat
        self.given = grads
        self.leaves: list | None = None

    def leaf(self, i: int) -> torch.Tensor:
        if self.leaves is None:
            if self.given is None:
                raise TypeError(
                    "This pruner's criterion reads leaf.grad: its update needs grads=, the dense "
                    "gradient shaped like params."
                )
            hint = (
                _NONE_GRAD
                + " (RigL then regrows that leaf's first inactive entries, ties to the first position)."
            )
            self.leaves = _tree.check_scores(self.flat, self.given, "grads", hint)
        return self.leaves[i].detach()


def _criterion_name(criterion: Any) -> str:
    """A criterion's name in messages (the same on every rank: no memory address)."""
    return getattr(criterion, "__qualname__", None) or repr(criterion)


class _CriterionScores:
    """A criterion as a score function of :func:`fprune.select.select_inputs`: leaf ``i``'s
    scores (negated for growing: the highest are then the lowest, ties still to the first
    position and NaN still last); ``at`` where the criterion has it (the sharded backend then
    asks for a rank's own entries only)."""

    def __init__(self, criterion: Criterion, leaves: list[Leaf], negate: bool):
        self.criterion = criterion
        self.leaves = leaves
        self.negate = negate
        at = getattr(criterion, "at", None)
        if callable(at):
            self.at = lambda i, positions: self._signed(at(self.leaves[i], positions))

    def _signed(self, scores: torch.Tensor) -> torch.Tensor:
        return -scores if self.negate else scores

    def __call__(self, i: int) -> torch.Tensor:
        leaf = self.leaves[i]
        scores = self.criterion(leaf)
        if not isinstance(scores, torch.Tensor) or scores.dtype == torch.bool or scores.is_complex():
            got = f"a tensor of dtype {scores.dtype}" if isinstance(scores, torch.Tensor) else repr(scores)
            raise TypeError(
                f"Expected the criterion {_criterion_name(self.criterion)} to return a real tensor "
                f"shaped like {leaf.name!r} for it, got {got}."
            )
        if scores.shape != leaf.param.shape:
            raise ValueError(
                f"Expected the criterion {_criterion_name(self.criterion)} to return scores shaped "
                f"like {leaf.name!r}, {tuple(leaf.param.shape)}, got {tuple(scores.shape)}."
            )
        return self._signed(scores)

    def fingerprint(self) -> str:
        seed = self.leaves[0].seed if self.leaves else None
        return f"{_criterion_name(self.criterion)}|seed={'' if seed is None else int(seed)}"


def magnitude(leaf: Leaf) -> torch.Tensor:
    """The criterion ``|param|``: SET's and RigL's drop criterion (the default ``drop``).

    Example:
        >>> import torch, fprune
        >>> w = torch.tensor([1.0, -3.0])
        >>> fprune.pruners.magnitude(fprune.pruners.Leaf(w))
        tensor([1., 3.])
    """
    return leaf.param.abs()


def gradient_magnitude(leaf: Leaf) -> torch.Tensor:
    """The criterion ``|grad|``: RigL's grow criterion (``update`` then needs ``grads=``).

    Example:
        >>> import torch, fprune
        >>> pruner = fprune.dynamic_sparse(0.5, grow=fprune.pruners.gradient_magnitude,
        ...     drop_fraction=0.5, every=1, end=9, distribution="uniform")
        >>> params = {"w": torch.ones(1, 4)}
        >>> state = pruner.init(params)
        >>> state.masks["w"]
        tensor([[False, False,  True,  True]])
        >>> _, state = pruner.update(params, state, grads={"w": torch.tensor([[4.0, 3, 2, 1]])})
        >>> state.regrown["w"]            # of the inactive ones, the largest |grad| comes back
        tensor([[ True, False, False, False]])
    """
    return leaf.grad.abs()


def _seed_of(leaf: Leaf) -> torch.Tensor:
    if leaf.seed is None:
        raise TypeError(f"uniform_random needs a seed: this Leaf ({leaf.name!r}) was made without one.")
    return leaf.seed


class _UniformRandom:
    """The criterion of uniform random scores in [0, 1): the stateless hash of the step's seed,
    the leaf's number and each entry's position (SET's grow criterion). ``at`` draws given
    positions only: a rank of a sharded model draws its own entries."""

    def __call__(self, leaf: Leaf) -> torch.Tensor:
        return _random.uniform(leaf.param.shape, _seed_of(leaf), leaf.index, leaf.param.device)

    def at(self, leaf: Leaf, positions: torch.Tensor) -> torch.Tensor:
        return _random.uniform_at(positions, _seed_of(leaf), leaf.index)

    def __repr__(self) -> str:
        return "uniform_random"


#: The criterion of uniform random scores (SET's grow criterion): ``uniform_random(leaf)`` is
#: the stateless hash of ``leaf.seed``, ``leaf.index`` and each entry's position, in [0, 1).
uniform_random = _UniformRandom()


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
    sparsity = _check_fraction("sparsity", sparsity)
    for name, criterion in (("drop", drop), ("grow", grow)):
        if not callable(criterion):
            raise TypeError(
                f"Expected {name} to be a criterion, a callable leaf -> scores, got {criterion!r}."
            )
    if distribution not in ("erk", "uniform"):
        raise ValueError(f'Expected distribution to be "erk" or "uniform", got {distribution!r}.')
    drop_fraction = _check_schedule("drop_fraction", drop_fraction)
    every = _check_every(every)
    end = _check_end(end)
    _check_where(where)
    seed = _check_seed(seed)
    spread = distributions.erk if distribution == "erk" else distributions.uniform
    pick = _weights if where is None else where

    def init(params: Any) -> DynamicSparseState:
        flat = _tree.flatten(params, "params")
        seed_t = _seed_tensor(seed, _device(flat))
        selected = [i for i, c in enumerate(_chosen(flat, pick)) if c]
        fractions = _selected_fractions(flat, selected, sparsity, spread)
        amounts = {_tree.dotted(flat.paths[i]): fractions[i] for i in selected}
        inputs = gather_inputs(_detached(flat), amounts, None, None, pick)
        leaves = inputs.params.leaves
        draws = _random.Draws(seed_t, lambda i: leaves[i].shape, lambda i: leaves[i].device)
        masks = _tree.flatten(select_inputs(inputs, draws, amounts, EACH), "masks").leaves
        nothing = _tree.unflatten(flat, [torch.zeros_like(m) for m in masks])
        return DynamicSparseState(**_core(flat, masks, _first_step(flat)), regrown=nothing, seed=seed_t)

    def update(
        params: Any, state: DynamicSparseState, *, grads: Any = None
    ) -> tuple[Any, DynamicSparseState]:
        flat = _tree.flatten(params, "params")
        prior = _check_state(state, flat, DynamicSparseState)
        step = state.step
        is_update = _is_update(step, every, end)
        if _skip(step, is_update):
            return _advance(
                flat, prior, state, regrown=_tree.unflatten(flat, [torch.zeros_like(m) for m in prior])
            )
        fraction = _schedule_value(drop_fraction, step, "drop_fraction")
        step_seed = _step_seed(state.seed, step)
        plain = [p.detach() for p in flat.leaves]
        detached = _tree.unflatten(flat, plain)
        given = _Grads(flat, grads)
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
            dropped = select_inputs(inputs, _CriterionScores(drop, leaves, False), rule, EACH)
        kept = _tree.flatten(dropped, "masks")
        # Grow: the k entries inactive before the update of highest grow score.
        rule = _Exchange(fraction, grow=True)
        inactive = _tree.unflatten(flat, [~m for m in prior])
        grow_inputs = gather_inputs(detached, rule, None, inactive, pick)
        not_grown = _tree.flatten(
            select_inputs(grow_inputs, _CriterionScores(grow, leaves, True), rule, EACH), "masks"
        )
        eager = _readable(step)
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
        return _finish(flat, masks, state, regrown=_tree.unflatten(flat, regrown))

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


# ------------------------------------------------------------------------ movement pruning


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
    every = _check_every(every)
    scope = _pruner_scope(scope)
    if scope.reduces:
        raise ValueError(
            f"Expected scope to be EACH, Global() or Rows(dim) (movement scores are signed, and "
            f"{scope!r} ranks norms of groups), got {scope!r}."
        )
    _check_where(where)
    pick = _weights if where is None else where

    def init(params: Any) -> MovementState:
        flat = _tree.flatten(params, "params")
        masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
        # float32 at least: a sum over thousands of steps in bfloat16 loses the small terms.
        scores = [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for p in flat.leaves]
        return MovementState(**_core(flat, masks, _first_step(flat)), scores=_tree.unflatten(flat, scores))

    def update(params: Any, state: MovementState, *, grads: Any = None) -> tuple[Any, MovementState]:
        flat = _tree.flatten(params, "params")
        prior = _check_state(state, flat, MovementState)
        if grads is None:
            raise TypeError("movement's update needs grads=, the dense gradient shaped like params.")
        given = _tree.check_scores(flat, grads, "grads", _NONE_GRAD + " (its scores then stay).")
        old = _tree.check_scores(flat, state.scores, "state.scores")
        scores = _tree.unflatten(
            flat,
            [
                s - g.detach() * p.detach() if c else s
                for s, g, p, c in zip(old, given, flat.leaves, _chosen(flat, pick), strict=True)
            ],
        )
        is_update = _is_update(state.step, every)
        if _skip(state.step, is_update):
            return _advance(flat, prior, state, scores=scores)
        rule = _Target(_schedule_value(schedule, state.step, "schedule"))
        inputs = gather_inputs(_detached(flat), rule, scores, None, pick)
        new = _tree.flatten(select_inputs(inputs, given_scores(inputs), rule, scope), "masks")
        masks = _merge(new.leaves, prior, inputs.chosen, is_update, _readable(state.step))
        return _finish(flat, masks, state, scores=scores)

    return Pruner(init, update)


# ---------------------------------------------------------------------------- zero_regrown


def zero_regrown(tree: Any, state: PrunerState) -> Any:
    """``tree`` with the entries the last update regrew set to zero.

    ``tree`` is any pytree shaped like ``params``: the weights (regrown weights start at zero,
    as in RigL), or an optimizer's per-parameter state such as Adam's moments. A state with
    no ``regrown`` field (its pruner regrows nothing) gives ``tree``'s tensors back, so one
    training loop serves every pruner.

    Args:
        tree: a pytree of tensors with the structure and shapes of ``params``.
        state: a pruner's state (``state.regrown``, where it has one, says which entries).

    Returns:
        A new pytree like ``tree``.

    Example:
        >>> import torch, fprune
        >>> state = fprune.DynamicSparseState({"w": torch.ones(3, dtype=torch.bool)}, torch.tensor(1),
        ...                                   {"w": torch.tensor([False, True, False])}, torch.tensor(0))
        >>> fprune.zero_regrown({"w": torch.tensor([1.0, 2.0, 3.0])}, state)
        {'w': tensor([1., 0., 3.])}
    """
    fields = getattr(type(state), "_fields", ()) if isinstance(state, tuple) else ()
    if "masks" not in fields or "step" not in fields:
        raise TypeError(
            f"Expected state to be a pruner's state (from pruner.init), got {type(state).__name__}."
        )
    flat = _tree.flatten(tree, "tree")
    masks = _tree.flatten(state.masks, "state.masks")
    if masks.spec != flat.spec:
        raise ValueError(
            f"Expected tree to have the structure of state.masks ({masks.spec}), got {flat.spec}."
        )
    for path, x, m in zip(flat.paths, flat.leaves, masks.leaves, strict=True):
        if x.shape != m.shape:
            raise ValueError(
                f"Expected {_tree.describe('tree', path)} to have the shape {tuple(m.shape)}, got "
                f"{tuple(x.shape)}."
            )
    if "regrown" not in fields:
        return tree
    regrown = _tree.flatten(cast(Any, state).regrown, "state.regrown").leaves
    return _tree.unflatten(flat, [x.masked_fill(r, 0) for x, r in zip(flat.leaves, regrown, strict=True)])
