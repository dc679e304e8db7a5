"""Private: the checks and bookkeeping that every mask function starts and ends with."""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional

import torch

from fprune import _amount, _select, _tree


class Inputs(NamedTuple):
    """Validated arguments of a mask function, one entry per leaf of ``params``."""

    params: _tree.Flat
    scores: List[Optional[torch.Tensor]]  # importance_scores leaves, or None
    prior: List[Optional[torch.Tensor]]  # prior masks as bool, or None (nothing pruned yet)
    chosen: List[bool]  # which leaves ``where`` selects for pruning
    traced: bool  # True under a transform or torch.compile: no Python use of tensor values


def gather(params: Any, amount: Any, importance_scores: Any, masks: Any, where: Any) -> Inputs:
    """Check the arguments shared by the pruning functions; raise before any work is done."""
    flat = _tree.flatten(params, "params")
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
    _tree.check_values(flat, "params", traced)
    return Inputs(flat, scores, prior, chosen, traced)


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


def remaining(keep: Optional[torch.Tensor], size: int, traced: bool):
    """How many entries (or channels) prior masks left: an int in eager code, a tensor when traced."""
    if keep is None:
        return size
    alive = keep.sum()
    return alive if traced else int(alive)
