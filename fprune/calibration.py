"""Calibration statistics collected by running a module on data: Wanda's input-feature norms.

The module runs through ``torch.func.functional_call`` with the given params (pruned ones, for
instance ``fprune.apply_masks(params, masks)``), so its own parameters are not read and nothing
of it is modified; the forward hooks that observe the layers' inputs are removed before the
function returns, also when it raises.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterable

import torch
from torch.func import functional_call

from fprune import _torch, _tree
from fprune._types import Params

__all__ = ["input_norms"]


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): a linear layer whose weight is stored ``(in, out)``."""
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")


@torch.no_grad()
def input_norms(
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    *,
    where: _tree.Where = None,
) -> Dict[str, torch.Tensor]:
    """The L2 norm of every input feature of every linear layer over all calibration tokens.

    For each ``nn.Linear`` (and transformers' ``Conv1D``) of ``module``, the square root of the
    sum of squares of each input feature over every token of every batch (all leading dims of
    the layer's input), keyed by the layer's weight name and shaped to broadcast against that
    weight: ``(1, in)`` for ``nn.Linear`` (weight ``(out, in)``), ``(in, 1)`` for ``Conv1D``
    (weight ``(in, out)``), so a square weight is unambiguous. A layer called several times
    accumulates over every call. Feed the result to :func:`fprune.scores.wanda`. Sums are
    accumulated in float64 (float32 on a device without float64, such as MPS: a relative
    error of about 1e-7 per addition) and returned in the weight's dtype (at least float32).

    Args:
        module: the ``torch.nn.Module``.
        params: a flat dict keyed like ``module.named_parameters()`` (a part is fine; the
            others are the module's own), as for :func:`fprune.masked_call`.
        batches: an iterable of batches, read once: a tensor is called as ``module(b)``, a tuple
            (or list) as ``module(*b)``, a dict as ``module(**b)``.
        where: ``where(name, weight) -> bool`` (or ``where(weight)``) picks the layers by weight
            name (all when ``None``).

    Returns:
        ``{weight name: norms}`` for the layers selected that received any input.

    Warns:
        UserWarning: naming the selected layers that received no input (unused layers, and
            ``nn.MultiheadAttention``'s ``out_proj``, whose weight the attention reads without
            calling the layer; its ``in_proj_weight`` is no linear layer at all): ``wanda``
            scores those by ``|W|`` alone.

    Raises:
        TypeError / ValueError: a bad ``module``, ``params``, ``where``, a batch of another kind,
            or no batch at all.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        >>> x = torch.tensor([[3.0, 0.0], [4.0, 1.0]])
        >>> norms = fprune.calibration.input_norms(model, dict(model.named_parameters()), [x])
        >>> norms["0.weight"]
        tensor([[5., 1.]])
        >>> norms["2.weight"].shape
        torch.Size([1, 3])
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(params, dict):
        raise TypeError(
            f"Expected params to be a flat dict of name -> tensor (as module.named_parameters() "
            f"gives), got {type(params).__name__}."
        )
    _tree.flatten(params, "params")
    picks = _tree.predicate(where)  # fprune's one rule for where=; raises naming where
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            f"Expected batches to be an iterable of batches (one batch is [batch]), got "
            f"{type(batches).__name__}."
        )
    # A weight tied to another parameter (GPT-2's lm_head and wte) goes by the one name that
    # named_parameters() lists it under, the key it has in params; its uses accumulate together.
    canonical = {id(p): name for name, p in module.named_parameters()}
    observed = []  # (layer, weight name)
    weights = {}  # weight name -> (weight, stored transposed?)
    for prefix, layer in module.named_modules():
        if isinstance(layer, torch.nn.Linear) or _is_conv1d(layer):
            name = canonical.get(id(layer.weight), f"{prefix}.weight" if prefix else "weight")
            weight = params.get(name, layer.weight)
            if picks is None or picks(name, weight):
                observed.append((layer, name))
                weights.setdefault(name, (weight, _is_conv1d(layer)))

    sums: Dict[str, torch.Tensor] = {}

    def observer(name):
        def hook(layer, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            x = x.detach().reshape(-1, x.shape[-1]).to(_accumulator(x.device))
            total = x.square().sum(0)
            sums[name] = total if name not in sums else sums[name] + total

        return hook

    handles = []
    try:
        for layer, name in observed:
            handles.append(layer.register_forward_pre_hook(observer(name), with_kwargs=True))
        seen = 0
        for batch in batches:
            if isinstance(batch, torch.Tensor):
                functional_call(module, params, (batch,))
            elif isinstance(batch, (tuple, list)):
                functional_call(module, params, tuple(batch))
            elif isinstance(batch, dict):
                functional_call(module, params, (), batch)
            else:
                raise TypeError(
                    f"Expected every batch to be a tensor, a tuple or a dict of inputs, got "
                    f"{type(batch).__name__}."
                )
            seen += 1
        if not seen:
            raise ValueError("Expected at least one batch in batches, got none.")
    finally:
        for handle in handles:
            handle.remove()

    # A layer that never ran (nn.MultiheadAttention reads out_proj.weight without calling
    # out_proj, so every nn.TransformerEncoderLayer has one) has no norms: wanda would score it
    # by magnitude alone, silently. Say so, once for all of them.
    silent = sorted({name for _, name in observed if name not in sums})
    if silent:
        attention = [n for n in silent if n.endswith("out_proj.weight")]
        why = (
            " (nn.MultiheadAttention reads out_proj.weight without calling out_proj)"
            if attention else ""
        )
        warnings.warn(
            f"input_norms: no input reached {len(silent)} selected linear layer(s){why}: "
            f"{_tree.listing([repr(n) for n in silent])}. They get no norms, so "
            f"fprune.scores.wanda scores them by |W| alone; leave them out with where= to "
            f"silence this.",
            UserWarning,
            stacklevel=3,  # past torch.no_grad's wrapper, at the caller's line
        )
    out = {}
    for name, total in sums.items():
        weight, transposed = weights[name]
        norms = total.sqrt().to(torch.promote_types(weight.dtype, torch.float32))
        out[name] = norms.view(-1, 1) if transposed else norms.view(1, -1)
    return out


def _accumulator(device: torch.device) -> torch.dtype:
    """The dtype of the sums: float64, or float32 where the device has no float64 (MPS)."""
    return torch.float64 if _torch.has_float64(device) else torch.float32
