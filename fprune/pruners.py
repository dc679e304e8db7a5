"""Pruning during training: pruners as pure ``(init, update)`` pairs, with state as a pytree of tensors.

A pruner is a :class:`Pruner` named tuple of two pure functions, in the manner of optax::

    state = pruner.init(params)                                  # state.masks readable at once
    masks, state = pruner.update(params, state, grads=grads)     # once per training step

The state (:class:`PrunerState`) holds only tensors: ``masks`` (bool, shaped like ``params``),
``step`` (a 0-dim int64 tensor: the number of updates so far), ``regrown`` (bool, the entries
the last update regrew) and ``seed`` (a 0-dim int64 tensor). So it can be saved with
``torch.save`` and loaded with ``torch.load(weights_only=True)`` (this module registers
:class:`PrunerState` as a safe global), stacked and ``vmap``-ped over seeds, and threaded
through a ``torch.compile(fullgraph=True)`` step: ``update`` is a tensor program whose masks
and counts may change every step without recompiling. Whether a step updates the masks is a
tensor ``where``, not a Python ``if``; only where the step is a plain tensor (eager code, or
a ``vmap`` that leaves ``state.step`` unbatched) does ``update`` read it on the host, to skip
the work of a step that changes nothing.

Each ``update`` advances ``state.step`` by one; the first update sees step 0. "Every
``every`` steps" means at steps where ``step % every == 0``; ``end`` is exclusive. Only the
leaves ``where(name, tensor)`` selects are pruned; by default (``where=None``) those with two
dimensions or more, so biases and normalization weights stay dense.

Selection is count-exact per leaf (per selection for the global scope): dropping takes the
lowest magnitudes, ties to the first position (row-major, leaves in optree's flatten order);
growing takes the highest scores, ties to the first position too; NaN scores rank above
``+inf`` (dropped last, grown last).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, List, NamedTuple, Optional, Union

import torch

from fprune import _distributed, _dtensor_pruners, _random, _select, _torch, _tree, distributions

__all__ = ["Pruner", "PrunerState", "gradual_magnitude", "set_", "rigl", "zero_regrown"]

Schedule = Callable[[torch.Tensor], Union[float, torch.Tensor]]

_M32 = (1 << 32) - 1


class PrunerState(NamedTuple):
    """The state of a pruner: tensors only.

    Attributes:
        masks: bool masks shaped like ``params`` (``True`` = kept): the current masks.
        step: 0-dim int64 tensor, the number of updates done.
        regrown: bool tensors shaped like ``params``: the entries the last update regrew
            (all ``False`` for pruners that never regrow).
        seed: 0-dim int64 tensor, the seed of the pruner's stateless randomness.
    """

    masks: Any
    step: torch.Tensor
    regrown: Any
    seed: torch.Tensor


class Pruner(NamedTuple):
    """A pruner: ``init(params) -> state`` and ``update(params, state, *, grads=None) -> (masks, state)``."""

    init: Callable[..., PrunerState]
    update: Callable[..., Any]


# torch.load(weights_only=True) refuses classes it does not know; the state is tensors only.
torch.serialization.add_safe_globals([PrunerState])


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
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Expected {name} to be a fraction in [0, 1], got {value!r}.")
    return float(value)


def _check_schedule(name: str, value: Any) -> Union[float, Schedule]:
    if callable(value):
        return value  # a user's own callable is trusted
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


def _chosen(flat: _tree.Flat, where: _tree.Where) -> List[bool]:
    if where is None:
        return [p.dim() > 1 for p in flat.leaves]
    return _tree.selected(flat, where)


def _check_state(state: Any, flat: _tree.Flat) -> None:
    if not isinstance(state, PrunerState):
        raise TypeError(f"Expected state to be a PrunerState (from pruner.init), got {type(state).__name__}.")
    masks = _tree.flatten(state.masks, "state.masks")
    if masks.spec != flat.spec:
        raise ValueError(
            f"Expected state.masks to have the structure of params ({flat.spec}), got {masks.spec}."
        )
    for path, m, p in zip(flat.paths, masks.leaves, flat.leaves):
        if m.shape != p.shape:
            raise ValueError(
                f"Expected {_tree.describe('state.masks', path)} to have the shape of "
                f"{_tree.describe('params', path)}, {tuple(p.shape)}, got {tuple(m.shape)}."
            )


# ------------------------------------------------------------------------------- selection


def _lowest(scores: torch.Tensor, eligible: torch.Tensor, k: Any) -> torch.Tensor:
    """The ``k`` lowest-scoring ``eligible`` entries (bool, flat), ties to the first position.

    ``k`` (an int or a 0-dim integer tensor) must not exceed the number of eligible entries.
    One stable sort of order-preserving integer keys (-0 == 0, NaN above +inf), then the first
    ``k`` eligible entries in that order: a tensor program with no data-dependent shape.
    """
    keys = _select.orderable(scores, _select.key_dtype([scores]))
    order = torch.argsort(keys, stable=True)
    eligible_sorted = torch.gather(eligible, 0, order)
    taken_sorted = eligible_sorted & (torch.cumsum(eligible_sorted.to(torch.int64), 0) <= k)
    return torch.zeros_like(eligible).scatter(0, order, taken_sorted)


def _count(fraction: Any, n: Any) -> torch.Tensor:
    """``round(fraction * n)`` (half to even, as Python's ``round``) as an int64 tensor, in float64."""
    if not all(_torch.has_float64(t.device) for t in (fraction, n) if isinstance(t, torch.Tensor)):
        return _count_on_host(fraction, n)
    fraction = torch.as_tensor(fraction, dtype=torch.float64)
    n = torch.as_tensor(n)
    return torch.round(fraction.to(torch.float64) * n.to(torch.float64)).to(torch.int64)


def _count_on_host(fraction: Any, n: Any) -> torch.Tensor:
    """:func:`_count` for a device without float64 (MPS): the same float64 arithmetic on the CPU."""
    device = next(t.device for t in (n, fraction) if isinstance(t, torch.Tensor))
    # moved first, converted on the host: no float64 tensor is ever made on the device
    fraction = torch.as_tensor(fraction).to("cpu").to(torch.float64)
    n = torch.as_tensor(n).to("cpu").to(torch.float64)
    return torch.round(fraction * n).to(torch.int64).to(device)


def _skip(step: torch.Tensor, is_update: torch.Tensor) -> bool:
    """True where the step can be read on the host and is not an update step.

    Only when ``step`` is a plain tensor outside torch.compile, tracing and dispatch modes;
    this includes a ``vmap`` whose state's step is not batched (``in_dims`` with ``None`` for
    ``step``, as all members step together), where skipping spares every member the sorts.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _select.is_traced([step]):
        return False
    return not bool(is_update)


def _schedule_value(schedule: Union[float, Schedule], step: torch.Tensor) -> Any:
    return schedule(step) if callable(schedule) else schedule


def _new_state(flat, masks: List[torch.Tensor], step, regrown: Optional[List[torch.Tensor]], seed) -> PrunerState:
    if regrown is None:
        regrown = [torch.zeros_like(m) for m in masks]
    return PrunerState(_tree.unflatten(flat, masks), step, _tree.unflatten(flat, regrown), seed)


def _seed_tensor(seed: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(seed, dtype=torch.int64, device=device)


def _step_seed(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """A seed for this step: the state's seed hashed with the step (stateless, traceable)."""
    return _random._mix32((seed & _M32) ^ _random._mix32((step * 0x2545F491 + 0x6A09E667) & _M32))


def _device(flat: _tree.Flat) -> torch.device:
    return flat.leaves[0].device if flat.leaves else torch.device("cpu")


# ------------------------------------------------------------------------ gradual magnitude


def gradual_magnitude(
    schedule: Schedule, *, every: int, scope: str = "global", where: _tree.Where = None
) -> Pruner:
    """Gradual magnitude pruning (Zhu & Gupta, 2017) as an ``(init, update)`` pair.

    At update steps (``step % every == 0``) the pruned fraction of all selected entries
    becomes ``schedule(step)`` (a fraction of the whole, not of what remains), by magnitude:
    over all selected leaves at once (``scope="global"``) or ``schedule(step)`` of each leaf
    (``scope="layerwise"``). Pruned weights never come back: if the schedule asks for fewer
    than are pruned, nothing changes. The masks start all ``True``.

    Args:
        schedule: ``step -> fraction`` (e.g. :func:`fprune.schedules.polynomial` with bound
            parameters); it is called with the 0-dim int64 step tensor.
        every: update the masks every ``every`` steps (an int >= 1).
        scope: ``"global"`` (one ranking over all selected leaves) or ``"layerwise"``.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune; by default those
            with two dimensions or more (biases stay dense).

    Returns:
        A :class:`Pruner`.

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
    if scope not in ("global", "layerwise"):
        raise ValueError(f'Expected scope to be "global" or "layerwise", got {scope!r}.')
    _check_where(where)

    def init(params: Any) -> PrunerState:
        flat = _tree.flatten(params, "params")
        device = _device(flat)
        masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
        step = torch.zeros((), dtype=torch.int64, device=device)
        return _new_state(flat, masks, step, None, _seed_tensor(0, device))

    def update(params: Any, state: PrunerState, *, grads: Any = None) -> Any:
        flat = _tree.flatten(params, "params")
        _check_state(state, flat)
        chosen = _chosen(flat, where)
        prior = _tree.flatten(state.masks, "state.masks").leaves
        step = state.step
        is_update = step % every == 0
        if _skip(step, is_update):
            return _advance(flat, prior, state)
        fraction = _schedule_value(schedule, step)
        if _distributed.holds_dtensor(params):  # sharded (FSDP2): the distributed selections
            out = _new_state(flat, _dtensor_pruners.gradual(flat, chosen, prior, fraction, scope), step + 1, None, state.seed)
            return out.masks, out
        ids = [i for i, c in enumerate(chosen) if c]
        new = list(prior)
        if scope == "global" and ids:
            sizes = [flat.leaves[i].numel() for i in ids]
            scores = torch.cat([flat.leaves[i].detach().abs().reshape(-1) for i in ids])
            alive = torch.cat([prior[i].reshape(-1) for i in ids])
            extra = (_count(fraction, alive.numel()) - (alive.numel() - alive.sum())).clamp(min=0)
            dropped = _lowest(scores, alive, extra)
            for i, d in zip(ids, torch.split(dropped, sizes)):
                new[i] = prior[i] & ~d.view(prior[i].shape)
        else:
            for i in ids:
                alive = prior[i].reshape(-1)
                extra = (_count(fraction, alive.numel()) - (alive.numel() - alive.sum())).clamp(min=0)
                d = _lowest(flat.leaves[i].detach().abs().reshape(-1), alive, extra)
                new[i] = prior[i] & ~d.view(prior[i].shape)
        masks = [torch.where(is_update, n, p) if i in ids else p.clone() for i, (n, p) in enumerate(zip(new, prior))]
        out = _new_state(flat, masks, step + 1, None, state.seed)
        return out.masks, out

    return Pruner(init, update)


def _advance(flat, prior: List[torch.Tensor], state: PrunerState):
    """A step that changes no mask: the same masks (new tensors), nothing regrown, step + 1."""
    out = _new_state(flat, [m.clone() for m in prior], state.step + 1, None, state.seed)
    return out.masks, out


# -------------------------------------------------------------------------------- SET, RigL


def set_(
    sparsity: float,
    *,
    distribution: str = "erk",
    drop_fraction: Union[float, Schedule],
    every: int,
    end: int,
    where: _tree.Where = None,
    seed: Any = 0,
) -> Pruner:
    """Sparse Evolutionary Training (Mocanu et al., 2018): drop by magnitude, regrow at random.

    ``init`` draws random masks with each selected leaf at its sparsity (``distribution``:
    ``"erk"`` or ``"uniform"``, see :mod:`fprune.distributions`; each leaf prunes
    ``round(fraction * numel)`` entries). At update steps before ``end``, each leaf drops
    ``k = min(round(drop_fraction(step) * active), inactive)`` of its active entries of lowest
    magnitude and regrows ``k`` entries at random among those inactive before the update (the
    ones just dropped excluded), so every leaf's sparsity stays constant. ``state.regrown``
    marks the regrown entries: start them at zero with :func:`zero_regrown`. Randomness is a
    stateless hash of the seed, the step and the leaf number.

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
        >>> pruner = fprune.set_(0.75, distribution="uniform", drop_fraction=0.5, every=1, end=10)
        >>> state = pruner.init(params)
        >>> masks, state = pruner.update(params, state)
        >>> int(masks["w"].sum()), int(state.regrown["w"].sum()), bool(masks["b"].all())
        (16, 8, True)
    """
    return _dynamic("set_", sparsity, distribution, drop_fraction, every, end, where, seed, grow="random")


def rigl(
    sparsity: float,
    *,
    distribution: str = "erk",
    drop_fraction: Union[float, Schedule],
    every: int,
    end: int,
    where: _tree.Where = None,
    seed: Any = 0,
) -> Pruner:
    """RigL (Evci et al., 2020): drop by magnitude, regrow by dense-gradient magnitude.

    As :func:`set_`, but the ``k`` entries regrown in each leaf are those of largest
    ``|grads|`` among the entries inactive before the update (the ones just dropped
    excluded); ``update`` requires ``grads``, the *dense* gradient (computed through
    ``fprune.masked_call(..., straight_through=True)``, or of dense weights). The seed only
    draws the initial masks.

    Args:
        sparsity: the overall fraction of selected entries to prune, in [0, 1].
        distribution: ``"erk"`` or ``"uniform"``.
        drop_fraction: a fraction in [0, 1] or a schedule ``step -> fraction``.
        every: update the masks every ``every`` steps (an int >= 1).
        end: no updates from this step on (exclusive; an int >= 1).
        where: picks the leaves to prune; by default those with two dimensions or more.
        seed: an int or a 0-dim integer tensor.

    Returns:
        A :class:`Pruner`; its ``update`` needs ``grads=`` shaped like ``params``.

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
    return _dynamic("rigl", sparsity, distribution, drop_fraction, every, end, where, seed, grow="gradient")


def _dynamic(name, sparsity, distribution, drop_fraction, every, end, where, seed, grow) -> Pruner:
    sparsity = _check_fraction("sparsity", sparsity)
    if distribution not in ("erk", "uniform"):
        raise ValueError(f'Expected distribution to be "erk" or "uniform", got {distribution!r}.')
    drop_fraction = _check_schedule("drop_fraction", drop_fraction)
    every = _check_every(every)
    end = _check_end(end)
    _check_where(where)
    seed = _check_seed(seed)
    spread = distributions.erk if distribution == "erk" else distributions.uniform

    def init(params: Any) -> PrunerState:
        flat = _tree.flatten(params, "params")
        chosen = _chosen(flat, where)
        device = _device(flat)
        seed_t = _seed_tensor(seed, device)
        selected = [i for i, c in enumerate(chosen) if c]
        fractions = _selected_fractions(flat, selected, sparsity, spread)
        if _distributed.holds_dtensor(params):  # sharded (FSDP2): the distributed selections
            masks = _dtensor_pruners.initial(flat, selected, fractions, seed_t)
            return _new_state(flat, masks, torch.zeros((), dtype=torch.int64, device=device), None, seed_t)
        masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
        for i in selected:
            p = flat.leaves[i]
            scores = _random.uniform(p.shape, seed_t, i, p.device).reshape(-1)
            k = round(fractions[i] * p.numel())
            masks[i] = ~_lowest(scores, masks[i].reshape(-1), k).view(p.shape)
        step = torch.zeros((), dtype=torch.int64, device=device)
        return _new_state(flat, masks, step, None, seed_t)

    def update(params: Any, state: PrunerState, *, grads: Any = None) -> Any:
        flat = _tree.flatten(params, "params")
        _check_state(state, flat)
        if grow == "gradient":
            if grads is None:
                raise TypeError(f"{name}'s update needs grads=, the dense gradient shaped like params.")
            grad_leaves = _tree.check_scores(flat, grads)
        chosen = _chosen(flat, where)
        prior = _tree.flatten(state.masks, "state.masks").leaves
        step = state.step
        is_update = (step % every == 0) & (step < end)
        if _skip(step, is_update):
            return _advance(flat, prior, state)
        fraction = _schedule_value(drop_fraction, step)
        step_seed = _step_seed(state.seed, step) if grow == "random" else None
        if _distributed.holds_dtensor(params):  # sharded (FSDP2): the distributed selections
            masks, regrown = _dtensor_pruners.dynamic(
                flat, chosen, prior, fraction, step_seed, grad_leaves if grow == "gradient" else None
            )
            out = _new_state(flat, masks, step + 1, regrown, state.seed)
            return out.masks, out
        masks, regrown = [], []
        for i, (p, m) in enumerate(zip(flat.leaves, prior)):
            if not chosen[i]:
                masks.append(m.clone())
                regrown.append(torch.zeros_like(m))
                continue
            active = m.reshape(-1)
            n_active = active.sum()
            k = torch.minimum(_count(fraction, n_active), p.numel() - n_active)
            dropped = _lowest(p.detach().abs().reshape(-1), active, k)
            if grow == "random":
                grow_scores = _random.uniform(p.shape, step_seed, i, p.device).reshape(-1)
            else:
                grow_scores = grad_leaves[i].detach().abs().reshape(-1)
            # highest first, ties to the first position: the lowest of the negated scores
            # (NaN stays NaN and so ranks last, as it does when dropping)
            grown = _lowest(-grow_scores, ~active, k)
            new = (active & ~dropped) | grown
            masks.append(torch.where(is_update, new, active).view(m.shape))
            regrown.append((grown & is_update).view(m.shape))
        out = _new_state(flat, masks, step + 1, regrown, state.seed)
        return out.masks, out

    return Pruner(init, update)


def _selected_fractions(flat, selected, sparsity, spread) -> dict:
    """Per-leaf fractions of the selected leaves, ``spread`` over those leaves only."""
    sub = {str(j): flat.leaves[i] for j, i in enumerate(selected)}
    fractions = spread(sub, sparsity) if sub else {}
    return {i: fractions[str(j)] for j, i in enumerate(selected)}


# ---------------------------------------------------------------------------- zero_regrown


def zero_regrown(tree: Any, state: PrunerState) -> Any:
    """``tree`` with the entries the last update regrew set to zero.

    ``tree`` is any pytree shaped like ``params``: the weights (regrown weights start at zero,
    as in RigL), or an optimizer's per-parameter state such as Adam's moments.

    Args:
        tree: a pytree of tensors with the structure and shapes of ``params``.
        state: a :class:`PrunerState` (``state.regrown`` says which entries).

    Returns:
        A new pytree like ``tree``.

    Example:
        >>> import torch, fprune
        >>> state = fprune.PrunerState({"w": torch.ones(3, dtype=torch.bool)}, torch.tensor(1),
        ...                            {"w": torch.tensor([False, True, False])}, torch.tensor(0))
        >>> fprune.zero_regrown({"w": torch.tensor([1.0, 2.0, 3.0])}, state)
        {'w': tensor([1., 0., 3.])}
    """
    if not isinstance(state, PrunerState):
        raise TypeError(f"Expected state to be a PrunerState (from pruner.init), got {type(state).__name__}.")
    flat = _tree.flatten(tree, "tree")
    regrown = _tree.flatten(state.regrown, "state.regrown")
    if regrown.spec != flat.spec:
        raise ValueError(f"Expected tree to have the structure of state.regrown ({regrown.spec}), got {flat.spec}.")
    out = []
    for path, x, r in zip(flat.paths, flat.leaves, regrown.leaves):
        if x.shape != r.shape:
            raise ValueError(
                f"Expected {_tree.describe('tree', path)} to have the shape {tuple(r.shape)}, got {tuple(x.shape)}."
            )
        out.append(x.masked_fill(r, 0))
    return _tree.unflatten(flat, out)
