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
source :data:`fprune.select._engine.MAGNITUDE` whose float32 keys are the bits with the sign cleared
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
* :class:`Blocks`: per matrix, whole tiles of ``shape`` of lowest norm (``block_structured``).

Each is one class in one file of this package, deriving from :class:`Scope`: it says how its
amount is checked (:meth:`Scope.leaf_amounts`), and what it ranks and how the keep-decisions
expand to masks, once, against an executor that runs it (:meth:`Scope.masks`). A new scope is
one such class and one export line here.

Executors (the protocol :class:`fprune.select._executor.Executor`: per entry, grouped, within
groups, and the global ranking's primitives). One process: :mod:`fprune.select._local`, over
the engine of :mod:`fprune.select._engine`. Sharded leaves (``DTensor``s: FSDP2, tensor
parallelism): :mod:`fprune.select._sharded`, over the agreement, radix selects and collectives
of :mod:`fprune.distributed`, which knows no scope. :func:`select_inputs` is the one place that
looks at the leaves' type and picks the executor (no scope imports one), so the methods, the
pruners and the scores never do, and a new method is sharded as it is (its score function runs
on DTensors, since torch ops on DTensors give DTensors). Nothing above this package imports
:mod:`fprune.distributed`'s selection code.

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

from collections.abc import Callable
from typing import Any

import torch

from fprune import _tree
from fprune._types import Masks, Params, Scores
from fprune._warn import NaNScoresWarning
from fprune.select import _engine, _groups, _inputs, _local, _sharded
from fprune.select._blocks import Blocks
from fprune.select._channels import Channels
from fprune.select._each import EACH, Each
from fprune.select._engine import lowest as lowest  # package-public: fprune.reconstruct
from fprune.select._global import Global, LayerCollapseWarning
from fprune.select._nm import NM
from fprune.select._rows import Rows
from fprune.select._scope import Scope

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
    "Blocks",
    "Scope",
    "LayerCollapseWarning",
    "NaNScoresWarning",
]

Rank = str  # "value" or "magnitude"
_RANKS = ("value", "magnitude")
Reduce = _groups.Reduce


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
        scope: :data:`EACH` (default), :class:`Global`, :class:`Channels`, :class:`Rows`,
            :class:`NM`, :class:`Blocks` (any :class:`Scope`).
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
    check_amount = scope.fractional
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
        if leaf.shape != p.shape and not scope.takes_group_scores(leaf, p):
            raise ValueError(
                f"Expected {where} to have the shape of {inputs.name(i)}, {tuple(p.shape)}"
                + (f" or {scope.group_scores}" if scope.group_scores else "")
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
    executor); otherwise the caller raises it."""
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
    Sharded inputs (DTensor leaves) go to the sharded executor, which runs the scope's plan: a
    score function written for one process is sharded as it is.

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
    if _sharded.involved(inputs):
        return _sharded.run(inputs, score, amount, scope, rank, source)
    amounts = scope.leaf_amounts(inputs, amount)
    tensors = [a for a in amounts if isinstance(a, torch.Tensor)]
    if tensors and not inputs.traced and _engine.is_traced(tensors):
        inputs = inputs._replace(traced=True)
    watch = _inputs.NaNWatch(inputs, score)  # eager: warns once if the ranked scores hold NaN
    new = scope.masks(_local.Executor(inputs, watch, amount, amounts, source))
    watch.warn()
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


def _check_scope(scope: Any) -> None:
    if not isinstance(scope, Scope):
        raise TypeError(
            f"Expected scope to be one of fprune.select's scopes (EACH, Global(), Channels(dim), "
            f"Rows(dim), NM(n, m), Blocks(shape)) or another fprune.select.Scope, got {scope!r}."
        )


def _source(rank: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    if rank not in _RANKS:
        raise ValueError(f"Expected rank to be 'value' or 'magnitude', got {rank!r}.")
    return _engine.MAGNITUDE if rank == "magnitude" else None
