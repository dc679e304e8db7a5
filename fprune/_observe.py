"""Private: observing the inputs of a module's linear layers while it runs (calibration).

Shared by :mod:`fprune.calibration` and :mod:`fprune.oneshot`: which layers are observed
(``nn.Linear`` and transformers' ``Conv1D``), forward pre-hooks that are removed on exit also
when the body raises, how batches become calls, and the running sums.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch.func import functional_call

from fprune import _torch, _tree
from fprune._types import Where


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): a linear layer whose weight is stored ``(in, out)``."""
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")


def is_linear(module: torch.nn.Module) -> bool:
    """An ``nn.Linear`` or a transformers ``Conv1D``: the layers calibration observes."""
    return isinstance(module, torch.nn.Linear) or _is_conv1d(module)


class Layer(NamedTuple):
    """A linear layer that calibration observes (private to fprune)."""

    module: torch.nn.Module
    name: str  # its weight's key in params (the name named_parameters() lists it under)
    weight: torch.Tensor  # params[name], or the layer's own weight
    transposed: bool  # a Conv1D: weight stored (in, out)


def linear_layers(module: torch.nn.Module, params: dict, where: Where) -> list[Layer]:
    """The ``nn.Linear``/``Conv1D`` layers of ``module`` whose weight ``where`` selects.

    A weight tied to another parameter (GPT-2's lm_head and wte) goes by the one name that
    named_parameters() lists it under, the key it has in params; its uses accumulate together.
    """
    picks = _tree.predicate(where)
    canonical = {id(p): name for name, p in module.named_parameters()}
    layers = []
    for prefix, layer in module.named_modules():
        if is_linear(layer):
            name = canonical.get(id(layer.weight), f"{prefix}.weight" if prefix else "weight")
            weight = params.get(name, layer.weight)
            if picks is None or picks(name, weight):
                layers.append(Layer(layer, name, weight, _is_conv1d(layer)))
    return layers


Call = tuple[tuple, dict]


def calls(batches: Iterable[Any], kwargs: dict | None) -> Iterator[Call]:
    """``(args, kwargs)`` of each batch: a tensor is ``module(b)``, a tuple (or list)
    ``module(*b)``, a dict ``module(**b)``; ``kwargs`` is added to every call. Read lazily."""
    extra = dict(kwargs or {})
    for batch in batches:
        if isinstance(batch, torch.Tensor):
            yield (batch,), extra
        elif isinstance(batch, (tuple, list)):
            yield tuple(batch), extra
        elif isinstance(batch, dict):
            yield (), {**extra, **batch}
        else:
            raise TypeError(
                f"Expected every batch to be a tensor, a tuple or a dict of inputs, got "
                f"{type(batch).__name__}."
            )


@contextlib.contextmanager
def observing(layers: list[Layer], observe: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Forward pre-hooks that hand each selected layer's input, as ``(rows, in)``, to
    ``observe(name, x)``; removed on exit, also when the body raises."""

    def hook_for(name: str) -> Callable[[torch.nn.Module, tuple, dict], None]:
        def hook(layer: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            observe(name, x.detach().reshape(-1, x.shape[-1]))

        return hook

    handles = []
    try:
        for layer in layers:
            handles.append(layer.module.register_forward_pre_hook(hook_for(layer.name), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def run(module: torch.nn.Module, params: dict, calls_: Iterable[Call]) -> int:
    """Call ``module`` with ``params`` on every call; return how many there were (>= 1)."""
    seen = 0
    for args, kwargs in calls_:
        functional_call(module, params, args, kwargs)
        seen += 1
    if not seen:
        raise ValueError("Expected at least one batch in batches, got none.")
    return seen


def check(module: Any, params: Any, batches: Any, where: Any, kwargs: Any = None) -> None:
    _tree.check_module_and_params(module, params)
    _tree.flatten(params, "params")
    check_params(module, params)
    _tree.predicate(where)  # fprune's one rule for where=; raises naming where
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            f"Expected batches to be an iterable of batches (one batch is [batch]), got "
            f"{type(batches).__name__}."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(
            f"Expected kwargs to be None or a dict of keyword arguments for every call, got "
            f"{type(kwargs).__name__}."
        )


def check_params(module: torch.nn.Module, params: dict) -> None:
    """Every key of ``params`` a parameter or buffer of ``module``, of its shape; nothing that
    the module runs with on the meta device."""
    own: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    unknown = sorted(str(k) for k in params if k not in own)
    if unknown:
        raise ValueError(
            f"params has keys that name no parameter or buffer of the module: "
            f"{_tree.listing([repr(k) for k in unknown])} (keys as module.named_parameters() gives them)."
        )
    for name, value in params.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"Expected params[{name!r}] to be a tensor, got {type(value).__name__}.")
        if value.shape != own[name].shape:
            raise ValueError(
                f"Expected params[{name!r}] of the module's shape {tuple(own[name].shape)}, got "
                f"{tuple(value.shape)}."
            )
    meta = sorted(name for name, t in own.items() if params.get(name, t).device.type == "meta")
    if meta:
        raise ValueError(
            f"The module runs with tensors on the meta device (no values): "
            f"{_tree.listing([repr(n) for n in meta])}; load its weights first (for instance "
            f"module.to_empty(device=...) and load_state_dict), or pass them in params."
        )


def warn_nonfinite(function: str, sums: dict[str, torch.Tensor], consequence: str) -> list[str]:
    """Warn, naming the layers, where a layer's statistics are NaN or inf (its inputs were);
    return those names."""
    bad = sorted(name for name, total in sums.items() if not bool(torch.isfinite(total).all()))
    if bad:
        warnings.warn(
            f"{function}: the inputs of {len(bad)} linear layer(s) hold NaN or inf, so their "
            f"statistics do: {_tree.listing([repr(n) for n in bad])}. {consequence}",
            UserWarning,
            stacklevel=4,  # past torch.no_grad's wrapper, at the caller's line
        )
    return bad


def warn_silent(
    function: str, layers: list[Layer], seen: Iterable[str], consequence: str, stacklevel: int = 4
) -> None:
    """Warn, once for all, about selected layers that received no input."""
    # A layer that never ran (nn.MultiheadAttention reads out_proj.weight without calling
    # out_proj, so every nn.TransformerEncoderLayer has one) has no statistics. Say so.
    seen = set(seen)
    silent = sorted({layer.name for layer in layers if layer.name not in seen})
    if not silent:
        return
    attention = [n for n in silent if n.endswith("out_proj.weight")]
    why = " (nn.MultiheadAttention reads out_proj.weight without calling out_proj)" if attention else ""
    warnings.warn(
        f"{function}: no input reached {len(silent)} selected linear layer(s){why}: "
        f"{_tree.listing([repr(n) for n in silent])}. {consequence}; leave them out with "
        f"where= to silence this.",
        UserWarning,
        stacklevel=stacklevel,  # 4: past torch.no_grad's wrapper, at the caller's line
    )


class SumSquares:
    """Running sum of squares of each input feature of each layer (private to fprune), in
    float64 (float32 on a device without float64)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, x: torch.Tensor) -> None:
        total = x.to(accumulator(x.device)).square().sum(0)
        self.sums[name] = total if name not in self.sums else self.sums[name] + total


class Gram:
    """Running ``sum x^T x`` and row count of each layer's inputs (private to fprune).

    Each call's product is computed in float32 (float64 for float64 inputs) and added to a
    float64 sum (float32 on a device without float64).
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}

    def __call__(self, name: str, x: torch.Tensor) -> None:
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        product = (x.T @ x).to(accumulator(x.device))
        if name in self.sums:
            self.sums[name] += product
            self.rows[name] += x.shape[0]
        else:
            self.sums[name] = product
            self.rows[name] = x.shape[0]

    def hessian(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """``2 / n * sum x^T x`` in ``dtype`` (at least float32); the sum is freed."""
        if not self.rows[name]:
            raise ValueError(
                f"The linear layer {name!r} received 0 input rows: every calibration batch was "
                f"empty (0 rows); give batches with at least one row."
            )
        total = self.sums.pop(name)
        total.mul_(2.0 / self.rows[name])
        return total.to(torch.promote_types(dtype, torch.float32))


def accumulator(device: torch.device) -> torch.dtype:
    """The dtype of the sums: float64, or float32 where the device has no float64 (MPS)."""
    return torch.float64 if _torch.has_float64(device) else torch.float32
