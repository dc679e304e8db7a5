"""Private: the checks and bookkeeping that every mask function starts and ends with."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch

from fprune import _amount, _torch, _tree, _warn
from fprune.select import _engine


class Inputs(NamedTuple):
    """Validated arguments of a mask function, one entry per leaf of ``params``."""

    params: _tree.Flat
    scores: list[torch.Tensor | None]  # importance_scores leaves, or None
    prior: list[torch.Tensor | None]  # prior masks as bool, or None (nothing pruned yet)
    chosen: list[bool]  # which leaves ``where`` selects for pruning
    traced: bool  # True under a transform or torch.compile: no Python use of tensor values
    argname: str = "params"  # how messages name the tree

    def name(self, i: int) -> str:
        """How messages name leaf ``i``: ``params['fc.weight']``."""
        return _tree.describe(self.argname, self.params.paths[i])


def gather(
    params: Any,
    amount: Any,
    importance_scores: Any,
    masks: Any,
    where: Any,
    *,
    argname: str = "params",
    check_amount: bool = True,
) -> Inputs:
    """Check the arguments shared by the pruning functions; raise before any work is done.

    ``argname`` names the tree in messages; ``check_amount=False`` leaves ``amount`` to the
    caller (per-leaf amounts, or a scope that takes none).
    """
    flat = _tree.flatten(params, argname)
    _check_aliases(flat, argname)
    if check_amount and not is_per_leaf(amount):
        _amount.check_amount(amount)
    scores = (
        [None] * len(flat.leaves)
        if importance_scores is None
        else _tree.check_scores(flat, importance_scores)
    )
    prior = [None] * len(flat.leaves) if masks is None else _tree.align_masks(flat, masks)
    chosen = _tree.selected(flat, where)
    involved = [t for t in flat.leaves + scores + prior if t is not None]
    if isinstance(amount, torch.Tensor):
        involved.append(amount)
    traced = _engine.is_traced(involved)
    _tree.check_values(flat, argname, traced, bool_ok=argname != "params")
    if masks is not None:
        _tree.check_mask_values(flat, prior, traced)
        prior = [None if m is None else _tree.as_bool(m) for m in prior]
    inputs = Inputs(flat, scores, prior, chosen, traced, argname)
    _check_devices(inputs)
    return inputs


def _check_aliases(flat: _tree.Flat, argname: str) -> None:
    """One tensor under two keys (tied weights listed twice) raises ValueError naming both.

    Ranked twice, it would count twice and a tie could split between its copies (two masks
    for one tensor). Identity only (``is``): a check on Python objects, no tensor value read.
    Skipped under torch.compile, where ``id`` would guard on each tensor object (a recompile
    per call with new tensors); ``vmap`` wraps each leaf apart, so aliases are lost there too.
    """
    if _torch.is_dynamo_compiling():
        return
    first: dict = {}
    for i, leaf in enumerate(flat.leaves):
        j = first.setdefault(id(leaf), i)
        if j != i:
            a, b = _tree.describe(argname, flat.paths[j]), _tree.describe(argname, flat.paths[i])
            raise ValueError(
                f"The same tensor appears as {a} and {b} (tied weights?); expected each tensor "
                f"once: pass it under one key (model.named_parameters() lists a tied tensor "
                f"once), prune, then give the other key the same mask."
            )


def _check_devices(inputs: Inputs) -> None:
    """Scores and prior masks live on their leaf's device (ValueError naming the leaf)."""
    for i, leaf in enumerate(inputs.params.leaves):
        for what, other in (("importance_scores", inputs.scores[i]), ("masks", inputs.prior[i])):
            if other is not None and other.device != leaf.device:
                raise ValueError(
                    f"Expected the {what} of {inputs.name(i)} on its device ({leaf.device}), got "
                    f"{other.device}; move them with .to({str(leaf.device)!r})."
                )


def finish(inputs: Inputs, new: dict) -> Any:
    """The mask tree: ``new[i]`` for pruned leaves; the prior mask (or all True) for the others."""
    leaves = []
    for i, leaf in enumerate(inputs.params.leaves):
        if i in new:
            leaves.append(new[i])
        elif inputs.prior[i] is not None:
            leaves.append(inputs.prior[i])
        else:
            leaves.append(torch.ones_like(leaf, dtype=torch.bool))
    return _tree.unflatten(inputs.params, leaves)


def remaining_all(keeps: list[torch.Tensor | None], sizes: list[int], traced: bool) -> list:
    """:func:`remaining` of many leaves with one host read per device (none when traced).

    ``keeps[i]`` (or None: nothing pruned) over ``sizes[i]`` entries or channels; the result is
    a list of ints in eager code, of ints and 0-dim tensors when traced.
    """
    counts: list = list(sizes)
    by_device: dict = {}
    for i, keep in enumerate(keeps):
        if keep is not None:
            by_device.setdefault(keep.device, []).append(i)
    for indices in by_device.values():
        sums = [keeps[i].sum() for i in indices]
        if traced:
            for i, total in zip(indices, sums, strict=True):
                counts[i] = total
        else:
            for i, total in zip(indices, torch.stack(sums).tolist(), strict=True):
                counts[i] = total
    return counts


def remaining(keep: torch.Tensor | None, size: int, traced: bool) -> int | torch.Tensor:
    """How many entries (or channels) prior masks left: an int in eager code, a tensor when traced."""
    if keep is None:
        return size
    alive = keep.sum()
    return alive if traced else int(alive)


def check_dim(dim: Any, p: torch.Tensor, location: str = "", hint: str = "") -> int:
    """torch's structured checks, ``dim`` normalized: >= 2 dims (ValueError), an int ``dim``
    (TypeError) in range (IndexError). ``location`` names the tensor, ``hint`` says what to do.
    """
    if p.dim() < 2:
        raise ValueError(
            f"Structured pruning can only be applied to multidimensional tensors. Found tensor "
            f"of shape {tuple(p.shape)} with {p.dim()} dims{location}; {hint}"
        )
    return check_axis(dim, p, location)


def check_axis(dim: Any, p: torch.Tensor, location: str = "") -> int:
    """``dim`` as a non-negative index of ``p``'s dims: an int (TypeError) in range (IndexError)."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"Expected dim to be an int, got {dim!r}.")
    if not -p.dim() <= cast(int, dim) < p.dim():
        raise IndexError(
            f"Invalid index {dim} for tensor of size {tuple(p.shape)}{location}: expected dim in "
            f"[{-p.dim()}, {p.dim() - 1}]."
        )
    return int(dim) % p.dim()


def is_per_leaf(amount: Any) -> bool:
    """True when ``amount`` is a tree of per-leaf amounts (a dict, list, tuple...), not one amount."""
    return isinstance(amount, (dict, list, tuple))


def _amount_items(tree: Any, path: tuple = ()) -> list:
    """``(path, value)`` of every leaf of a tree of dicts, lists and tuples, ``None`` a leaf.

    A plain walk rather than optree: it also traces under ``torch.compile`` when the tree is
    built inside the compiled function.
    """
    if isinstance(tree, dict):
        return [item for key in tree for item in _amount_items(tree[key], path + (key,))]
    if isinstance(tree, (list, tuple)):
        return [item for i, value in enumerate(tree) for item in _amount_items(value, path + (i,))]
    return [(path, tree)]


def leaf_amounts(inputs: Inputs, amount: Any) -> list[Any]:
    """One amount per leaf of ``inputs.params``, ``None`` for the leaves that are not pruned.

    ``amount`` is one amount for every selected leaf, or per-leaf amounts: a dict keyed like a
    flat params dict (``{"fc.weight": 0.5}``) or a pytree shaped like params, ``None`` meaning
    "skip". Leaves it leaves out are not pruned; a key that matches no leaf raises. Each
    amount is checked as a single one is; leaves that ``where`` rejects are not pruned.
    """
    if not is_per_leaf(amount):
        return [amount if chosen else None for chosen in inputs.chosen]
    items = _amount_items(amount)
    names = [_tree.dotted(path) for path in inputs.params.paths]
    index = {name: i for i, name in enumerate(names)}
    amounts: list[Any] = [None] * len(names)
    for path, value in items:
        name = _tree.dotted(path)
        if name not in index:
            near = difflib.get_close_matches(name, names, n=3)
            hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            raise ValueError(
                f"amount[{name!r}] matches no leaf of {inputs.argname}; expected keys among its "
                f"leaves' names ({len(names)} leaves, e.g. {names[:3]}).{hint}"
            )
        if value is None:
            continue
        try:
            _amount.check_amount(value)
        except (TypeError, ValueError) as error:
            raise type(error)(f"amount[{name!r}]: {error}") from None
        if inputs.chosen[index[name]]:
            amounts[index[name]] = value
    return amounts


class NaNWatch:
    """A score function (``score(i) -> tensor``) that also notes, in eager code, whether each
    leaf's scores hold NaN; :meth:`warn` then warns once for the whole call, naming the leaves.

    The note is a maximum per leaf (``amax`` propagates NaN: exact), or the leaf's reduced scores
    where its scope notes those instead (:meth:`note`), read for all leaves together in one host
    read per device. Scores that are tensors the caller gave (the params, or
    ``importance_scores``) are reduced at the end: leaves of one shape, dtype and device stacked
    a batch at a time, one ``amax`` per batch (a call with many small leaves makes a few tensors,
    not one per leaf: each new tensor is an object Python's garbage collector walks). Scores
    made on the fly (random draws) are reduced right away, so that none is kept alive. Under a
    transform nothing is noted or read.
    """

    def __init__(self, inputs: Inputs, score: Callable[[int], torch.Tensor]) -> None:
        self.inputs = inputs
        self.score = score
        # (leaves, a tensor with a row each): maxima (a row of one) or reduced scores, read in warn()
        self.noted: list[tuple[list[int], torch.Tensor]] = []
        self.given: list = []  # leaves whose scores are the caller's tensors, reduced in warn()

    def __call__(self, i: int) -> torch.Tensor:
        values = self.score(i)
        if self.inputs.traced:
            return values
        if values is self.inputs.params.leaves[i] or values is self.inputs.scores[i]:
            self.given.append(i)  # the caller's tensor: nothing is kept alive
        elif _nan_able(values) and not _torch.is_functorch_wrapped(values):
            self.noted.append(([i], values.amax().reshape(1)))
        return values

    def raw(self, i: int) -> torch.Tensor:
        """Leaf ``i``'s scores, not noted: for a scope that notes its reduced scores instead."""
        return self.score(i)

    def note(self, indices: list[int], reduced: torch.Tensor) -> None:
        """Note the reduced scores of ``indices`` (a row each of ``reduced``) instead of their
        entries' scores: a scope whose reduction propagates NaN (a channel norm) reads far less.
        They are kept (one score per channel: small) and read together by :meth:`warn`."""
        if self.inputs.traced or not _nan_able(reduced) or _torch.is_functorch_wrapped(reduced):
            return
        self.noted.append((indices, reduced))

    def _reduce_given(self) -> None:
        leaves, scores = self.inputs.params.leaves, self.inputs.scores
        groups: dict = {}  # leaves of one shape, dtype and device: stacked together
        for i in self.given:
            values = leaves[i] if scores[i] is None else scores[i]
            groups.setdefault((values.shape, values.dtype, values.device), []).append(i)
        self.given = []
        for (shape, dtype, device), indices in groups.items():
            size = shape.numel()
            if not dtype.is_floating_point or size == 0 or device.type == "meta":
                continue
            tensors = [leaves[i] if scores[i] is None else scores[i] for i in indices]
            if len(indices) == 1 or size > _NAN_STACK_LEAF:
                self.noted += [
                    ([i], values.amax().reshape(1)) for i, values in zip(indices, tensors, strict=True)
                ]
                continue
            step = max(1, _NAN_STACK_ENTRIES // size)
            for start in range(0, len(indices), step):
                batch = tensors[start : start + step]
                self.noted.append(
                    (indices[start : start + step], torch.stack(batch).reshape(len(batch), -1).amax(1))
                )

    def _read(self) -> list[int]:
        """The leaves whose noted rows hold NaN: one cat and one read per device."""
        by_device: dict = {}
        for indices, rows in self.noted:
            by_device.setdefault(rows.device, []).append((indices, rows))
        self.noted = []
        bad = []
        for items in by_device.values():
            owners, ends, at = [], [], 0  # each leaf, and where its row ends in the flat tensor
            for indices, rows in items:
                width = rows.numel() // len(indices)
                for i in indices:
                    at += width
                    owners.append(i)
                    ends.append(at - 1)
            with torch.no_grad():
                flat = torch.cat([rows.reshape(-1) for _, rows in items])
                # NaN per leaf: a running count read at each row's end, differenced (one read).
                seen = torch.isnan(flat).cumsum(0)[torch.tensor(ends, device=flat.device)]
                per_leaf = torch.diff(seen, prepend=seen.new_zeros(1))
            bad += [i for i, nans in zip(owners, per_leaf.tolist(), strict=True) if nans]
        return bad

    def warn(self) -> None:
        self._reduce_given()
        bad = sorted(set(self._read()))
        if bad:
            names = _tree.listing([self.inputs.name(i) for i in bad])
            _warn.warn(
                f"The scores ranked for {names} hold NaN. A NaN ranks above +inf, so its entry is "
                f"pruned last (kept unless the count reaches it), and NaN scores tie by position "
                f"(all-NaN scores give a mask by position alone). Replace NaN first (say with "
                f"torch.nan_to_num) if that is not what you want.",
                _warn.NaNScoresWarning,
            )


# NaNWatch stacks the caller's leaves of at most this many entries, in batches of about this many.
_NAN_STACK_LEAF = 1 << 14
_NAN_STACK_ENTRIES = 1 << 18


def _nan_able(values: torch.Tensor) -> bool:
    """Whether a score tensor can hold NaN that can be read now (floating, non-empty, not meta)."""
    return values.is_floating_point() and values.numel() > 0 and values.device.type != "meta"
