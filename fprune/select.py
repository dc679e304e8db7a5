"""The selection layer: scores in, masks out, with the scope as a parameter.

Every mask function of fprune is a *score function* over this layer: it says how important
each entry is, and :func:`select` (or :func:`select_inputs`, its form for validated arguments)
turns the scores into ``torch.bool`` keep-masks. The layer guarantees the selection rule:

* **count-exact**: exactly the computed count is pruned, even when scores tie;
* **lowest first**: the lowest scores are pruned first; ties are broken by position (the
  earlier entry is pruned first: row-major order inside a tensor, optree's flatten order across
  leaves, a dict's keys sorted); ``-0.0`` equals ``0.0``; NaN ranks above ``+inf``;
* **prior masks** (``masks=``): entries they pruned rank below everything, stay pruned and are
  counted; a fraction ``amount`` is relative to what they left;
* the same masks eagerly (a streaming select for the per-leaf and global scopes, which never
  concatenates the scores) and under ``vmap``, ``grad``, ``torch.compile`` or with a tensor
  ``amount`` (a stable sort without ``.item()``, data-dependent shapes or branches on values).

Ranking (``rank=``): ``"value"`` ranks the scores as signed numbers (the lowest value is pruned
first: GraSP's ``p * Hg``, random draws); ``"magnitude"`` ranks ``|score|``, the named score
source :data:`fprune._select.MAGNITUDE` whose float32 keys are the bits with the sign cleared
(no ``|x|`` copy is made).

Scopes (``scope=``), small frozen objects:

* :class:`Each` (``EACH``): every leaf on its own (``l1_unstructured``).
* :class:`Global`: all leaves in one ranking (``global_unstructured``), optionally normalized
  per leaf first.
* :class:`Channels`: per leaf, the slices along ``dim`` are pruned whole; a channel's score is a
  reduction of its entries' scores (a norm, or any callable), or is given directly as a 1-d
  score per channel by a method's score function (``ln_structured``, ``random_structured``).
* :class:`Rows`: per leaf, every index along ``dim`` is its own group and loses
  ``round(amount * remaining)`` entries (``rowwise_unstructured``, Wanda's per-output choice).
* :class:`NM`: per leaf, every group of ``m`` consecutive entries along ``dim`` keeps its ``n``
  highest scores (``n_m``; 2:4 sparsity is ``NM(2, 4)``).

``Rows`` and ``NM`` are one tensor program whatever the path (a stable sort per group).

Adding a method takes one score function and one export line. The score function validates its
arguments with :func:`fprune._inputs.gather` (which names every leaf in its messages), then hands
:func:`select_inputs` a callable ``score(i) -> tensor`` giving leaf ``i``'s scores (called once
per selected leaf, in leaf order, after every check has passed) and a scope. This is
``rowwise_unstructured``, the worked example, in full::

    def rowwise_unstructured(params, amount, *, dim=0, importance_scores=None, masks=None,
                             where=None, signed=False):
        inputs = _inputs.gather(params, amount, importance_scores, masks, where)
        return select_inputs(inputs, given_scores(inputs), amount, Rows(dim), rank=ranking(signed))

and the export line in ``fprune/__init__.py``: ``from fprune.unstructured import
rowwise_unstructured``. Scores that come from elsewhere (a saliency computed with
``torch.func``) need no new function at all: ``select(scores, amount, scope=...)``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Union

import torch

from fprune import _amount, _distributed, _inputs, _select, _tree
from fprune._types import Masks, Scores

__all__ = [
    "select",
    "select_inputs",
    "given_scores",
    "ranking",
    "Each",
    "EACH",
    "Global",
    "Channels",
    "Rows",
    "NM",
    "Scope",
]

Rank = str  # "value" or "magnitude"
_RANKS = ("value", "magnitude")
_NORMS = {"l1": 1.0, "l2": 2.0}
Reduce = Union[int, float, str, Callable[[torch.Tensor, List[int]], torch.Tensor], None]


# ---------------------------------------------------------------------------------------------
# Scopes


@dataclass(frozen=True)
class Each:
    """Every leaf on its own: ``amount`` of each leaf's remaining entries are pruned."""


#: The per-leaf scope.
EACH = Each()


@dataclass(frozen=True)
class Global:
    """All selected leaves in one ranking: ``amount`` of all their remaining entries are pruned.

    Args:
        normalize: ``None``/``False`` (rank the scores as they are), ``"l1"``, ``"l2"`` (or
            ``True`` for ``"l2"``): divide each leaf's scores by their norm over the entries
            it still keeps before the ranking (every leaf then has norm 1; a leaf of many
            entries has smaller normalized scores than a leaf of few).
    """

    normalize: Union[bool, str, None] = None

    def __post_init__(self) -> None:
        _check_normalize(self.normalize)


@dataclass(frozen=True)
class Channels:
    """Per leaf, the channels along ``dim`` (slices ``leaf.select(dim, c)``) are pruned whole.

    ``amount`` counts channels: a channel is alive while prior masks keep any of its entries.

    Args:
        dim: the dim that indexes channels (``0``: output channels of conv/linear weights).
        reduce: how a channel's score comes from its entries' scores: a norm order as
            ``torch.norm``'s ``p`` (a number, ``inf``, ``-inf``, ``'fro'``, ``'nuc'``), or a
            callable ``(scores, other_dims) -> channel_scores``. A score function may also give
            one score per channel directly (a 1-d tensor of length ``leaf.shape[dim]``), which
            is used as it is.
    """

    dim: int
    reduce: Reduce = 2

    def __post_init__(self) -> None:
        reduce = self.reduce
        if reduce is None or callable(reduce) or isinstance(reduce, str):
            if isinstance(reduce, str) and reduce not in ("fro", "nuc"):
                raise ValueError(
                    f"Expected reduce to be a norm order (a number, inf, -inf, 'fro', 'nuc') or a "
                    f"callable, got {reduce!r}."
                )
            return
        if isinstance(reduce, bool) or not isinstance(reduce, numbers.Real):
            raise TypeError(
                f"Expected reduce to be a norm order (a number, inf, -inf, 'fro', 'nuc') or a "
                f"callable, got {reduce!r}."
            )


@dataclass(frozen=True)
class Rows:
    """Per leaf, every index along ``dim`` is its own group (the slice ``leaf.select(dim, r)``).

    Each slice loses ``amount`` of its own remaining entries (a fraction: ``round(amount *
    remaining)``; an int: that count in every slice).
    """

    dim: int = 0


@dataclass(frozen=True)
class NM:
    """Per leaf, every group of ``m`` consecutive entries along ``dim`` keeps its ``n`` highest.

    Entries that prior masks pruned stay pruned: a group keeps ``min(n, alive)``. The size of
    a leaf along ``dim`` must be a multiple of ``m``. Takes no ``amount`` (pass ``None``).
    """

    n: int
    m: int
    dim: int = -1

    def __post_init__(self) -> None:
        for name, value in (("n", self.n), ("m", self.m)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"Expected {name} to be an int, got {value!r}.")
        if self.m < 1:
            raise ValueError(f"Expected m >= 1 (the group size), got m={self.m}.")
        if not 0 <= self.n <= self.m:
            raise ValueError(
                f"Expected 0 <= n <= m (n entries kept in every group of m), got n={self.n}, "
                f"m={self.m}."
            )


Scope = Union[Each, Global, Channels, Rows, NM]


# ---------------------------------------------------------------------------------------------
# Entry points


@torch.no_grad()
def select(
    scores: Scores,
    amount: Any,
    *,
    scope: Scope = EACH,
    rank: Rank = "value",
    masks: Masks = None,
    where: _tree.Where = None,
) -> Masks:
    """Keep-masks that prune the lowest ``scores`` within ``scope``.

    Args:
        scores: a pytree of real tensors, higher = more important (any sign).
        amount: a float in [0, 1] (a fraction of the remaining entries, channels or slice
            entries of the scope, counted with Python's ``round``), an int (a count), or a
            0-dim float tensor; ``None`` for :class:`NM`.
        scope: :data:`EACH` (default), :class:`Global`, :class:`Channels`, :class:`Rows` or
            :class:`NM`.
        rank: ``"value"`` (signed: the lowest value is pruned first) or ``"magnitude"``
            (``|score|``).
        masks: prior masks; what they pruned stays pruned and ``amount`` is relative to the rest.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune; the others keep their
            prior mask (or all True).

    Returns:
        A pytree like ``scores`` of ``torch.bool`` masks (``True`` = kept).

    Raises:
        TypeError / ValueError / IndexError: bad ``amount``, ``scope``, ``rank``, trees or dims.

    Example:
        >>> import torch, fprune
        >>> s = {"w": torch.tensor([[3.0, -1.0, 2.0, -5.0], [0.5, 0.0, 1.0, 4.0]])}
        >>> fprune.select.select(s, 0.5)["w"]                # signed: -5 and -1 go first
        tensor([[ True, False,  True, False],
                [False, False,  True,  True]])
        >>> fprune.select.select(s, 0.5, rank="magnitude", scope=fprune.select.Rows(0))["w"]
        tensor([[ True, False, False,  True],
                [False, False,  True,  True]])
        >>> fprune.select.select(s, None, scope=fprune.select.NM(1, 2))["w"]
        tensor([[ True, False,  True, False],
                [ True, False, False,  True]])
    """
    _check_scope(scope)
    inputs = _inputs.gather(
        scores, amount, None, masks, where, argname="scores", check_amount=not isinstance(scope, NM)
    )
    return select_inputs(inputs, given_scores(inputs), amount, scope, rank=rank)


def select_inputs(
    inputs: _inputs.Inputs,
    score: Callable[[int], torch.Tensor],
    amount: Any,
    scope: Scope,
    *,
    rank: Rank = "value",
) -> Masks:
    """The selection for validated arguments: what every built-in mask function calls.

    Args:
        inputs: the checked arguments (:func:`fprune._inputs.gather`).
        score: ``score(i)`` is leaf ``i``'s score tensor (the leaf's shape; for
            :class:`Channels`, a 1-d tensor of channel scores is accepted too). It is called
            once per leaf that is pruned, in leaf order, after every check has passed.
        amount: as in :func:`select`.
        scope: as in :func:`select`.
        rank: ``"value"`` or ``"magnitude"``.

    Returns:
        The mask tree, shaped like ``inputs.params``.
    """
    _check_scope(scope)
    _distributed.reject("This selection", inputs.params.leaves, inputs.scores, inputs.prior)
    source = _source(rank)
    if isinstance(scope, NM):
        if amount is not None:
            raise ValueError(
                f"The NM scope keeps n={scope.n} of every {scope.m} entries and takes no amount; "
                f"expected amount=None, got {amount!r}."
            )
        amounts: List[Any] = [0 if c else None for c in inputs.chosen]
    else:
        amounts = [amount if c else None for c in inputs.chosen]
    if isinstance(scope, Global):
        new = _global(inputs, score, amount, scope, source)
    elif isinstance(scope, Each):
        new = _each(inputs, score, amounts, source)
    elif isinstance(scope, Channels):
        new = _channels(inputs, score, amounts, scope, source)
    else:
        new = _grouped(inputs, score, amounts, scope, source)
    return _inputs.finish(inputs, new)


def given_scores(inputs: _inputs.Inputs) -> Callable[[int], torch.Tensor]:
    """The usual score function: ``importance_scores`` where given, else the params themselves."""

    def score(i: int) -> torch.Tensor:
        given = inputs.scores[i]
        return inputs.params.leaves[i] if given is None else given

    return score


def ranking(signed: bool) -> Rank:
    """``rank=`` of a method's ``signed=`` flag: ``"value"`` when signed, else ``"magnitude"``."""
    if not isinstance(signed, bool):
        raise TypeError(f"Expected signed to be a bool, got {signed!r}.")
    return "value" if signed else "magnitude"


# ---------------------------------------------------------------------------------------------
# Checks


def _check_scope(scope: Any) -> None:
    if not isinstance(scope, (Each, Global, Channels, Rows, NM)):
        raise TypeError(
            f"Expected scope to be one of fprune.select's scopes (EACH, Global(), Channels(dim), "
            f"Rows(dim), NM(n, m)), got {scope!r}."
        )


def _source(rank: Any):
    if rank not in _RANKS:
        raise ValueError(f"Expected rank to be 'value' or 'magnitude', got {rank!r}.")
    return _select.MAGNITUDE if rank == "magnitude" else None


def _check_normalize(normalize: Any) -> Optional[float]:
    if normalize is None or normalize is False:
        return None
    if normalize is True:
        return _NORMS["l2"]
    if isinstance(normalize, str) and normalize in _NORMS:
        return _NORMS[normalize]
    raise ValueError(f"Expected normalize to be False, True, 'l1' or 'l2', got {normalize!r}.")


# ---------------------------------------------------------------------------------------------
# The scopes


# Per-leaf selections are handed to the engine in batches of at most this many entries (or one
# leaf), so that scores made on the fly (random draws) are not all held at once.
_BATCH = 1 << 24


def _prune_each(items: list, traced: bool) -> list:
    """``_select.prune_lowest_each`` over ``(numel, key_fn, k, device)`` items, batched."""
    keeps: list = []
    start = 0
    while start < len(items):
        stop, total, device = start, 0, items[start][3]
        while stop < len(items) and items[stop][3] == device and (stop == start or total + items[stop][0] <= _BATCH):
            total += items[stop][0]
            stop += 1
        batch = items[start:stop]
        keeps += _select.prune_lowest_each(
            [(numel, key_fn) for numel, key_fn, _, _ in batch],
            [k for _, _, k, _ in batch],
            traced=traced,
            device=device,
        )
        start = stop
    return keeps


def _each(inputs, score, amounts, source) -> Dict[int, torch.Tensor]:
    leaves, traced = inputs.params.leaves, inputs.traced
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    sizes = [leaves[i].numel() for i in chosen]
    alive = _inputs.remaining_all([inputs.prior[i] for i in chosen], sizes, traced)
    ks = [
        _amount.count(amounts[i], a, "parameters", inputs.name(i)) + (n - a)
        for i, n, a in zip(chosen, sizes, alive)
    ]
    # Pass the leaves to the engine in batches as their scores are made, so that scores made
    # on the fly are dropped once their batch is selected.
    keeps: list = []
    pending: list = []
    pending_size = 0
    for i, n, k in zip(chosen, sizes, ks):
        values = score(i)
        key_fn = _select.keys(values, inputs.prior[i], _select.key_dtype([values]), source)
        pending.append((n, key_fn, k, leaves[i].device))
        pending_size += n
        if pending_size >= _BATCH:
            keeps += _prune_each(pending, traced)
            pending, pending_size = [], 0
    keeps += _prune_each(pending, traced)
    return {i: keep.view(leaves[i].shape) for i, keep in zip(chosen, keeps)}


def _global(inputs, score, amount, scope: Global, source) -> Dict[int, torch.Tensor]:
    norm = _check_normalize(scope.normalize)
    leaves = inputs.params.leaves
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    if not chosen:
        return {}
    sizes = [leaves[i].numel() for i in chosen]
    alive = _inputs.remaining_all([inputs.prior[i] for i in chosen], sizes, inputs.traced)
    total_alive = sum(alive)
    pruned_before = sum(sizes) - total_alive
    k = _amount.count(amount, total_alive, "parameters", inputs.argname) + pruned_before
    values = [score(i) for i in chosen]
    dtype = _select.key_dtype(values)
    sources = []
    for i, v, n in zip(chosen, values, sizes):
        transform = source if norm is None else _normalized(v, inputs.prior[i], norm, dtype, source)
        sources.append((n, _select.keys(v, inputs.prior[i], dtype, transform)))
    device = leaves[chosen[0]].device
    keeps = _select.prune_lowest(sources, k, traced=inputs.traced, device=device)
    return {i: keep.view(leaves[i].shape) for i, keep in zip(chosen, keeps)}


def _normalized(values, keep, norm: float, key_dtype: torch.dtype, source):
    """One leaf's scores divided by their norm over its kept entries, chunk by chunk."""
    kept = values if keep is None else torch.where(keep, values, torch.zeros((), dtype=values.dtype))
    scale = torch.linalg.vector_norm(kept.to(torch.float64), ord=norm)
    work = torch.float32 if key_dtype == torch.int32 else torch.float64
    scale = torch.clamp(scale, min=torch.finfo(work).tiny).to(work)
    if source is None:
        return lambda chunk: chunk.to(work) / scale
    return lambda chunk: chunk.to(work).abs() / scale


def _channels(inputs, score, amounts, scope: Channels, source) -> Dict[int, torch.Tensor]:
    flat = inputs.params
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    dims = {
        i: _inputs.check_dim(
            scope.dim,
            flat.leaves[i],
            f" at {inputs.name(i)}",
            "leave such leaves out with where=lambda name, p: p.dim() > 1.",
        )
        for i in chosen
    }
    alive_channels, sizes = [], []
    for i in chosen:
        p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
        others = [x for x in range(p.dim()) if x != d]
        alive_channels.append(None if prior is None else prior.any(dim=others))
        sizes.append(p.shape[d])
    alive = _inputs.remaining_all(alive_channels, sizes, inputs.traced)
    items = []
    for i, channels, a, live in zip(chosen, sizes, alive, alive_channels):
        d = dims[i]
        name = f"{inputs.name(i)} along dim {d}"
        k = _amount.count(amounts[i], a, "channels", name) + (channels - a)
        items.append((i, channels, k, live))
    pending: list = []
    for i, channels, k, live in items:
        p, d = flat.leaves[i], dims[i]
        values = _channel_scores(score(i), p, d, scope.reduce, inputs.name(i))
        key_fn = _select.keys(values, live, _select.key_dtype([values]), source)
        pending.append((channels, key_fn, k, p.device))
    keeps = _prune_each(pending, inputs.traced)
    new = {}
    for (i, channels, _, _), keep in zip(items, keeps):
        p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
        shape = [1] * p.dim()
        shape[d] = channels
        keep = keep.view(shape).expand(p.shape)
        new[i] = keep.contiguous() if prior is None else keep & prior
    return new


def _channel_scores(values: torch.Tensor, p: torch.Tensor, d: int, reduce: Reduce, name: str):
    """One score per channel: given directly (1-d, one per channel) or reduced from the entries'."""
    if values.dim() == 1 and values.shape[0] == p.shape[d]:
        return values
    if values.shape != p.shape:
        raise ValueError(
            f"Expected the scores of {name} to have its shape {tuple(p.shape)} or one score per "
            f"channel ({p.shape[d]},), got {tuple(values.shape)}."
        )
    if reduce is None:
        raise ValueError(
            f"Channels(reduce=None) takes one score per channel, shape ({p.shape[d]},); got the "
            f"full shape {tuple(values.shape)} for {name}."
        )
    others = [x for x in range(p.dim()) if x != d]
    if callable(reduce):
        return reduce(values, others)
    return torch.norm(values, p=reduce, dim=others)


def _grouped(inputs, score, amounts, scope: Union[Rows, NM], source) -> Dict[int, torch.Tensor]:
    """Rows and NM: one tensor program per leaf, a stable sort inside every group."""
    flat = inputs.params
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    dims = {i: _inputs.check_axis(scope.dim, flat.leaves[i], f" at {inputs.name(i)}") for i in chosen}
    if isinstance(scope, NM):
        for i in chosen:
            size = flat.leaves[i].shape[dims[i]]
            if size % scope.m:
                raise ValueError(
                    f"Expected the size of {inputs.name(i)} along dim {scope.dim}, {size}, to be "
                    f"a multiple of m={scope.m} (groups of m consecutive entries)."
                )
    # Every leaf's keys as (groups, group size), and how many to prune in each group.
    plans = []
    for i in chosen:
        p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
        if isinstance(scope, NM):
            moved = p.movedim(d, -1).shape
            shape = (*moved[:-1], moved[-1] // scope.m, scope.m)
            live = None if prior is None else prior.movedim(d, -1).reshape(shape)
            alive = torch.full(shape[:-1], scope.m, device=p.device) if live is None else live.sum(-1)
            k = scope.m - torch.clamp(alive, max=scope.n)
        else:
            moved = p.movedim(d, 0).shape
            shape = (moved[0], p.numel() // moved[0] if moved[0] else 0)
            live = None if prior is None else prior.movedim(d, 0).reshape(shape)
            size = shape[1]
            alive = torch.full(shape[:1], size, device=p.device) if live is None else live.sum(-1)
            k = _amount.count(amounts[i], alive, "parameters", inputs.name(i)) + (size - alive)
        plans.append((i, d, shape, live, alive, k))
    if not isinstance(scope, NM):
        _check_row_counts(inputs, amounts, plans, scope)
    new = {}
    for i, d, shape, live, _, k in plans:
        p = flat.leaves[i]
        values = score(i)
        dtype = _select.key_dtype([values])
        if isinstance(scope, NM):
            keys = _select.keys(values.movedim(d, -1).reshape(shape), live, dtype, source)
        else:
            keys = _select.keys(values.movedim(d, 0).reshape(shape), live, dtype, source)
        keep = _lowest_in_groups(keys(0, _numel(shape)).view(shape), k)
        if isinstance(scope, NM):
            keep = keep.reshape(p.movedim(d, -1).shape).movedim(-1, d)
        else:
            keep = keep.reshape(p.movedim(d, 0).shape).movedim(0, d)
        new[i] = keep.contiguous()
    return new


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _check_row_counts(inputs, amounts, plans, scope: Rows) -> None:
    """An int amount above what a row has left raises (eager code only; one host read)."""
    if inputs.traced:
        return
    checks = [
        (i, alive.min()) for i, _, _, _, alive, _ in plans
        if isinstance(amounts[i], numbers.Integral) and alive.numel()
    ]
    if not checks:
        return
    smallest = torch.stack([m.cpu() for _, m in checks]).tolist()
    for (i, _), least in zip(checks, smallest):
        if amounts[i] > least:
            raise ValueError(
                f"amount={amounts[i]} should be smaller than the number of parameters to "
                f"prune={least} in a slice of {inputs.name(i)} along dim {scope.dim}"
            )


def _lowest_in_groups(keys: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep-masks pruning the ``k[g]`` lowest keys of every group ``keys[g]`` (last dim)."""
    order = torch.argsort(keys, dim=-1, stable=True)
    positions = torch.arange(keys.shape[-1], device=keys.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(-1, order, positions)
    return ranks >= k.unsqueeze(-1)
