"""Masks by dependency group: :func:`group_structured`, and the params bookkeeping it shares
with compacting (:class:`Leaves`)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fprune import _amount, _tree
from fprune._types import Masks, Params, Scores
from fprune.select import EACH, Each, Global, LayerCollapseWarning, _engine, select
from fprune.structure._types import Group, Structure

__all__ = ["group_structured", "Leaves", "check_structure"]


def check_structure(structure: Any) -> None:
    if not isinstance(structure, Structure):
        raise TypeError(
            f"Expected structure to be a fprune.structure.Structure (from "
            f"fprune.structure.groups(module, args)), got {type(structure).__name__}."
        )


class Leaves:
    """The leaves of ``params`` by member name (tied aliases resolved), checked against shapes."""

    def __init__(self, params: Any, structure: Structure):
        self.flat = _tree.flatten(params, "params")
        self.names = [_tree.dotted(path) for path in self.flat.paths]
        self.by_name: dict[str, list[int]] = {}
        for i, name in enumerate(self.names):
            self.by_name.setdefault(structure.canonical(name), []).append(i)
        shapes = dict(structure.shapes)
        for name, indices in self.by_name.items():
            for i in indices:
                leaf = self.flat.leaves[i]
                if name in shapes and tuple(leaf.shape) != shapes[name]:
                    raise ValueError(
                        f"Expected {_tree.describe('params', self.flat.paths[i])} to have the "
                        f"shape the structure was made with, {shapes[name]}, got "
                        f"{tuple(leaf.shape)}; call fprune.structure.groups on this model again."
                    )

    def first(self, name: str) -> int | None:
        indices = self.by_name.get(name)
        return indices[0] if indices else None


def _group_where(where: Any) -> Callable[[Group], bool] | None:
    """``group_structured``'s ``where`` as a ``group -> bool``: ``where(name, group)`` (fprune's
    form) when the callable takes two positional arguments, else the older ``where(group)``."""
    if where is None:
        return None
    try:
        inspect.signature(where).bind(None, None)
    except (TypeError, ValueError):  # cannot take two arguments, or no signature to read
        return lambda g: bool(where(g))
    return lambda g: bool(where(g.name, g))


def _check_scope(scope: Any) -> bool:
    """Whether ``scope`` (EACH or a Global) ranks the chosen groups together."""
    if not isinstance(scope, (Each, Global)):
        raise TypeError(
            f"Expected scope to be fprune.select.EACH (each group on its own) or "
            f"fprune.select.Global(...) (all chosen groups in one ranking), got {scope!r}."
        )
    return scope != EACH  # Each has no fields: every Each equals EACH


@torch.no_grad()
def group_structured(
    params: Params,
    amount: _amount.Amount,
    structure: Structure,
    *,
    n: float = 2,
    importance_scores: Scores | None = None,
    masks: Masks | None = None,
    where: Callable[..., bool] | None = None,
    scope: Each | Global = EACH,
    round_to: int | None = None,
) -> Masks:
    """Prune whole channels of dependency groups: every member of a group at the same channels.

    A channel's score is the sum over the group's members (those in ``params``) of ``|s|**n``
    summed over the channel's slices, ``s`` being ``importance_scores`` or the parameters
    (entries that prior masks pruned count as zero). With ``scope=EACH`` (the default) each
    group loses ``amount`` of its remaining channels on its own; with ``scope=Global(...)`` the
    channels of all chosen groups are ranked together (ties across groups: groups in
    sorted-name order). Counts follow fprune's rule, ``round(amount * remaining)``, and ties go
    to the lower channel index, both as in :func:`fprune.select.select`, which does the
    selection (channel scores are never negative). Torch-Pruning instead *floors the kept
    count* (it prunes ``C - int(C * (1 - amount))``): for ``C=10, amount=0.25`` fprune prunes
    2 channels, Torch-Pruning 3. Pass an int ``amount`` for a count per group.

    Args:
        params: parameters keyed like ``dict(module.named_parameters())`` (a flat dict, or a
            pytree whose dotted paths are those names; tied aliases may appear under either name).
        amount: a fraction of remaining channels, or a count.
        structure: from :func:`groups`.
        n: the exponent of the per-entry score (2: squared L2 per channel, Torch-Pruning's
            ``GroupMagnitudeImportance(p=2)`` summed instead of averaged over members).
        importance_scores: a pytree like ``params`` of scores (from any fprune score function).
        masks: prior masks; a channel stays alive while any member keeps an entry of it.
            Nothing pruned comes back.
        where: ``where(name, group) -> bool`` picks the groups to prune, ``name`` being the
            group's name (``"param:dim"``), as every other ``where`` in fprune takes
            ``(name, tensor)``. The one-argument form ``where(group) -> bool`` works too: a
            callable that cannot take two positional arguments gets the group alone. Groups
            that are not prunable are always skipped; by default (``None``) the prunable
            groups that are exact.
        scope: :data:`fprune.select.EACH` or :class:`fprune.select.Global`; its ``min_keep``
            makes every group keep at least that many channels (an int) or that fraction of
            them (a float). Without it a global ranking can remove a whole group (warned with
            a :class:`fprune.select.LayerCollapseWarning`), which :func:`compact` cannot
            build.
        round_to: keep a multiple of this many channels in each group (the kept count is
            rounded down, so more is pruned, as Torch-Pruning's ``round_to``); ``EACH`` only.

    Returns:
        Masks (``torch.bool``) for every leaf of ``params``, consistent across every group.

    Raises:
        TypeError: a wrong kind of ``structure``, ``where``, ``scope`` or ``n``.
        ValueError: a bad ``amount`` or ``round_to``, or params whose shapes are not those the
            structure was made with.

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> s = fprune.structure.groups(net, (torch.randn(2, 3),))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> m = fprune.group_structured(params, 0.5, s)
        >>> int(m["0.weight"].all(dim=1).sum()), torch.equal(m["0.weight"].all(1), m["2.weight"].all(0))
        (2, True)
    """
    check_structure(structure)
    _amount.check_amount(amount)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0:
        raise (TypeError if not isinstance(n, (int, float)) or isinstance(n, bool) else ValueError)(
            f"Expected n to be a positive number, got {n!r}."
        )
    is_global = _check_scope(scope)
    if round_to is not None:
        if isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1:
            raise ValueError(f"Expected round_to to be None or a positive int, got {round_to!r}.")
        if is_global:
            raise ValueError("round_to works with scope=EACH only.")
    if where is not None and not callable(where):
        raise TypeError(f"Expected where to be None or a callable (name, group) -> bool, got {where!r}.")
    leaves = Leaves(params, structure)
    flat = leaves.flat
    scores = None if importance_scores is None else _tree.check_scores(flat, importance_scores)
    prior = [None] * len(flat.leaves) if masks is None else _tree.check_masks(flat, masks)
    picks = _group_where(where)
    chosen = [g for g in structure.groups if g.prunable and (g.exact if picks is None else picks(g))]
    chosen = [g for g in chosen if any(leaves.first(m.param) is not None for m in g.members)]

    channel_scores, alive = {}, {}
    for g in chosen:
        total, keep = None, None
        for m in g.members:
            i = leaves.first(m.param)
            if i is None:
                continue
            p, before = flat.leaves[i], prior[i]
            values = p if scores is None else scores[i]
            if scores is None and before is not None:
                values = torch.where(before, values, torch.zeros((), dtype=values.dtype))
            s = m.slices(values).abs().to(torch.float32 if values.element_size() < 8 else values.dtype)
            s = s.pow(n).sum(dim=1)
            total = s if total is None else total + s
            if before is not None:
                k = m.slices(before).any(dim=1)
                keep = k if keep is None else keep | k
        assert total is not None  # chosen groups have a member in params
        channel_scores[g.name] = total
        alive[g.name] = keep if keep is not None else torch.ones_like(total, dtype=torch.bool)

    if not chosen:
        kept = {}
    elif is_global and torch.compiler.is_compiling():
        kept = select(channel_scores, amount, scope=scope, masks=alive)  # never warns
    elif is_global:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LayerCollapseWarning)
            kept = select(channel_scores, amount, scope=scope, masks=alive)
        for w in caught:
            if not issubclass(w.category, LayerCollapseWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        emptied = [  # groups this call emptied (not those prior masks had emptied already)
            name
            for name in channel_scores
            if caught and bool(alive[name].any()) and not bool(kept[name].any())
        ]
        if emptied:
            warnings.warn(
                f"group_structured with a Global scope removed every channel of group(s) "
                f"{', '.join(emptied)}; compact cannot build a layer with no channel. Pass "
                f"scope=fprune.select.Global(min_keep=...) (channels kept per group: a count or "
                f"a fraction) to prevent it.",
                LayerCollapseWarning,
                stacklevel=3,  # past torch.no_grad's wrapper, at the caller's line
            )
    elif round_to is None:
        kept = select(channel_scores, amount, masks=alive)
    else:
        kept = {}
        for g in chosen:
            remaining = alive[g.name].sum() if masks is not None else g.size
            if isinstance(remaining, torch.Tensor):
                if _engine.is_traced([remaining]):
                    raise ValueError("round_to with prior masks needs eager mode (counts are data).")
                remaining = int(remaining)
            count = _amount.count(amount, remaining, "channels", f"group {g.name}")
            if isinstance(count, torch.Tensor):
                raise ValueError("round_to needs a Python-number amount.")
            keep_count = ((remaining - count) // round_to) * round_to
            kept.update(
                select(
                    {g.name: channel_scores[g.name]}, remaining - keep_count, masks={g.name: alive[g.name]}
                )
            )

    out: list[torch.Tensor] = []
    for i, p in enumerate(flat.leaves):
        before = prior[i]
        out.append(before if before is not None else torch.ones_like(p, dtype=torch.bool))
    for g in chosen:
        keep = kept[g.name]
        for m in g.members:
            for i in leaves.by_name.get(m.param, []):
                p = flat.leaves[i]
                pos = m.positions(p.shape[m.dim], p.device)
                true = torch.ones((), dtype=torch.bool, device=p.device)
                along = torch.where(pos >= 0, keep[..., pos.clamp(min=0)], true)
                view = [1] * p.dim()
                view[m.dim] = p.shape[m.dim]
                out[i] = out[i] & along.reshape(view)
    return _tree.unflatten(flat, out)
