"""Private: observing the inputs of a module's linear layers while it runs (calibration).

Shared by :mod:`fprune.calibration` and :mod:`fprune.oneshot`: which layers are observed
(``nn.Linear`` and transformers' ``Conv1D``), forward pre-hooks that are removed on exit also
when the body raises, how batches become calls, and the partial sums of a statistic per layer
(layers fed one input tensor share them).
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
    """Forward pre-hooks that hand each selected layer's input tensor (the object the layer
    receives) to ``observe(name, x)``; removed on exit, also when the body raises. On a normal
    exit ``observe.flush()`` is called where it has one (an :class:`Accumulator`)."""

    def hook_for(name: str) -> Callable[[torch.nn.Module, tuple, dict], None]:
        def hook(layer: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            observe(name, args[0] if args else next(iter(kwargs.values())))

        return hook

    handles = []
    try:
        for layer in layers:
            handles.append(layer.module.register_forward_pre_hook(hook_for(layer.name), with_kwargs=True))
        yield
        flush = getattr(observe, "flush", None)
        if flush is not None:
            flush()
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


def check(
    module: Any, params: Any, batches: Any, where: Any, kwargs: Any = None, *, meta_ok: bool = False
) -> None:
    _tree.check_module_and_params(module, params)
    _tree.flatten(params, "params")
    check_params(module, params, meta_ok=meta_ok)
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


def check_params(module: torch.nn.Module, params: dict, *, meta_ok: bool = False) -> None:
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
    if meta and not meta_ok:
        raise ValueError(
            f"The module runs with tensors on the meta device (no values): "
            f"{_tree.listing([repr(n) for n in meta])}; load its weights first (for instance "
            f"module.to_empty(device=...) and load_state_dict), or pass them in params."
        )


def warn_nonfinite(function: str, bad: list[str], consequence: str, stacklevel: int = 4) -> list[str]:
    """Warn, naming the layers, where a layer's statistics are NaN or inf (its inputs were);
    return those names."""
    if bad:
        warnings.warn(
            f"{function}: the inputs of {len(bad)} linear layer(s) hold NaN or inf, so their "
            f"statistics do: {_tree.listing([repr(n) for n in bad])}. {consequence}",
            UserWarning,
            stacklevel=stacklevel,  # 4: past torch.no_grad's wrapper, at the caller's line
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


class Accumulator:
    """The partial sums of one statistic for each observed layer (private to fprune): the
    observer that :func:`observing` feeds, then :meth:`finish` per layer.

    ``statistic`` is a :class:`fprune.calibration.Statistic` (``add(sums, x)``,
    ``finish(sums, dtype)``). Layers whose pre-hooks receive one tensor in a row, unchanged
    (the query, key and value projections reading the same hidden states; gate and up), share
    one table of partial sums, added to once per input, for as long as every input that one
    of them received reached the others too; a layer whose inputs part from the others' gets a
    copy of the table first, so each layer's sums are always exactly those of its own inputs.
    """

    def __init__(self, statistic: Any) -> None:
        self.statistic = statistic
        self.sums: dict[str, dict[str, torch.Tensor]] = {}  # layer name -> its table (shared)
        self._pending: tuple[torch.Tensor, int | None, list[str]] | None = None
        self._finished: dict[tuple[int, torch.dtype], tuple[dict, Any]] = {}

    def __call__(self, name: str, x: torch.Tensor) -> None:
        pending = self._pending
        if (
            pending is not None
            and x is pending[0]
            and pending[1] is not None
            and _torch.tensor_version(x) == pending[1]
            and name not in pending[2]
        ):
            pending[2].append(name)
            return
        self.flush()
        self._pending = (x, _torch.tensor_version(x), [name])

    def flush(self) -> None:
        """Add the last input to the tables of the layers that received it."""
        if self._pending is None:
            return
        x, _, names = self._pending
        self._pending = None
        rows = x.detach().reshape(-1, x.shape[-1])
        fresh = [name for name in names if name not in self.sums]
        tables: dict[int, list[str]] = {}
        for name in names:
            if name in self.sums:
                tables.setdefault(id(self.sums[name]), []).append(name)
        for members in tables.values():
            table = self.sums[members[0]]
            if sum(t is table for t in self.sums.values()) > len(members):  # others did not get x
                table = {key: value.clone() for key, value in table.items()}
                for name in members:
                    self.sums[name] = table
            self.statistic.add(table, rows)
        if fresh:
            table = {}
            self.statistic.add(table, rows)
            for name in fresh:
                self.sums[name] = table

    def tables(self) -> list[dict[str, torch.Tensor]]:
        """The distinct tables of partial sums, in the order of their first layer's name: each
        entry a sum over input rows (what a sum across ranks adds, entry by entry)."""
        seen: dict[int, dict[str, torch.Tensor]] = {}
        for name in sorted(self.sums):
            seen.setdefault(id(self.sums[name]), self.sums[name])
        return list(seen.values())

    def nonfinite(self) -> list[str]:
        """The layers whose partial sums hold NaN or inf."""
        return sorted(
            name
            for name, table in self.sums.items()
            if not all(bool(torch.isfinite(v).all()) for v in table.values() if v.is_floating_point())
        )

    def finish(self, name: str, dtype: torch.dtype, *, copy: bool = False) -> Any:
        """The statistic of layer ``name`` for work in ``dtype``; the layer's table is released
        (a table shared with other layers is finished once and its result shared, or copied
        with ``copy=True``)."""
        table = self.sums.pop(name)
        shared = any(t is table for t in self.sums.values())
        key = (id(table), dtype)
        if key in self._finished:
            value = self._finished[key][1]
            if not shared:
                del self._finished[key]
            return value.clone() if copy and isinstance(value, torch.Tensor) else value
        try:
            value = self.statistic.finish(table, dtype)
        except ValueError as err:
            raise ValueError(f"The linear layer {name!r} {err}") from err
        if shared:
            self._finished[key] = (table, value)
        return value
