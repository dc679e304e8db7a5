"""Private: the pruners of :mod:`fprune.pruners` on ``DTensor`` params (FSDP2, tensor parallelism).

Each pruner step is a selection with a count: the distributed, exact selections of
:mod:`fprune._distributed` (through the mask functions) give the single-process masks,
ties included, with no parameter gathered. Eager only (the ranks agree on the counts on the
host): ``fraction`` and the step's seed are read as numbers.

* ``gradual_magnitude``: prune ``round(fraction * n) - already pruned`` more entries of lowest
  magnitude among those kept (one ranking, or one per leaf for ``scope="layerwise"``).
* ``set_`` / ``rigl`` init: each selected leaf prunes ``round(fraction * numel)`` entries of
  lowest seeded uniform draw (the hash of each entry's global position).
* ``set_`` / ``rigl`` update: each leaf drops its ``k`` active entries of lowest magnitude and
  grows the ``k`` inactive ones of highest score (random draw or ``|grad|``), ties to the
  first position, as the single-process pruners do.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from fprune import _distributed, _tree
from fprune.unstructured import global_unstructured, l1_unstructured


def _count(fraction: Any, n: int) -> int:
    """``round(fraction * n)`` (half to even) in float64, as the pruners count."""
    fraction = torch.as_tensor(fraction, dtype=torch.float64)
    return int(torch.round(fraction * float(n)))


def _sub(leaves: List[Any], ids: List[int]) -> dict:
    # Zero-padded keys keep the leaves in their flatten order (the tie-break across leaves).
    return {f"{j:09d}": leaves[i] for j, i in enumerate(ids)}


def gradual(flat: _tree.Flat, chosen: List[bool], prior: List[Any], fraction: Any, scope: str) -> List[Any]:
    """The new masks of a ``gradual_magnitude`` update step."""
    ids = [i for i, c in enumerate(chosen) if c]
    masks = [m.clone() for m in prior]
    if not ids:
        return masks
    sizes = [flat.leaves[i].numel() for i in ids]
    alive = _distributed.kept_counts([prior[i] for i in ids])
    params = _sub([p.detach() for p in flat.leaves], ids)
    priors = _sub(prior, ids)
    if scope == "global":
        total = sum(sizes)
        extra = max(0, _count(fraction, total) - (total - sum(alive)))
        if extra == 0:
            return masks
        new = global_unstructured(params, extra, masks=priors)
    else:
        amounts = {
            key: max(0, _count(fraction, n) - (n - a)) for key, n, a in zip(params, sizes, alive)
        }
        new = l1_unstructured(params, amounts, masks=priors)
    for key, i in zip(params, ids):
        masks[i] = new[key]
    return masks


def initial(flat: _tree.Flat, selected: List[int], fractions: dict, seed: Any) -> List[Any]:
    """The masks of ``set_`` / ``rigl``'s ``init``: random, each leaf at its fraction."""
    masks = [torch.ones_like(p, dtype=torch.bool) for p in flat.leaves]
    if not selected:
        return masks
    seed = int(seed)
    params = _sub([p.detach() for p in flat.leaves], selected)
    draws = {key: _distributed.seeded_uniform(flat.leaves[i], seed, i) for key, i in zip(params, selected)}
    amounts = {key: round(fractions[i] * flat.leaves[i].numel()) for key, i in zip(params, selected)}
    new = l1_unstructured(params, amounts, importance_scores=draws, signed=True)
    for key, i in zip(params, selected):
        masks[i] = new[key]
    return masks


def dynamic(
    flat: _tree.Flat,
    chosen: List[bool],
    prior: List[Any],
    fraction: Any,
    step_seed: Optional[torch.Tensor],
    grads: Optional[List[Any]],
):
    """The masks and regrown entries of a ``set_`` (``grads=None``) or ``rigl`` update step."""
    ids = [i for i, c in enumerate(chosen) if c]
    masks = [m.clone() for m in prior]
    regrown = [torch.zeros_like(m) for m in prior]
    if not ids:
        return masks, regrown
    active = _distributed.kept_counts([prior[i] for i in ids])
    params = _sub([p.detach() for p in flat.leaves], ids)
    priors = _sub(prior, ids)
    ks = {}
    for key, i, n_active in zip(params, ids, active):
        n = flat.leaves[i].numel()
        ks[key] = min(_count(fraction, n_active), n - n_active)
    # Drop: the k active entries of lowest magnitude (prior masks: only active ones count).
    kept = l1_unstructured(params, ks, masks=priors)
    # Grow: the k inactive entries (before this step) of highest score: the lowest of -score.
    if grads is None:
        seed = int(step_seed)
        scores = {key: -_distributed.seeded_uniform(flat.leaves[i], seed, i) for key, i in zip(params, ids)}
    else:
        scores = {key: -grads[i].detach().abs() for key, i in zip(params, ids)}
    inactive = {key: ~priors[key] for key in params}
    not_grown = l1_unstructured(params, ks, importance_scores=scores, masks=inactive, signed=True)
    for key, i in zip(params, ids):
        grown = inactive[key] & ~not_grown[key]
        masks[i] = kept[key] | grown
        regrown[i] = grown
    return masks, regrown
