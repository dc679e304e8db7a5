"""Argument checks of the compat methods, in torch's order and with torch's exception types,
and the masks the built-in methods build from the core's keep-masks (as torch lays them out)."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch.nn.utils import parametrize

from fprune import _amount
from fprune.compat import _errors
from fprune.select._inputs import check_dim


def check_amount(amount: Any) -> None:
    """torch's ``_validate_pruning_amount_init``: the core's check, whose messages are torch's.

    Two cases differ from the core, as they do in torch: a tensor is refused (the core takes a
    floating-point one) and NaN passes here (counting raises ``ValueError`` later, at the point
    torch does, in torch's words for an amount out of range). Unlike torch, a bool is refused:
    torch takes it for an int and then fails in ``topk`` (``True``) or silently prunes nothing.
    """
    if isinstance(amount, torch.Tensor) or callable(amount):  # (the core takes count rules too)
        raise TypeError(f"Invalid type for amount: {amount!r}. Must be int or float.")
    if isinstance(amount, numbers.Real) and amount != amount:
        return  # NaN
    _amount.check_amount(amount)


def check_target(module: torch.nn.Module, name: str, reads_values: bool) -> None:
    """Refuse, before anything changes, a tensor compat cannot prune in place.

    A parametrized tensor (``torch.nn.utils.parametrize``) is computed, not a Parameter: torch
    fails deep inside with "cannot assign ... to parameter 'weight_orig'". A meta tensor has no
    values for the methods that rank them (``reads_values``).
    """
    if parametrize.is_parametrized(module, name):
        raise TypeError(
            f"{type(module).__name__}.{name} is computed by a parametrization "
            f"(torch.nn.utils.parametrize); expected a plain parameter: prune its original "
            f"instead, e.g. prune.l1_unstructured(module.parametrizations.{name}, 'original', "
            f"amount), or use the functional API on named_parameters() "
            f"('parametrizations.{name}.original')."
        )
    t = getattr(module, name, None)
    if reads_values and isinstance(t, torch.Tensor) and t.device.type == "meta":
        raise ValueError(
            f"Expected {type(module).__name__}.{name} to hold values, got a meta tensor (shape "
            f"{tuple(t.shape)}, no data): masks are computed from values. Load or initialize "
            f"the weights first (e.g. module.to_empty(device='cpu') and a state_dict)."
        )


def prune_count(amount: Any, size: int) -> int:
    """How many of ``size`` units to prune: the int itself, or torch's ``round(amount * size)``
    (:func:`fprune._amount.round_count`, fprune's one count rule)."""
    # No place named: the count error keeps torch's wording (see fprune._amount.count).
    if amount != amount:
        # torch: "cannot convert float NaN to integer"; the range check's words say more
        raise _amount.range_error(amount)
    return int(_amount.count(amount, size, "parameters"))


def check_structured(t: torch.Tensor, dim: Any) -> int:
    """torch's structured checks: >= 2 dims (ValueError), ``dim`` in range (IndexError)."""
    return check_dim(dim, t, hint="prune 1-d tensors (biases) with an unstructured method.")


def norm_order(n: Any) -> Any:
    """``n`` as the core takes it; ``torch.norm`` reads ``None`` as 2 and ``True`` as 1."""
    if n is None:
        return 2.0
    if isinstance(n, bool):
        return float(n)
    if isinstance(n, str) and n not in ("fro", "nuc"):
        raise _errors.InvalidNormError(
            f"Expected n to be a number, inf, -inf, 'fro' or 'nuc' (torch.norm's p), got {n!r}."
        )
    return n


def channel_liveness(prior: torch.Tensor, dim: int) -> torch.Tensor:
    others = [d for d in range(prior.dim()) if d != dim]
    return prior.any(dim=others)


def largest_first(draws: torch.Tensor) -> torch.Tensor:
    """torch prunes the largest draws: ``-draws`` (in place; exact, so no new ties) ranked by value."""
    return draws.neg_()


def check_scores(importance_scores: Any, orig: Any, name: str, module: torch.nn.Module) -> None:
    if importance_scores is None:
        return
    shape = getattr(importance_scores, "shape", None)
    if shape != getattr(orig, "shape", None):
        raise _errors.ImportanceScoresShapeError(
            f"Expected importance_scores to have the shape of parameter {name!r} of "
            f"{type(module).__name__}, {tuple(orig.shape) if orig is not None else None}, got "
            f"{tuple(shape) if shape is not None else type(importance_scores).__name__}."
        )


def unstructured_mask(keep: torch.Tensor | None, default_mask: torch.Tensor) -> torch.Tensor:
    # torch: mask = default_mask.clone(); mask.view(-1)[pruned] = 0
    mask = default_mask.clone(memory_format=torch.contiguous_format)
    if keep is not None:
        mask.view(-1).masked_fill_(~keep.reshape(-1), 0)
    return mask


def structured_mask(keep: torch.Tensor | None, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
    # torch: mask = zeros_like(t); mask[kept channels] = 1; mask *= default_mask (or default_mask if k == 0)
    if keep is None:
        return default_mask
    mask = torch.zeros_like(t)
    mask.masked_fill_(keep, 1)
    mask *= default_mask.to(dtype=mask.dtype)
    return mask
