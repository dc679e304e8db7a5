"""Private: the core every pruner shares, the ``(init, update)`` pair and its state's first fields.

A pruner is a :class:`Pruner`, ``init(params) -> state`` and ``update(params, state, *,
grads=None) -> (masks, state)``. Its state is a ``NamedTuple`` of tensors whose first two
fields are ``masks`` (bool, shaped like ``params``) and ``step`` (a 0-dim int64 tensor, the
number of updates so far), then the pruner's own fields. The helpers here read and replace
only those two, so a new pruner's file is its state class, registered for
``torch.load(weights_only=True)`` beside it, and a function built on these helpers:

* the checks of its arguments: :func:`check_every`, :func:`check_end`, :func:`check_fraction`,
  :func:`check_schedule`, :func:`check_seed`, :func:`check_where`, :func:`pruner_scope`;
* at ``update``: :func:`check_state` (the prior masks), :func:`is_update` (a tensor, traceable),
  :func:`skip` then :func:`advance` (a step that changes nothing, read on the host only where
  the step is readable), :func:`schedule_value` (a fraction, checked), a count rule as the
  selection's amount (:class:`Target`), :func:`merge` and :func:`finish` (the new state).

Where a step is a tensor ``where``, never a Python ``if``: ``update`` is one tensor program
whatever the step, under ``vmap`` and ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, cast

import torch

from fprune import _amount, _random, _tree
from fprune.select import Scope, _engine

Schedule = Callable[[torch.Tensor], float | torch.Tensor]

M32 = (1 << 32) - 1


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


class Pruner(NamedTuple):
    """A pruner: ``init(params) -> state`` and ``update(params, state, *, grads=None) -> (masks, state)``."""

    init: Callable[..., Any]
    update: Callable[..., Any]


# ---------------------------------------------------------------------------------- checks


def check_every(every: Any) -> int:
    if isinstance(every, bool) or not isinstance(every, numbers.Integral):
        raise TypeError(f"Expected every to be an int >= 1, got {every!r}.")
    if every < 1:
        raise ValueError(f"Expected every to be an int >= 1 (update every `every` steps), got {every!r}.")
    return int(every)


def check_end(end: Any) -> int:
    if isinstance(end, bool) or not isinstance(end, numbers.Integral):
        raise TypeError(f"Expected end to be an int >= 1 (the step where mask updates stop), got {end!r}.")
    if end < 1:
        raise ValueError(f"Expected end to be an int >= 1 (the step where mask updates stop), got {end!r}.")
    return int(end)


def check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected {name} to be a float in [0, 1], got {value!r}.")
    if not 0.0 <= cast(float, value) <= 1.0:
        raise ValueError(f"Expected {name} to be a fraction in [0, 1], got {value!r}.")
    return float(value)


def check_schedule(name: str, value: Any) -> float | Schedule:
    if callable(value):
        return value  # what it returns is checked at each update (schedule_value)
    return check_fraction(name, value)


def check_seed(seed: Any) -> Any:
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


def check_where(where: Any) -> None:
    if where is not None and not callable(where):
        raise TypeError(f"Expected where to be None or a callable (name, tensor) -> bool, got {where!r}.")


def weights(name: str, p: torch.Tensor) -> bool:
    """The default ``where`` of the pruners: leaves of two dimensions or more."""
    return p.dim() > 1


def chosen(flat: _tree.Flat, where: _tree.Where) -> list[bool]:
    return _tree.selected(flat, weights if where is None else where)


def check_state(state: Any, flat: _tree.Flat, kind: type[Any]) -> list[torch.Tensor]:
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


def readable(step: torch.Tensor) -> bool:
    """True where ``step`` can be read on the host: a plain tensor outside torch.compile,
    tracing and dispatch modes (this includes a ``vmap`` whose state's step is not batched, as
    all members step together)."""
    # torch.jit.is_tracing is public and documented, but torch.jit's __all__ leaves it out.
    return not (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()  # type: ignore[attr-defined]
        or _engine.is_traced([step])
    )


def skip(step: torch.Tensor, is_update: torch.Tensor) -> bool:
    """True where the step can be read on the host and is not an update step: the work of a
    step that changes nothing is skipped (for every member at once under such a ``vmap``)."""
    return readable(step) and not bool(is_update)


def schedule_value(schedule: float | Schedule, step: torch.Tensor, name: str) -> Any:
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
                    f"{name}(step={step_text(step)}) returned {float(value)} (a tensor); expected a "
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
            f"{name}(step={step_text(step)}) returned {value!r}; expected a fraction in [0, 1] "
            f"(a percentage or a count is not one)."
        )
    return value


def step_text(step: torch.Tensor) -> str:
    """The step for an error message: its value where it can be read, else ``state.step``."""
    return str(int(step)) if _amount.readable(step) else "state.step"


def core_fields(flat: _tree.Flat, masks: list[torch.Tensor], step: torch.Tensor) -> dict[str, Any]:
    """The shared fields of a state, ``masks`` (unflattened like ``params``) and ``step``: a
    pruner builds its state as ``ItsState(**core_fields(...), more=...)``."""
    return {"masks": _tree.unflatten(flat, masks), "step": step}


def first_step(flat: _tree.Flat) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=device_of(flat))


def is_update(step: torch.Tensor, every: int, end: int | None = None) -> torch.Tensor:
    """Whether ``step`` updates the masks, as a tensor (traceable)."""
    is_update = step % every == 0
    return is_update if end is None else is_update & (step < end)


def merge(
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


def finish(flat: _tree.Flat, masks: list[torch.Tensor], state: Any, **more: Any) -> tuple[Any, Any]:
    """``(masks, state)`` of an update: ``state`` with these masks, ``step + 1`` and ``more``
    (the pruner's own fields)."""
    out = state._replace(**core_fields(flat, masks, state.step + 1), **more)
    return out.masks, out


def seed_tensor(seed: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(seed, dtype=torch.int64, device=device)


def step_seed(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """A seed for this step: the state's seed hashed with the step (stateless, traceable)."""
    return _random.mix32((seed & M32) ^ _random.mix32((step * 0x2545F491 + 0x6A09E667) & M32))


def device_of(flat: _tree.Flat) -> torch.device:
    return flat.leaves[0].device if flat.leaves else torch.device("cpu")


def advance(flat: _tree.Flat, prior: list[torch.Tensor], state: Any, **more: Any) -> tuple[Any, Any]:
    """A step that changes no mask: the same masks (new tensors), step + 1, and ``more``."""
    return finish(flat, [m.clone() for m in prior], state, **more)


def detached(flat: _tree.Flat) -> Any:
    return _tree.unflatten(flat, [p.detach() for p in flat.leaves])


# ----------------------------------------------------------------------------- count rules
# The amounts of the pruners' selections: rule(remaining, size) -> count, applied by the
# selection layer to what the prior masks left (ints in eager code, tensors under a transform;
# the same rule over the whole mesh for DTensor params). repr() is what sharded ranks compare.


def minimum(a: Any, b: Any) -> Any:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))
    return min(a, b)


def at_least_zero(a: Any) -> Any:
    return a.clamp(min=0) if isinstance(a, torch.Tensor) else max(a, 0)


def shown(fraction: Any) -> str:
    return repr(float(fraction)) if isinstance(fraction, torch.Tensor) else repr(fraction)


class Target:
    """Prune until ``round(fraction * size)`` of ``size`` are pruned (what prior masks pruned
    counts; pruned entries never come back, so never fewer than they pruned)."""

    def __init__(self, fraction: Any):
        self.fraction = fraction

    def __call__(self, remaining: Any, size: Any) -> Any:
        return at_least_zero(_amount.round_count(self.fraction, size) - (size - remaining))

    def __repr__(self) -> str:
        return f"target({shown(self.fraction)})"


def pruner_scope(scope: Any, pruner: str, expected: str) -> Any:
    """The scope object of ``scope=``, checked: one with a fraction (``NM`` has none).

    ``pruner`` is the name of the pruner that got it, ``expected`` the scopes it takes, both
    for the messages.
    """
    if not isinstance(scope, Scope):
        raise TypeError(f"Expected scope to be a scope of fprune.select ({expected}), got {scope!r}.")
    if not scope.fractional:
        raise ValueError(
            f"{pruner} prunes a fraction of the entries given by its schedule; {scope!r} has no "
            f"fraction. Expected scope to be {expected}, got {scope!r}."
        )
    return scope


# optree reads a None leaf as an empty subtree: a None gradient is a missing entry.
NONE_GRAD = (
    " A None gradient (the .grad of a parameter that took no part in the loss) counts as "
    "missing: pass torch.zeros_like(p) for it"
)


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
