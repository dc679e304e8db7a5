"""The selection layer: scores in, masks out, with the scope as a parameter.

Every mask function of fprune is a *score function* over this layer: it says how important
each entry is, and :func:`select` (or :func:`select_inputs`, its form for validated arguments)
turns the scores into ``torch.bool`` keep-masks. The layer guarantees the selection rule:

* **count-exact**: exactly the computed count is pruned, even when scores tie;
* **lowest first**: the lowest scores are pruned first; ties are broken by position (the
  earlier entry is pruned first: row-major order inside a tensor, optree's flatten order across
  leaves, a dict's keys sorted); ``-0.0`` equals ``0.0``; NaN ranks above ``+inf``;
* **prior masks** (``masks=``): entries they pruned rank below everything, stay pruned and are
  counted; a fraction ``amount`` is relative to what they left (``round(amount * remaining)``,
  :func:`fprune._amount.round_count`), and a *count rule* ``amount(remaining, size) -> count``
  gets what they left and returns the count (the pruners' "prune until a fraction of the whole
  is pruned");
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

Backends. One process is the engine of :mod:`fprune._select`. Sharded leaves (``DTensor``s:
FSDP2, tensor parallelism) go to the distributed backend, :mod:`fprune.distributed`, chosen here
by the scope: :func:`select_inputs` is the one place that looks at the leaves' type, so the
methods, the pruners and the scores never do, and a new method is sharded as it is (its score
function runs on DTensors, since torch ops on DTensors give DTensors). The backend sits under this
module, beside the engine; nothing above this module imports it.

Adding a method takes one score function and one export line. The method checks its arguments
with :func:`gather_inputs` (which names every leaf in its messages, and on DTensors makes every
rank raise together), then hands :func:`select_inputs` a callable ``score(i) -> tensor`` giving
leaf ``i``'s scores (called once per selected leaf, in leaf order, after every check has passed)
and a scope. These two are the semi-public pieces of this module, for writing methods. This is
``rowwise_unstructured``, the worked example, in full::

    def rowwise_unstructured(params, amount, *, dim=0, importance_scores=None, masks=None,
                             where=None, signed=False):
        inputs = gather_inputs(params, amount, importance_scores, masks, where)
        return select_inputs(inputs, given_scores(inputs), amount, Rows(dim), rank=ranking(signed))

and its export lines in ``fprune/methods/__init__.py`` and ``fprune/__init__.py``.
Scores that come from elsewhere (a saliency computed with
``torch.func``) need no new function at all: ``select(scores, amount, scope=...)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from fprune import _amount, _groups, _inputs, _select, _torch, _tree, _warn
from fprune._types import Masks, Params, Scores
from fprune._warn import NaNScoresWarning
from fprune.distributed import _backend as _sharded

__all__ = [
    "select",
    "gather_inputs",
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
    "LayerCollapseWarning",
    "NaNScoresWarning",
]

Rank = str  # "value" or "magnitude"
_RANKS = ("value", "magnitude")
_NORMS = {"l1": 1.0, "l2": 2.0}
Reduce = _groups.Reduce


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


@dataclass(frozen=True)
class Channels:
    """Per leaf, the channels along ``dim`` (slices ``leaf.select(dim, c)``) are pruned whole.

    ``amount`` counts channels: a channel is alive while prior masks keep any of its entries.
    ``rank`` applies to the channel scores (norms are never negative: both ranks agree).

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
                f"Expected 0 <= n <= m (n entries kept in every group of m), got n={self.n}, m={self.m}."
            )


Scope = Each | Global | Channels | Rows | NM


class LayerCollapseWarning(UserWarning):
    """An eager global selection pruned every remaining entry of a leaf (see :class:`Global`).

    Silence it with ``warnings.filterwarnings("ignore", category=LayerCollapseWarning)``.
    """


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
    params: Params = None,
) -> Masks:
    """Keep-masks that prune the lowest ``scores`` within ``scope``.

    Args:
        scores: a pytree of real tensors, higher = more important (any sign).
        amount: a float in [0, 1] (a fraction of the remaining entries, channels or slice
            entries of the scope, counted with Python's ``round``), an int (a count), a 0-dim
            float tensor, or a count rule ``amount(remaining, size) -> count`` (an int, checked
            as an int amount is, or an integer tensor, clamped to ``[0, remaining]``);
            ``None`` for :class:`NM`.
        scope: :data:`EACH` (default), :class:`Global`, :class:`Channels`, :class:`Rows` or
            :class:`NM`.
        rank: ``"value"`` (signed: the lowest value is pruned first) or ``"magnitude"``
            (``|score|``).
        masks: prior masks; what they pruned stays pruned and ``amount`` is relative to the rest.
        where: ``where(name, tensor) -> bool`` picks the leaves to prune; the others keep their
            prior mask (or all True).
        params: the tree the masks are shaped like, when it is not ``scores`` itself. Then
            ``scores`` has the structure of ``params`` (or, for a dict, the part of it that is
            pruned) and each score leaf has its param's shape or, for :class:`Channels`, one
            score per channel (a 1-d tensor of length ``param.shape[dim]``, used as it is).
            ``where`` and messages then see ``params``.

    Returns:
        A pytree like ``scores`` (like ``params`` when given) of ``torch.bool`` masks
        (``True`` = kept).

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
        >>> per_channel = {"w": torch.tensor([0.3, -2.0])}      # one score per row: prune row 1
        >>> fprune.select.select(per_channel, 1, scope=fprune.select.Channels(0), params=s)["w"]
        tensor([[ True,  True,  True,  True],
                [False, False, False, False]])
    """
    _check_scope(scope)
    check_amount = not isinstance(scope, NM)
    if params is None:
        inputs = gather_inputs(
            scores, amount, None, masks, where, argname="scores", check_amount=check_amount
        )
        return select_inputs(inputs, given_scores(inputs), amount, scope, rank=rank)
    inputs = gather_inputs(params, amount, None, masks, where, check_amount=check_amount)
    try:
        leaves = _align_scores(inputs, scores, scope)
    except (TypeError, ValueError) as error:
        _reject_everywhere(error, params, scores, masks)
        raise
    return select_inputs(inputs, leaves.__getitem__, amount, scope, rank=rank)


def _align_scores(inputs: _inputs.Inputs, scores: Any, scope: Scope) -> list:
    """``scores`` lined up with ``inputs.params``: an entry for every leaf that is pruned, with
    the param's shape (or one score per channel for :class:`Channels`)."""
    flat = _tree.flatten(scores, "scores")
    params = inputs.params
    if flat.spec == params.spec:
        leaves = list(flat.leaves)
    else:
        by_path = dict(zip(map(tuple, flat.paths), flat.leaves, strict=True))
        known = set(map(tuple, params.paths))
        for path in by_path:
            if path not in known:
                raise ValueError(
                    f"{_tree.describe('scores', path)} has no matching entry in params; expected "
                    f"the structure of params ({params.spec}) or a part of it, got {flat.spec}."
                )
        leaves = [by_path.get(tuple(path)) for path in params.paths]
    for i, (leaf, p, chosen) in enumerate(zip(leaves, params.leaves, inputs.chosen, strict=True)):
        if not chosen:
            continue
        where = _tree.describe("scores", params.paths[i])
        if leaf is None:
            raise ValueError(f"scores has no entry for {inputs.name(i)}, which is to be pruned.")
        if leaf.is_complex():
            raise TypeError(f"Expected {where} to be a real tensor, got dtype {leaf.dtype}.")
        per_channel = isinstance(scope, Channels) and leaf.dim() == 1 and p.dim() > 1
        if leaf.shape != p.shape and not per_channel:
            raise ValueError(
                f"Expected {where} to have the shape of {inputs.name(i)}, {tuple(p.shape)}"
                + (" or one score per channel" if isinstance(scope, Channels) else "")
                + f", got {tuple(leaf.shape)}."
            )
    return leaves


def gather_inputs(
    params: Params,
    amount: Any,
    importance_scores: Scores = None,
    masks: Masks = None,
    where: _tree.Where = None,
    *,
    argname: str = "params",
    check_amount: bool = True,
) -> _inputs.Inputs:
    """Check a mask function's arguments, before any work: the first half of a method.

    Semi-public, with :func:`select_inputs`: the pair a mask function is written with (see the
    module docstring). Every message names the leaf (``params['fc.weight']``).

    Args:
        params: the pytree the masks are shaped like.
        amount: as in :func:`select`, or per-leaf amounts (a dict keyed like a flat params
            dict, or a pytree shaped like params, ``None``: skip).
        importance_scores: ``None``, or a pytree like ``params`` (checked: shapes, real dtype).
        masks: prior masks, a pytree like ``params`` (checked).
        where: ``where(name, tensor) -> bool`` picks the leaves to prune.
        argname: how messages name the tree.
        check_amount: ``False`` leaves ``amount`` to the caller (a scope that takes none).

    Returns:
        The checked arguments, one entry per leaf (``inputs.params``, ``inputs.scores``,
        ``inputs.prior``, ``inputs.chosen``), for :func:`select_inputs`.

    Raises:
        TypeError / ValueError: bad trees, shapes, dtypes or ``amount``. With DTensor leaves,
        every rank of the mesh raises (the others say another rank rejected its inputs).
    """
    try:
        return _inputs.gather(
            params, amount, importance_scores, masks, where, argname=argname, check_amount=check_amount
        )
    except (TypeError, ValueError, IndexError) as error:
        _reject_everywhere(error, params, importance_scores, masks)
        raise


def _reject_everywhere(error: BaseException, *trees: Any) -> None:
    """An error found before the selection: with DTensor leaves, every rank raises (sharded
    backend); otherwise the caller raises it."""
    if _sharded.holds_dtensor(*trees):
        _sharded.reject(error, *trees)


def select_inputs(
    inputs: _inputs.Inputs,
    score: Callable[[int], Any],
    amount: Any,
    scope: Scope,
    *,
    rank: Rank = "value",
) -> Masks:
    """The selection for validated arguments: what every built-in mask function calls.

    Semi-public, with :func:`gather_inputs` (the module docstring has a worked example).
    Sharded inputs (DTensor leaves) go to the distributed backend, chosen here by the scope
    (:mod:`fprune.distributed`): a score function written for one process is sharded as it is.

    Args:
        inputs: the checked arguments (:func:`gather_inputs`).
        score: ``score(i)`` is leaf ``i``'s score tensor (the leaf's shape; for
            :class:`Channels`, a 1-d tensor of channel scores is accepted too). It is called
            once per leaf that is pruned, in leaf order, after every check has passed. On
            DTensor leaves it may return a DTensor placed like the leaf (what torch ops on the
            params give) or a plain tensor of the full shape made alike on every rank (then
            each rank keeps its part). Two optional members serve the sharded backend:
            ``score.at(i, positions)``, leaf ``i``'s scores at flat (row-major) positions of
            the full leaf (int64), so that a rank computes only its own entries (seeded random
            draws); and ``score.fingerprint()``, a string the ranks must agree on (a
            generator's state), compared before anything is selected.
        amount: as in :func:`select`.
        scope: as in :func:`select`.
        rank: ``"value"`` or ``"magnitude"``.

    Returns:
        The mask tree, shaped like ``inputs.params``.

    Example:
        >>> import torch, fprune
        >>> from fprune.select import EACH, gather_inputs, select_inputs
        >>> inputs = gather_inputs({"w": torch.tensor([1.0, -3.0, 2.0])}, 1, None, None, None)
        >>> squared = lambda i: inputs.params.leaves[i] ** 2      # a score function
        >>> select_inputs(inputs, squared, 1, EACH)["w"]
        tensor([False,  True,  True])
    """
    _check_scope(scope)
    source = _source(rank)
    if _sharded.any_dtensor(inputs.params.leaves, inputs.scores, inputs.prior):
        return _select_sharded(inputs, score, amount, scope, rank, source)
    amounts = _leaf_amounts(inputs, amount, scope)
    tensors = [a for a in amounts if isinstance(a, torch.Tensor)]
    if tensors and not inputs.traced and _select.is_traced(tensors):
        inputs = inputs._replace(traced=True)
    score = _inputs.NaNWatch(inputs, score)  # eager: warns once if the ranked scores hold NaN
    if isinstance(scope, Global):
        new = _global(inputs, score, amount, scope, source)
    elif isinstance(scope, Each):
        new = _each(inputs, score, amounts, source)
    elif isinstance(scope, Channels):
        new = _channels(inputs, score, amounts, scope, source)
    else:
        new = _grouped(inputs, score, amounts, scope, source)
    score.warn()
    return _inputs.finish(inputs, new)


def _leaf_amounts(inputs: _inputs.Inputs, amount: Any, scope: Scope) -> list[Any]:
    """The scope's checks of ``amount``; one amount per leaf (``None``: not pruned)."""
    if isinstance(scope, NM):
        if amount is not None:
            raise ValueError(
                f"The NM scope keeps n={scope.n} of every {scope.m} entries and takes no amount; "
                f"expected amount=None, got {amount!r}."
            )
        return [0 if c else None for c in inputs.chosen]
    if isinstance(scope, Global) and _inputs.is_per_leaf(amount):
        raise TypeError(
            f"Expected one amount for the Global scope (a single ranking over all leaves), "
            f"got per-leaf amounts {amount!r}."
        )
    return _inputs.leaf_amounts(inputs, amount)


def _select_sharded(
    inputs: _inputs.Inputs,
    score: Callable[[int], torch.Tensor],
    amount: Any,
    scope: Scope,
    rank: Rank,
    source: Any,
) -> Masks:
    """The distributed backend, by scope: the same selection over DTensor leaves."""
    described = _sharded.stable_repr(scope)
    call = _sharded.prepare(
        inputs, score, amount, described, rank, lambda checked: _leaf_amounts(checked, amount, scope)
    )
    if isinstance(scope, Global):
        norm = _check_normalize(scope.normalize)
        new = _sharded.global_(call, amount, norm, scope.min_keep, source)
    elif isinstance(scope, Each):
        new = _sharded.each(call, source)
    elif isinstance(scope, Channels):
        new = _sharded.channels(call, scope.dim, scope.reduce, source)
    elif isinstance(scope, Rows):
        new = _sharded.rows(call, scope.dim, source)
    else:
        new = _sharded.n_m(call, scope.n, scope.m, scope.dim, source)
    return _sharded.finish(call, new)


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


def _source(rank: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    if rank not in _RANKS:
        raise ValueError(f"Expected rank to be 'value' or 'magnitude', got {rank!r}.")
    return _select.MAGNITUDE if rank == "magnitude" else None


def _check_normalize(normalize: Any) -> float | None:
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
    """``_select.prune_lowest_each`` over ``(numel, key_fn, k, device, scores)`` items, batched
    by device; the traced path wherever the call is traced or a score tensor is (a score
    function may make batched scores from unbatched params: a batched seed under ``vmap``)."""
    keeps: list = []
    start = 0
    while start < len(items):
        device = items[start][3]
        stop, total = start, 0
        while (
            stop < len(items)
            and items[stop][3] == device
            and (stop == start or total + items[stop][0] <= _BATCH)
        ):
            total += items[stop][0]
            stop += 1
        batch = items[start:stop]
        keeps += _select.prune_lowest_each(
            [(numel, key_fn) for numel, key_fn, _, _, _ in batch],
            [k for _, _, k, _, _ in batch],
            traced=traced or _select.is_traced([values for *_, values in batch]),
            device=device,
        )
        start = stop
    return keeps


def _each(
    inputs: _inputs.Inputs, score: Callable[[int], torch.Tensor], amounts: list[Any], source: Any
) -> dict[int, torch.Tensor]:
    leaves, traced = inputs.params.leaves, inputs.traced
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    # Small leaves without prior masks and with a Python amount go in runs (see _LeafRuns); the
    # others, one by one, to the engine.
    fast = [] if traced else [_in_runs(leaves[i], inputs.prior[i], amounts[i]) for i in chosen]
    slow = [i for i, f in zip(chosen, fast or [False] * len(chosen), strict=True) if not f]
    sizes = {i: leaves[i].numel() for i in slow}
    alive = dict(
        zip(
            slow,
            _inputs.remaining_all([inputs.prior[i] for i in slow], list(sizes.values()), traced),
            strict=True,
        )
    )
    ks: dict[int, Any] = {}
    counted: dict[tuple, Any] = {}
    for i in chosen:  # in leaf order, so that the first leaf whose count is wrong is named
        a = amounts[i]
        if i in sizes:
            n, left = sizes[i], alive[i]
            ks[i] = _amount.count(a, left, "parameters", inputs.name(i), size=n) + (n - left)
            continue
        n = leaves[i].numel()
        signature = (isinstance(a, numbers.Integral), a, n)
        k = counted.get(signature)
        if k is None:
            k = counted[signature] = _amount.count(a, n, "parameters", inputs.name(i), size=n)
        ks[i] = k
    new: dict[int, torch.Tensor] = {}
    rows = _LeafRuns(_each_keys(source), _each_masks(new))
    # Pass the leaves to the engine in batches as their scores are made, so that scores made
    # on the fly are dropped once their batch is selected.
    keeps: list = []
    pending: list = []
    done: list = []
    pending_size = 0
    for i in chosen:
        values = score(i)
        if i not in sizes and values.shape == leaves[i].shape:
            rows.add(i, values, ks[i])
            continue
        n = leaves[i].numel()
        key_fn = _select.keys(values, inputs.prior[i], _select.key_dtype([values]), source)
        pending.append((n, key_fn, ks[i], leaves[i].device, values))
        done.append(i)
        pending_size += n
        if pending_size >= _BATCH:
            keeps += _prune_each(pending, traced)
            pending, pending_size = [], 0
    keeps += _prune_each(pending, traced)
    for i, values in rows.finish():  # scores that a transform batched: the traced path
        key_fn = _select.keys(values, None, _select.key_dtype([values]), source)
        keeps += _prune_each([(leaves[i].numel(), key_fn, ks[i], leaves[i].device, values)], True)
        done.append(i)
    new.update((i, keep.view(leaves[i].shape)) for i, keep in zip(done, keeps, strict=True))
    return new


# ---------------------------------------------------------------------------------------------
# Runs: many small leaves selected together (eager code)

# Leaves of at most this many entries, without prior masks and with a Python amount, are
# selected in runs of alike leaves (one shape, score dtype and device, one count): their scores
# stacked (at most _RUN_ENTRIES entries per batch), their keys made, selected along rows and the
# masks split off in one op each. The masks and the tie-break are the engine's.
_RUN_MAX = 1 << 14
_RUN_ENTRIES = 1 << 18


def _in_runs(leaf: torch.Tensor, prior: torch.Tensor | None, amount: Any) -> bool:
    return (
        prior is None
        and isinstance(amount, numbers.Real)
        and not isinstance(amount, torch.Tensor)
        and 0 < leaf.numel() <= _RUN_MAX
    )


class _LeafRuns:
    """Per-leaf selections of many small leaves, batched: a row of keys per leaf.

    ``make_keys(values)`` turns a batch's score tensors (alike) into a ``(rows, n)`` key tensor;
    ``masks(indices, values, keep)`` makes the leaves' masks of the ``(rows, n)`` keep-mask once
    it is final. Rows whose ties at the threshold must be split by position are found with one
    host read for the whole call (:meth:`finish`), and only their batches are computed again.
    """

    def __init__(
        self,
        make_keys: Callable[[list, list], torch.Tensor],
        masks: Callable[[list, list, torch.Tensor], None],
    ) -> None:
        self.make_keys = make_keys
        self.masks = masks
        self.runs: dict[Any, list] = {}
        self.pending: list = []
        self.traced: list = []

    def add(self, i: int, values: torch.Tensor, k: int, shape: torch.Size | None = None) -> None:
        signature = (values.shape, values.dtype, values.device, k, shape)
        run = self.runs.get(signature)
        if run is None:
            run = self.runs[signature] = [[], [], k, max(1, _RUN_ENTRIES // max(1, values.numel()))]
        run[0].append(i)
        run[1].append(values)
        if len(run[0]) >= run[3]:
            self._flush(run)
            del self.runs[signature]

    def _flush(self, run: list) -> None:
        indices, values, k, _ = run
        if _select.is_traced(values):
            self.traced += zip(indices, values, strict=True)
            return
        key = self.make_keys(indices, values)
        keep = torch.empty(key.shape, dtype=torch.bool, device=key.device)
        threshold, split = _select.lowest_in_rows(key, k, keep)
        self.pending.append((indices, values, k, keep, threshold, split))

    def finish(self) -> list:
        """Select every run still open and settle the ties; returns the ``(index, values)`` of
        leaves whose scores a transform batched (for the traced path)."""
        for run in self.runs.values():
            self._flush(run)
        self.runs = {}
        splits = [p[5] for p in self.pending if p[5] is not None]
        flags = iter(torch.stack(splits).tolist() if splits else [])
        for indices, values, k, keep, threshold, split in self.pending:
            if split is not None and next(flags):
                _select.split_rows(self.make_keys(indices, values), threshold, k, keep)
            self.masks(indices, values, keep)
        self.pending = []
        return self.traced


def _each_keys(source: Any) -> Callable[[list, list], torch.Tensor]:
    def make(indices: list, values: list) -> torch.Tensor:
        stacked = torch.stack(values).reshape(len(values), -1)
        dtype = _select.key_dtype(values[:1])
        key = torch.empty(stacked.shape, dtype=dtype, device=stacked.device)
        _select.keys(stacked, None, dtype, source).into(0, stacked.numel(), key.view(-1))
        return key

    return make


def _each_masks(new: dict) -> Callable[[list, list, torch.Tensor], None]:
    def masks(indices: list, values: list, keep: torch.Tensor) -> None:
        new.update(zip(indices, keep.view(len(indices), *values[0].shape).unbind(0), strict=True))

    return masks


def _global(
    inputs: _inputs.Inputs, score: Callable[[int], torch.Tensor], amount: Any, scope: Global, source: Any
) -> dict[int, torch.Tensor]:
    norm = _check_normalize(scope.normalize)
    leaves, traced = inputs.params.leaves, inputs.traced
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    sizes = [leaves[i].numel() for i in chosen]
    alive = _inputs.remaining_all([inputs.prior[i] for i in chosen], sizes, traced)
    total_alive = sum(alive)
    # Counted even over no leaf at all: a count above what remains (0) raises, as it would for
    # empty leaves; a fraction of nothing is nothing.
    new = _amount.count(amount, total_alive, "parameters", inputs.argname, size=sum(sizes))
    if not chosen:
        return {}
    k = new + (sum(sizes) - total_alive)
    values = [score(i) for i in chosen]
    traced = traced or _select.is_traced(values)
    dtype = _select.key_dtype(values)
    transforms = [
        source if norm is None else _normalized(v, inputs.prior[i], norm, dtype, source)
        for i, v in zip(chosen, values, strict=True)
    ]
    device = leaves[chosen[0]].device
    protect: list[torch.Tensor | None] = [None] * len(chosen)
    if scope.min_keep is not None:
        protect, k = _floors(
            inputs, chosen, sizes, alive, values, transforms, dtype, k, scope, new, amount, traced
        )
    if traced or norm is not None or scope.min_keep is not None:
        spans = [(j, j + 1) for j in range(len(chosen))]
    else:
        spans = _stackable(chosen, values, inputs.prior)
    sources = []
    for a, b in spans:
        if b - a == 1:
            i = chosen[a]
            sources.append(
                (sizes[a], _select.keys(values[a], inputs.prior[i], dtype, transforms[a], protect[a]))
            )
        else:  # consecutive alike small leaves: one source over their stacked scores
            sources.append((sizes[a] * (b - a), _select.keys(torch.stack(values[a:b]), None, dtype, source)))
    keeps = _select.prune_lowest(sources, k, traced=traced, device=device)
    if not traced:
        _warn_collapse(inputs, chosen, alive, keeps, spans)
    out: dict[int, torch.Tensor] = {}
    for (a, b), keep in zip(spans, keeps, strict=True):
        if b - a == 1:
            out[chosen[a]] = keep.view(leaves[chosen[a]].shape)
        else:
            out.update(zip(chosen[a:b], keep.view(b - a, *values[a].shape).unbind(0), strict=True))
    return out


def _stackable(chosen: list[int], values: list[torch.Tensor], prior: list[torch.Tensor | None]) -> list:
    """Spans ``(a, b)`` of ``chosen``: runs of consecutive small leaves alike (shape, score dtype,
    device, no prior mask), or single leaves. A run is ranked as one source over its stacked
    scores, which keeps the order of the entries (the tie-break) and costs a copy of the scores
    of those small leaves (at most ``_RUN_MAX`` entries each) for the call."""
    spans, j, count = [], 0, len(chosen)
    while j < count:
        v, stop = values[j], j + 1
        if prior[chosen[j]] is None and 0 < v.numel() <= _RUN_MAX:
            shape, dtype, device = v.shape, v.dtype, v.device
            while (
                stop < count
                and prior[chosen[stop]] is None
                and values[stop].shape == shape
                and values[stop].dtype == dtype
                and values[stop].device == device
            ):
                stop += 1
        spans.append((j, stop))
        j = stop
    return spans


def _floors(
    inputs: _inputs.Inputs,
    chosen: list[int],
    sizes: list[int],
    alive: list[Any],
    values: list[torch.Tensor],
    transforms: list[Any],
    dtype: torch.dtype,
    k: Any,
    scope: Global,
    new: Any,
    amount: Any,
    traced: bool,
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
            f"amount={amount} asks for {new} entries but min_keep={floor_of} lets at most "
            f"{room - (sum(sizes) - sum(alive))} of the remaining {sum(alive)} be pruned."
        )
    protect = []
    limited = [j for j, (n, f) in enumerate(zip(sizes, floors, strict=True)) if f > 0 and n > 0]
    if limited:
        sources = [
            (sizes[j], _select.keys(values[j], inputs.prior[chosen[j]], dtype, transforms[j]))
            for j in limited
        ]
        device = inputs.params.leaves[chosen[limited[0]]].device
        eligible = _select.prune_lowest_each(
            sources, [prunable[j] for j in limited], traced=traced, device=device
        )
        by_leaf = dict(zip(limited, eligible, strict=True))  # True where kept by its own leaf: protected
    else:
        by_leaf = {}
    for j in range(len(chosen)):
        protect.append(by_leaf.get(j))
    return protect, k


def _warn_collapse(
    inputs: _inputs.Inputs,
    chosen: list[int],
    alive: list[Any],
    keeps: list[torch.Tensor],
    spans: list[tuple[int, int]],
) -> None:
    """Warn when the call pruned every remaining entry of a leaf (one host read, two at most).

    ``keeps[s]`` is the mask of span ``spans[s]`` of ``chosen`` (one leaf, or a stack of alike
    leaves without prior masks, whose rows are checked with one ``any``)."""
    candidates, rows = [], []
    for (a, b), keep in zip(spans, keeps, strict=True):
        if b - a > 1:
            rows.append((a, keep.view(b - a, -1).view(torch.uint8).amax(1)))  # any(1), 20x faster
        elif alive[a] > 0:
            candidates.append((a, keep))
    emptied, parts = [], [r for _, r in rows]
    if candidates:
        # A prefix of each leaf first: almost always it holds a kept entry, which settles the leaf.
        parts.append(torch.stack([keep[:4096].any() for _, keep in candidates]))
    if parts:
        found = torch.cat(parts).tolist()
        at = 0
        for a, r in rows:
            n = r.numel()
            emptied += [a + x for x, hit in enumerate(found[at : at + n]) if not hit]
            at += n
        suspects = [(j, keep) for (j, keep), hit in zip(candidates, found[at:], strict=True) if not hit]
        if suspects:
            whole = _any_each([keep for _, keep in suspects])
            emptied += [j for (j, _), hit in zip(suspects, whole, strict=True) if not hit]
    if emptied:
        names = [inputs.name(chosen[j]) for j in sorted(emptied)]
        _warn.warn(  # at the caller's line
            f"global pruning removed every remaining entry of {', '.join(names)} (layer "
            f"collapse); pass min_keep= (a count or a fraction of entries kept per leaf) to "
            f"prevent it.",
            LayerCollapseWarning,
        )


def _any_each(tensors: list[torch.Tensor]) -> list[bool]:
    """``[bool(t.any()) for t in tensors]`` with one host read per device."""
    return [bool(found) for found in _read_each([t.any() for t in tensors])]


def _read_each(scalars: list[torch.Tensor]) -> list:
    """The values of 0-dim tensors as Python numbers, with one host read per device."""
    result: list = [None] * len(scalars)
    by_device: dict[Any, list[int]] = {}
    for j, t in enumerate(scalars):
        by_device.setdefault(t.device, []).append(j)
    for indices in by_device.values():
        for j, value in zip(indices, torch.stack([scalars[j] for j in indices]).tolist(), strict=True):
            result[j] = value
    return result


def _normalized(
    values: torch.Tensor, keep: torch.Tensor | None, norm: float, key_dtype: torch.dtype, source: Any
) -> Callable[[torch.Tensor], torch.Tensor]:
    """One leaf's scores divided by their norm over its kept entries, chunk by chunk."""
    kept = values if keep is None else torch.where(keep, values, torch.zeros((), dtype=values.dtype))
    if not _torch.has_float64(values.device):
        return _normalized_float32(kept, norm, source)
    scale = torch.linalg.vector_norm(kept.to(torch.float64), ord=norm)
    work = torch.float32 if key_dtype == torch.int32 else torch.float64
    scale = torch.clamp(scale, min=torch.finfo(work).tiny).to(work)
    if source is None:
        return lambda chunk: chunk.to(work) / scale
    return lambda chunk: chunk.to(work).abs() / scale


def _normalized_float32(
    kept: torch.Tensor, norm: float, source: Any
) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`_normalized` on a device without float64 (MPS): the norm and quotients in float32.

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
    scale = torch.clamp(scale, min=torch.finfo(torch.float32).tiny)
    if source is None:
        return lambda chunk: chunk.to(torch.float32) / scale
    return lambda chunk: chunk.to(torch.float32).abs() / scale


def _channels(
    inputs: _inputs.Inputs,
    score: Callable[[int], torch.Tensor],
    amounts: list[Any],
    scope: Channels,
    source: Any,
) -> dict[int, torch.Tensor]:
    flat = inputs.params
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    by_ndim: dict[int, int] = {}  # the dim, checked once per number of dims (in leaf order)
    dims = {}
    for i in chosen:
        ndim = flat.leaves[i].dim()
        d = by_ndim.get(ndim)
        if d is None:
            d = by_ndim[ndim] = _inputs.check_dim(
                scope.dim,
                flat.leaves[i],
                f" at {inputs.name(i)}",
                "leave such leaves out with where=lambda name, p: p.dim() > 1.",
            )
        dims[i] = d
    # Leaves in runs (see _LeafRuns) when their channel scores come from a norm order or directly.
    reduce = scope.reduce
    batched = not inputs.traced and (
        reduce is None or (isinstance(reduce, numbers.Real) and not isinstance(reduce, bool))
    )
    fast = {i for i in chosen if batched and _in_runs(flat.leaves[i], inputs.prior[i], amounts[i])}
    slow = [i for i in chosen if i not in fast]
    alive_channels, sizes = [], []
    for i in slow:
        p, prior, d = flat.leaves[i], inputs.prior[i], dims[i]
        others = [x for x in range(p.dim()) if x != d]
        alive_channels.append(None if prior is None else prior.any(dim=others))
        sizes.append(p.shape[d])
    alive = dict(zip(slow, _inputs.remaining_all(alive_channels, sizes, inputs.traced), strict=True))
    live_of = dict(zip(slow, alive_channels, strict=True))
    ks: dict[int, Any] = {}
    counted: dict[tuple, Any] = {}
    for i in chosen:  # in leaf order, so that the first leaf whose count is wrong is named
        channels = flat.leaves[i].shape[dims[i]]
        if i in alive:
            a = alive[i]
            name = f"{inputs.name(i)} along dim {dims[i]}"
            ks[i] = _amount.count(amounts[i], a, "channels", name, size=channels) + (channels - a)
            continue
        signature = (isinstance(amounts[i], numbers.Integral), amounts[i], channels)
        k = counted.get(signature)
        if k is None:
            name = f"{inputs.name(i)} along dim {dims[i]}"
            k = counted[signature] = _amount.count(amounts[i], channels, "channels", name, size=channels)
        ks[i] = k
    new: dict[int, torch.Tensor] = {}
    # A NaN among a channel's entries makes its norm NaN (any order but 0), so the NaN check reads
    # the channel scores, not every entry's (a second pass over the weights otherwise).
    propagates = (
        reduce is None
        or reduce == "fro"
        or (isinstance(reduce, numbers.Real) and not isinstance(reduce, bool) and reduce != 0)
    )
    watch = score if isinstance(score, _inputs.NaNWatch) and propagates else None
    note, raw = (watch.note, watch.raw) if watch is not None else (None, score)
    rows = _LeafRuns(
        _channel_keys(flat.leaves, dims, reduce, source, note), _channel_masks(new, flat.leaves, dims)
    )
    pending: list = []
    for i in chosen:
        p, d = flat.leaves[i], dims[i]
        values = raw(i)
        if (
            i in fast
            and (values.shape == p.shape or (values.dim() == 1 and values.shape[0] == p.shape[d]))
            and (values.dim() == 1 or reduce is not None)
        ):
            rows.add(i, values, ks[i], p.shape)
            continue
        values = _groups.channel_scores(values, p, d, reduce, inputs.name(i))
        if note is not None:
            note([i], values)
        live = live_of.get(i)
        key_fn = _select.keys(values, live, _select.key_dtype([values]), source)
        pending.append((i, (p.shape[d], key_fn, ks[i], p.device, values)))
    keeps = _prune_each([item for _, item in pending], inputs.traced)
    for (i, _), keep in zip(pending, keeps, strict=True):
        new[i] = _expand_channels(keep, flat.leaves[i], dims[i], inputs.prior[i])
    for i, values in rows.finish():  # scores that a transform batched: the traced path
        p, d = flat.leaves[i], dims[i]
        values = _groups.channel_scores(values, p, d, reduce, inputs.name(i))
        key_fn = _select.keys(values, None, _select.key_dtype([values]), source)
        (keep,) = _prune_each([(p.shape[d], key_fn, ks[i], p.device, values)], True)
        new[i] = _expand_channels(keep, p, d, None)
    return new


def _expand_channels(keep: torch.Tensor, p: torch.Tensor, d: int, prior: torch.Tensor | None) -> torch.Tensor:
    shape = [1] * p.dim()
    shape[d] = p.shape[d]
    keep = keep.view(shape).expand(p.shape)
    return keep.contiguous() if prior is None else keep & prior


def _channel_keys(
    leaves: list[torch.Tensor],
    dims: dict[int, int],
    reduce: Any,
    source: Any,
    note: Callable[[list, torch.Tensor], None] | None = None,
) -> Callable[[list, list], torch.Tensor]:
    """Keys of a batch of leaves' channel scores: ``(leaves, channels)``, by one norm of the stack
    (``note(indices, channel scores)`` sees the scores first, when given)."""

    def make(indices: list, values: list) -> torch.Tensor:
        first = values[0]
        stacked = torch.stack(values)
        if first.dim() > 1:
            d = dims[indices[0]]
            others = [x + 1 for x in range(first.dim()) if x != d]
            stacked = torch.norm(stacked, p=reduce, dim=others)
        if note is not None:
            note(indices, stacked)
        dtype = _select.key_dtype([stacked])
        return _select.keys(stacked, None, dtype, source)(0, stacked.numel()).view(stacked.shape)

    return make


def _channel_masks(
    new: dict, leaves: list[torch.Tensor], dims: dict[int, int]
) -> Callable[[list, list, torch.Tensor], None]:
    def masks(indices: list, values: list, keep: torch.Tensor) -> None:
        p, d = leaves[indices[0]], dims[indices[0]]
        shape = [len(indices)] + [1] * p.dim()
        shape[d + 1] = p.shape[d]
        full = keep.view(shape).expand(len(indices), *p.shape).contiguous()
        new.update(zip(indices, full.unbind(0), strict=True))

    return masks


def _grouped(
    inputs: _inputs.Inputs,
    score: Callable[[int], torch.Tensor],
    amounts: list[Any],
    scope: Rows | NM,
    source: Any,
) -> dict[int, torch.Tensor]:
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
            k = _amount.count(amounts[i], alive, "parameters", inputs.name(i), size=size) + (size - alive)
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
        keep = _groups.lowest_in_groups(keys(0, _numel(shape)).view(shape), k)
        if isinstance(scope, NM):
            keep = keep.reshape(p.movedim(d, -1).shape).movedim(-1, d)
        else:
            keep = keep.reshape(p.movedim(d, 0).shape).movedim(0, d)
        new[i] = keep.contiguous()
    return new


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _check_row_counts(inputs: _inputs.Inputs, amounts: list[Any], plans: list, scope: Rows) -> None:
    """An int amount above what a row has left raises (eager code only; one host read)."""
    if inputs.traced:
        return
    checks = [
        (i, alive.min())
        for i, _, _, _, alive, _ in plans
        if isinstance(amounts[i], numbers.Integral) and alive.numel()
    ]
    if not checks:
        return
    smallest = _read_each([m for _, m in checks])
    for (i, _), least in zip(checks, smallest, strict=True):
        if amounts[i] > least:
            raise ValueError(
                f"amount={amounts[i]} is more than the {least} parameters left to prune in a "
                f"slice of {inputs.name(i)} along dim {scope.dim}; expected a count of at most "
                f"{least} (or a fraction in [0, 1])."
            )
