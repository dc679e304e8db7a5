"""Calibration statistics collected by running a module on data: Wanda's input-feature norms and
SparseGPT's layer hessians.

The module runs through ``torch.func.functional_call`` with the given params (pruned ones, for
instance ``fprune.apply_masks(params, masks)``), so its own parameters are not read and nothing
of it is modified; the forward hooks that observe the layers' inputs are removed before the
function returns, also when it raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fprune import _tree
from fprune._observe import (
    Gram,
    SumSquares,
    calls,
    check,
    linear_layers,
    observing,
    run,
    warn_nonfinite,
    warn_silent,
)
from fprune._types import Params

__all__ = ["hessians", "input_norms"]


@torch.no_grad()
def input_norms(
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    *,
    where: _tree.Where = None,
) -> dict[str, torch.Tensor]:
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
            scores those by ``|W|`` alone; and those whose inputs held NaN or inf.

    Raises:
        TypeError / ValueError: a bad ``module``, ``params`` (a key that names no parameter or
            buffer, a wrong shape), ``where``, a module on the meta device, a batch of another
            kind, or no batch at all.

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
    check(module, params, batches, where)
    layers = linear_layers(module, params, where)
    observe = SumSquares()
    sums = observe.sums
    with observing(layers, observe):
        run(module, params, calls(batches, None))
    warn_silent(
        "input_norms", layers, sums, "They get no norms, so fprune.scores.wanda scores them by |W| alone"
    )
    warn_nonfinite("input_norms", sums, "Their norms are not finite.")
    out = {}
    for layer in layers:
        if layer.name in sums and layer.name not in out:
            norms = sums[layer.name].sqrt().to(torch.promote_types(layer.weight.dtype, torch.float32))
            out[layer.name] = norms.view(-1, 1) if layer.transposed else norms.view(1, -1)
    return out


@torch.no_grad()
def hessians(
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    *,
    where: _tree.Where = None,
    kwargs: dict | None = None,
) -> dict[str, torch.Tensor]:
    """SparseGPT's layer hessians ``H = 2/n * sum x x^T`` over every input row of every batch.

    For each ``nn.Linear`` (and transformers' ``Conv1D``) of ``module`` whose weight ``where``
    selects, ``x`` runs over every input row the layer receives (all leading dims of its input
    flattened, every call of every batch; ``n`` rows in all), so ``H`` is ``(in, in)`` for
    both layouts. ``H`` is the hessian of the layer's squared reconstruction error
    ``sum ||x W^T - x W'^T||^2 / n`` in each output row: what :func:`fprune.reconstruct.sparsegpt`
    and :func:`fprune.reconstruct.refine` take. Each call's ``x^T x`` is computed in float32
    (float64 for float64 inputs) and summed over calls in float64 (float32 on a device without
    float64); the result is returned in the weight's dtype, at least float32.

    Args:
        module: the ``torch.nn.Module``.
        params: a flat dict keyed like ``module.named_parameters()`` (a part is fine; the others
            are the module's own), as for :func:`fprune.masked_call`.
        batches: an iterable of batches, read once: a tensor is called as ``module(b)``, a tuple
            (or list) as ``module(*b)``, a dict as ``module(**b)``.
        where: ``where(name, weight) -> bool`` (or ``where(weight)``)
            picks the layers by weight name (all when ``None``).
        kwargs: keyword arguments added to every call (a dict batch's own keys win).

    Returns:
        ``{weight name: H}`` for the layers selected that received any input; a weight tied to
        another parameter goes by the name ``named_parameters()`` lists it under.

    Warns:
        UserWarning: naming the selected layers that received no input, and those whose inputs
            held NaN or inf (their hessians are not finite).

    Raises:
        TypeError / ValueError: a bad ``module``, ``params`` (a key that names no parameter or
            buffer, a wrong shape), ``where``, ``kwargs``, a module on the meta device, a batch
            of another kind, no batch at all, or only empty batches (0 rows).

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(2, 1)
        >>> x = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
        >>> fprune.calibration.hessians(model, dict(model.named_parameters()), [x])["weight"]
        tensor([[10.,  2.],
                [ 2.,  4.]])
    """
    check(module, params, batches, where, kwargs)
    layers = linear_layers(module, params, where)
    gram = Gram()
    with observing(layers, gram):
        run(module, params, calls(batches, kwargs))
    warn_silent("hessians", layers, gram.sums, "They get no hessian")
    warn_nonfinite("hessians", gram.sums, "Their hessians are not finite.")
    out = {}
    for layer in layers:
        if layer.name in gram.sums:
            out[layer.name] = gram.hessian(layer.name, layer.weight.dtype)
    return out
