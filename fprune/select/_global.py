"""Private: the :class:`Global` scope (one ranking over every leaf), with its floors
(``min_keep``), normalization and layer-collapse warning, written once for both executors."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, cast

import torch

from fprune import _amount, _torch, _tree, _warn
from fprune.select import _engine, _inputs
from fprune.select._executor import Executor
from fprune.select._scope import Scope

_NORMS = {"l1": 1.0, "l2": 2.0}


@dataclass(frozen=True)
class Global(Scope):
    """All selected leaves in one ranking: ``amount`` of all their remaining entries are pruned.

    Args:
        normalize: ``None``/``False`` (rank the scores as they are), ``"l1"``, ``"l2"`` (or
            ``True`` for ``"l2"``): divide each leaf's scores by their norm over the entries
            it still keeps before the ranking (every leaf then has norm 1; a leaf of many
            entries has smaller normalized scores than a leaf of few).
        min_keep: protection against layer collapse: every leaf keeps at least this many of
            its entries (an int) or this fraction of them (a float in [0, 1], counted as
            ``round(min_keep * numel)``), or what prior masks left it if that is less. The
            count pruned is unchanged: a leaf at its floor stops contributing and the rest of
            the count goes to the other leaves, in the same order (lowest first, ties by
            position). An eager call that cannot reach its count above the floors raises
            ``ValueError``; under a transform the count is capped at what the floors allow.

    An eager call that prunes every remaining entry of a leaf (possible without ``min_keep``)
    warns with a :class:`LayerCollapseWarning` (a ``UserWarning``) naming the leaves (one
    host read for all leaves, rarely two; none under a transform).
    """

    normalize: bool | str | None = None
    min_keep: int | float | None = None

    def __post_init__(self) -> None:
        _check_normalize(self.normalize)
        _check_min_keep(self.min_keep)

    def leaf_amounts(self, inputs: Any, amount: Any) -> list[Any]:
        if _inputs.is_per_leaf(amount):
            raise TypeError(
                f"Expected one amount for the Global scope (a single ranking over all leaves), "
                f"got per-leaf amounts {amount!r}."
            )
        return _inputs.leaf_amounts(inputs, amount)

    def masks(self, ex: Executor) -> dict[int, torch.Tensor]:
        return _rank(self, ex)


class LayerCollapseWarning(UserWarning):
    """An eager global selection pruned every remaining entry of a leaf (see :class:`Global`).

    Silence it with ``warnings.filterwarnings("ignore", category=LayerCollapseWarning)``.
    """


def _check_min_keep(min_keep: Any) -> None:
    if min_keep is None:
        return
    if isinstance(min_keep, bool) or not isinstance(min_keep, numbers.Real):
        raise TypeError(
            f"Expected min_keep to be None, an int (entries kept per leaf) or a float in [0, 1] "
            f"(a fraction of each leaf), got {min_keep!r}."
        )
    if isinstance(min_keep, numbers.Integral):
        if min_keep < 0:
            raise ValueError(f"Expected min_keep to be a non-negative count, got {min_keep}.")
    elif not 0.0 <= float(min_keep) <= 1.0:  # NaN fails this too
        raise ValueError(f"Expected min_keep as a fraction to be in [0, 1], got {min_keep}.")


def _check_normalize(normalize: Any) -> float | None:
    if normalize is None or normalize is False:
        return None
    if normalize is True:
        return _NORMS["l2"]
    if isinstance(normalize, str) and normalize in _NORMS:
        return _NORMS[normalize]
    raise ValueError(f"Expected normalize to be False, True, 'l1' or 'l2', got {normalize!r}.")


def _rank(scope: Global, ex: Executor) -> dict[int, torch.Tensor]:
    """The selection of ``scope`` with the executor ``ex``'s global ranking: counts, floors,
    normalization and the warning."""
    norm = _check_normalize(scope.normalize)
    chosen = ex.pruned()
    sizes = [ex.inputs.params.leaves[i].numel() for i in chosen]
    alive = ex.alive(chosen)
    total_alive = sum(alive)
    # Counted even over no leaf at all: a count above what remains (0) raises, as it would for
    # empty leaves; a fraction of nothing is nothing.
    new = ex.count(ex.amount, total_alive, sum(sizes))
    if not chosen:
        return {}
    unchanged = ex.unchanged(chosen, new)
    if unchanged is not None:
        return unchanged
    k = new + (sum(sizes) - total_alive)
    values = ex.values(chosen)
    priors = [ex.prior(i) for i in chosen]
    dtype = _engine.key_dtype(values)
    transforms: list[Any] = [ex.source] * len(chosen)
    if norm is not None:
        scales = ex.norms(chosen, values, priors, norm, norm_scale)
        transforms = [_scaled(scale, dtype, ex.source) for scale in scales]
    protect: list[torch.Tensor | None] = [None] * len(chosen)
    if scope.min_keep is not None:
        protect, k = _floors(ex, scope, chosen, sizes, alive, values, priors, transforms, dtype, k, new)
    plain = norm is None and scope.min_keep is None
    keeps = ex.rank_all(chosen, values, priors, transforms, protect, dtype, k, plain)
    emptied = ex.emptied(alive)
    if emptied:
        names = [ex.name(chosen[j]) for j in emptied]
        _warn.warn(  # at the caller's line
            f"global pruning removed every remaining entry of {_tree.listing(names, 8)} (layer "
            f"collapse); pass min_keep= (a count or a fraction of entries kept per leaf) to "
            f"prevent it.",
            LayerCollapseWarning,
        )
    return dict(zip(chosen, keeps, strict=True))


def _floors(
    ex: Executor,
    scope: Global,
    chosen: list[int],
    sizes: list[int],
    alive: list[Any],
    values: list[torch.Tensor],
    priors: list[torch.Tensor | None],
    transforms: list[Any],
    dtype: torch.dtype,
    k: Any,
    new: Any,
) -> tuple[list[torch.Tensor | None], Any]:
    """``min_keep``: which entries each leaf protects, and the global count, clamped if traced.

    Pruning the ``k`` lowest entries with no leaf below its floor, the rest of the count going
    to the other leaves in the same order, is pruning the ``k`` lowest of the entries that are
    among their own leaf's ``n - floor`` lowest (each leaf's ``n - floor`` lowest come first in
    any greedy walk of the global order). Those are found per leaf; the others are protected.
    """
    floor_of = scope.min_keep
    floors = [
        floor_of
        if isinstance(floor_of, numbers.Integral)
        else _amount.round_count(float(cast(float, floor_of)), n)
        for n in sizes
    ]
    # A leaf keeps min(floor, what it has): entries prior masks pruned never come back.
    prunable = [
        n - (torch.clamp(a, max=f) if isinstance(a, torch.Tensor) else min(a, f))
        for n, a, f in zip(sizes, alive, floors, strict=True)
    ]
    room = sum(prunable)
    if isinstance(k, torch.Tensor) or isinstance(room, torch.Tensor):
        k = torch.clamp(torch.as_tensor(k), max=room)  # traced: never into a floor
    elif k > room:
        raise ValueError(
            f"amount={ex.amount} asks for {new} entries but min_keep={floor_of} lets at most "
            f"{room - (sum(sizes) - sum(alive))} of the remaining {sum(alive)} be pruned."
        )
    limited = [j for j, (n, f) in enumerate(zip(sizes, floors, strict=True)) if f > 0 and n > 0]
    items = [
        (chosen[j], _engine.keys(values[j], priors[j], dtype, transforms[j]), prunable[j], dtype)
        for j in limited
    ]
    by_leaf = dict(zip(limited, ex.lowest_each(items), strict=True)) if items else {}
    return [by_leaf.get(j) for j in range(len(chosen))], k  # True where kept by its own leaf


def _scaled(scale: torch.Tensor, key_dtype: torch.dtype, source: Any) -> Any:
    """The transform that divides a leaf's scores (their magnitudes, for ``source``) by ``scale``,
    its norm over its kept entries, in float32 for float32 keys (float64 otherwise)."""
    work = torch.float32 if key_dtype == torch.int32 else torch.float64
    scale = torch.clamp(scale, min=torch.finfo(work).tiny).to(work)
    if source is None:
        return lambda chunk: chunk.to(work) / scale
    return lambda chunk: chunk.to(work).abs() / scale


def norm_scale(values: torch.Tensor, keep: torch.Tensor | None, norm: float) -> torch.Tensor:
    """One leaf's norm (order ``norm``) over its kept entries, in float64 where the device has it."""
    kept = values if keep is None else torch.where(keep, values, torch.zeros((), dtype=values.dtype))
    if not _torch.has_float64(values.device):
        return _norm_float32(kept, norm)
    return torch.linalg.vector_norm(kept.to(torch.float64), ord=norm)


def _norm_float32(kept: torch.Tensor, norm: float) -> torch.Tensor:
    """:func:`norm_scale` on a device without float64 (MPS): the norm in float32.

    The float64 path rounds the float64 norm to float32 for float32 scores; here the norm is
    summed in float32 by ``torch.sum`` (``vector_norm``'s float32 sums on the CPU drift as the
    leaf grows, where ``sum``'s cascade does not), so it can differ from that by a few units in
    the last place (within 2e-7, relative, at 2M entries in
    tests/devices/test_devices_no_float64.py), and so can the normalized scores: masks may then
    differ from the float64 path's among entries whose normalized scores, across leaves, are that
    close. Counts are exact either way.
    """
    magnitude = kept.to(torch.float32).abs()
    if norm == 1.0:
        scale = magnitude.sum()
    else:  # scaled by the largest magnitude first, so that squares cannot overflow
        top = torch.clamp(
            magnitude.amax() if magnitude.numel() else magnitude.sum(), min=torch.finfo(torch.float32).tiny
        )
        scale = top * (magnitude / top).square().sum().sqrt()
    return scale
