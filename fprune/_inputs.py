"""Private: the checks and bookkeeping that every mask function starts and ends with."""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional

import numbers

import torch

from fprune import _amount, _select, _tree


class Inputs(NamedTuple):
    """Validated arguments of a mask function, one entry per leaf of ``params``."""

    params: _tree.Flat
    scores: List[Optional[torch.Tensor]]  # importance_scores leaves, or None
    prior: List[Optional[torch.Tensor]]  # prior masks as bool, or None (nothing pruned yet)
    chosen: List[bool]  # which leaves ``where`` selects for pruning
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
    if check_amount:
        _amount.check_amount(amount)
    scores = (
        [None] * len(flat.leaves)
        if importance_scores is None
        else _tree.check_scores(flat, importance_scores)
    )
    prior = [None] * len(flat.leaves) if masks is None else _tree.check_masks(flat, masks)
    chosen = _tree.selected(flat, where)
    involved = [t for t in flat.leaves + scores + prior if t is not None]
    if isinstance(amount, torch.Tensor):
        involved.append(amount)
    traced = _select.is_traced(involved)
    _tree.check_values(flat, argname, traced, bool_ok=argname != "params")
    return Inputs(flat, scores, prior, chosen, traced, argname)


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


def remaining_all(keeps: List[Optional[torch.Tensor]], sizes: List[int], traced: bool) -> list:
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
            for i, total in zip(indices, sums):
                counts[i] = total
        else:
            for i, total in zip(indices, torch.stack(sums).tolist()):
                counts[i] = total
    return counts


def remaining(keep: Optional[torch.Tensor], size: int, traced: bool):
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
    if not -p.dim() <= dim < p.dim():
        raise IndexError(
            f"Invalid index {dim} for tensor of size {tuple(p.shape)}{location}: expected dim in "
            f"[{-p.dim()}, {p.dim() - 1}]."
        )
    return int(dim) % p.dim()
