"""Calibration statistics collected by running a module on data: Wanda's input-feature norms and
SparseGPT's layer hessians, and the statistics as objects that post-training methods name.

A statistic (:class:`Statistic`) says what a method needs of a linear layer's inputs: how the
inputs are accumulated into partial sums (a flat dict of tensors, each a sum over input rows)
and how the summed partial sums become the layer's statistic. :class:`Hessian` is SparseGPT's
``2/n sum x x^T``, :class:`InputNorms` Wanda's per-feature L2 norms, :class:`NoData` a method
that needs no data. :func:`hessians` and :func:`input_norms` run a module and finish them for
every linear layer; :func:`fprune.oneshot.prune` does the same one block at a time for the
statistic its method names.

The module runs through ``torch.func.functional_call`` with the given params (pruned ones, for
instance ``fprune.apply_masks(params, masks)``), so its own parameters are not read and nothing
of it is modified; the forward hooks that observe the layers' inputs are removed before the
function returns, also when it raises. Layers whose inputs are one tensor (the query, key and
value projections of an attention; gate and up of a gated MLP) share one set of partial sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fprune import _torch, _tree
from fprune._observe import (
    Accumulator,
    calls,
    check,
    linear_layers,
    observing,
    run,
    warn_nonfinite,
    warn_silent,
)
from fprune._types import Params

__all__ = ["Hessian", "InputNorms", "NoData", "Statistic", "hessians", "input_norms"]

Sums = dict[str, torch.Tensor]


class Statistic:
    """What a post-training method needs of a linear layer's inputs: accumulated, summed, finished.

    A statistic owns three things:

    - its accumulation: :meth:`add` adds input rows ``x`` ``(rows, in)`` of the layer to
      its partial sums;
    - its partial sums: a flat dict ``{key: tensor}`` whose every entry is a sum over input rows
      (a row count too, as a tensor). Partial sums of disjoint inputs add entry by entry, so
      the sums of several processes (ranks) become those of all their rows by summing each
      tensor across them (``torch.distributed.all_reduce`` with ``SUM``), in any order of keys;
    - its finish: :meth:`finish` turns the summed partial sums into what the method's
      ``prune_layer`` receives.

    Statistics are compared by value (``Hessian() == Hessian()``): equal statistics are
    accumulated once. A subclass is a frozen dataclass that overrides both methods (and
    ``needs_data = False`` for a method that reads no data, as :class:`NoData`).

    Example:
        >>> import torch, fprune
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Means(fprune.calibration.Statistic):      # the mean of each input feature
        ...     def add(self, sums, x):
        ...         total, rows = x.sum(0), torch.tensor(x.shape[0])
        ...         sums["sum"] = sums["sum"] + total if "sum" in sums else total
        ...         sums["rows"] = sums["rows"] + rows if "rows" in sums else rows
        ...     def finish(self, sums, dtype):
        ...         return (sums["sum"] / sums["rows"]).to(dtype).view(1, -1)
        >>> sums = {}
        >>> Means().add(sums, torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
        >>> Means().finish(sums, torch.float32)
        tensor([[2., 4.]])
    """

    needs_data: ClassVar[bool] = True

    def add(self, sums: Sums, x: torch.Tensor) -> None:
        """Add the input rows ``x`` ``(rows, in)`` (any float dtype, detached) to ``sums``, in
        place (``sums`` is empty on the layer's first input: create the entries)."""
        raise NotImplementedError(f"{type(self).__name__} must override add")

    def finish(self, sums: Sums, dtype: torch.dtype) -> Any:
        """The layer's statistic from its summed partial sums (which it may reuse or free),
        for a method working in ``dtype`` (float32, float64 for a float64 model); tensors
        shaped for the weight as ``(out, in)``."""
        raise NotImplementedError(f"{type(self).__name__} must override finish")


@dataclass(frozen=True)
class NoData(Statistic):
    """No statistic: the method reads no data (magnitude). ``finish`` gives ``None``.

    Example:
        >>> import torch, fprune
        >>> fprune.calibration.NoData().finish({}, torch.float32) is None
        True
    """

    needs_data: ClassVar[bool] = False

    def add(self, sums: Sums, x: torch.Tensor) -> None:
        pass

    def finish(self, sums: Sums, dtype: torch.dtype) -> None:
        return None


def _accumulator(requested: torch.dtype, device: torch.device) -> torch.dtype:
    """``requested`` where the device holds it; float32 for float64 where it does not (MPS)."""
    if requested == torch.float64 and not _torch.has_float64(device):
        return torch.float32
    return requested


def _check_accumulate(accumulate: Any) -> None:
    if accumulate not in (torch.float32, torch.float64):
        raise ValueError(f"Expected accumulate to be torch.float32 or torch.float64, got {accumulate!r}.")


@dataclass(frozen=True)
class Hessian(Statistic):
    """SparseGPT's layer hessian ``H = 2/n * sum x x^T`` over the ``n`` input rows, ``(in, in)``.

    Partial sums: ``"xtx"`` (``sum x^T x``, ``(in, in)``) and ``"rows"`` (``n``, an int64
    scalar tensor). Each input's product is computed and added in ``accumulate``'s dtype:
    float32 by default (a float64 model's inputs stay float64), float64 on request (float32 on a
    device without float64, such as MPS). The float32 sum carries a relative rounding error
    of about ``1e-7`` per addition: on 8 batches of 128 rows of unit-variance inputs the
    hessian's entries differ from the float64 sum's by about ``1e-6`` relative to its largest
    entry (see ``tests/posttrain/test_posttrain_statistics.py``), far below SparseGPT's
    damping (``1e-2`` of the mean diagonal); float64 is the reference's precision, and its
    sums in float64 take twice the memory (``8 * in^2`` bytes a set of layers).

    Args:
        accumulate: ``torch.float32`` (default) or ``torch.float64``.

    Example:
        >>> import torch, fprune
        >>> sums = {}
        >>> fprune.calibration.Hessian().add(sums, torch.tensor([[1.0, 2.0], [3.0, 0.0]]))
        >>> fprune.calibration.Hessian().finish(sums, torch.float32)
        tensor([[10.,  2.],
                [ 2.,  4.]])
    """

    accumulate: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        _check_accumulate(self.accumulate)

    def add(self, sums: Sums, x: torch.Tensor) -> None:
        dtype = torch.promote_types(x.dtype, _accumulator(self.accumulate, x.device))
        x = x.to(dtype)
        if "xtx" not in sums:
            sums["xtx"] = torch.zeros(x.shape[1], x.shape[1], dtype=dtype, device=x.device)
            sums["rows"] = torch.zeros((), dtype=torch.int64, device=x.device)
        sums["xtx"].addmm_(x.T, x)
        sums["rows"] += x.shape[0]

    def finish(self, sums: Sums, dtype: torch.dtype) -> torch.Tensor:
        rows = int(sums["rows"])
        if not rows:
            raise ValueError(
                "received 0 input rows: every calibration batch was empty (0 rows); give batches "
                "with at least one row."
            )
        total = sums.pop("xtx")
        total.mul_(2.0 / rows)
        return total.to(torch.promote_types(dtype, torch.float32))


@dataclass(frozen=True)
class InputNorms(Statistic):
    """Wanda's input norms: the L2 norm of each input feature over the input rows, ``(1, in)``.

    Partial sums: ``"squares"``, the sum of squares of each feature ``(in,)``, in
    ``accumulate``'s dtype (float64 by default; float32 on a device without float64).

    Args:
        accumulate: ``torch.float64`` (default) or ``torch.float32``.

    Example:
        >>> import torch, fprune
        >>> sums = {}
        >>> fprune.calibration.InputNorms().add(sums, torch.tensor([[3.0, 0.0], [4.0, 1.0]]))
        >>> fprune.calibration.InputNorms().finish(sums, torch.float32)
        tensor([[5., 1.]])
    """

    accumulate: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        _check_accumulate(self.accumulate)

    def add(self, sums: Sums, x: torch.Tensor) -> None:
        total = x.to(_accumulator(self.accumulate, x.device)).square().sum(0)
        sums["squares"] = sums["squares"] + total if "squares" in sums else total

    def finish(self, sums: Sums, dtype: torch.dtype) -> torch.Tensor:
        return sums["squares"].sqrt().to(torch.promote_types(dtype, torch.float32)).view(1, -1)


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
    accumulates over every call. Feed the result to :func:`fprune.scores.wanda`. The
    :class:`InputNorms` statistic: sums accumulated in float64 (float32 on a device without
    float64, such as MPS: a relative error of about 1e-7 per addition) and returned in the
    weight's dtype (at least float32).

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
    return _collect(
        "input_norms",
        InputNorms(),
        module,
        params,
        batches,
        where,
        None,
        "They get no norms, so fprune.scores.wanda scores them by |W| alone",
        "Their norms are not finite.",
    )


@torch.no_grad()
def hessians(
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    *,
    where: _tree.Where = None,
    kwargs: dict | None = None,
    accumulate: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """SparseGPT's layer hessians ``H = 2/n * sum x x^T`` over every input row of every batch.

    For each ``nn.Linear`` (and transformers' ``Conv1D``) of ``module`` whose weight ``where``
    selects, ``x`` runs over every input row the layer receives (all leading dims of its input
    flattened, every call of every batch; ``n`` rows in all), so ``H`` is ``(in, in)`` for
    both layouts. ``H`` is the hessian of the layer's squared reconstruction error
    ``sum ||x W^T - x W'^T||^2 / n`` in each output row: what :func:`fprune.reconstruct.sparsegpt`
    and :func:`fprune.reconstruct.refine` take. The :class:`Hessian` statistic: products and
    sums in ``accumulate``'s dtype (float32 by default, float64 for float64 inputs; float64 on
    request), returned in the weight's dtype, at least float32.

    Args:
        module: the ``torch.nn.Module``.
        params: a flat dict keyed like ``module.named_parameters()`` (a part is fine; the others
            are the module's own), as for :func:`fprune.masked_call`.
        batches: an iterable of batches, read once: a tensor is called as ``module(b)``, a tuple
            (or list) as ``module(*b)``, a dict as ``module(**b)``.
        where: ``where(name, weight) -> bool`` (or ``where(weight)``)
            picks the layers by weight name (all when ``None``).
        kwargs: keyword arguments added to every call (a dict batch's own keys win).
        accumulate: ``torch.float32`` or ``torch.float64``: the dtype of the sums.

    Returns:
        ``{weight name: H}`` for the layers selected that received any input; a weight tied to
        another parameter goes by the name ``named_parameters()`` lists it under.

    Warns:
        UserWarning: naming the selected layers that received no input, and those whose inputs
            held NaN or inf (their hessians are not finite).

    Raises:
        TypeError / ValueError: a bad ``module``, ``params`` (a key that names no parameter or
            buffer, a wrong shape), ``where``, ``kwargs``, ``accumulate``, a module on the meta
            device, a batch of another kind, no batch at all, or only empty batches (0 rows).

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(2, 1)
        >>> x = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
        >>> fprune.calibration.hessians(model, dict(model.named_parameters()), [x])["weight"]
        tensor([[10.,  2.],
                [ 2.,  4.]])
    """
    check(module, params, batches, where, kwargs)
    statistic = Hessian(accumulate)
    return _collect(
        "hessians",
        statistic,
        module,
        params,
        batches,
        where,
        kwargs,
        "They get no hessian",
        "Their hessians are not finite.",
    )


def _collect(
    function: str,
    statistic: Statistic,
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    where: _tree.Where,
    kwargs: dict | None,
    silent: str,
    nonfinite: str,
) -> dict[str, torch.Tensor]:
    """Run the module once over the batches and finish ``statistic`` for every selected layer,
    in the weight's dtype and layout (a ``Conv1D``'s norms ``(in, 1)``)."""
    layers = linear_layers(module, params, where)
    sums = Accumulator(statistic)
    with observing(layers, sums):
        run(module, params, calls(batches, kwargs))
    warn_silent(function, layers, sums.sums, silent, stacklevel=5)
    warn_nonfinite(function, sums.nonfinite(), nonfinite, stacklevel=5)
    out: dict[str, torch.Tensor] = {}
    columns = isinstance(statistic, InputNorms)  # a Conv1D's norms broadcast as (in, 1)
    for layer in layers:
        if layer.name in sums.sums and layer.name not in out:
            value = sums.finish(layer.name, layer.weight.dtype, copy=True)
            out[layer.name] = value.view(-1, 1) if layer.transposed and columns else value
    return out
