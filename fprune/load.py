"""Putting pruned params back into a module: :func:`load_into`.

fprune's functions return new tensors and leave the module as it was; :func:`load_into` is the
one step that writes them into the module, so that the module's own methods (``generate``,
``save_pretrained``, ``state_dict``, a plain forward) see the pruned weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fprune import _tree

__all__ = ["load_into"]


def load_into(module: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Copy ``params`` into ``module``'s own parameters, in place, and return ``module``.

    Each value is copied into the existing ``nn.Parameter`` of that name without autograd, so the
    module keeps its parameter objects, their dtype, device and ``requires_grad``, its buffers and
    its tied weights: writing ``"transformer.wte.weight"`` of a GPT-2 also changes
    ``"lm_head.weight"``, which is the same parameter. A value of another floating dtype is
    converted to the parameter's (as ``Tensor.copy_`` does); one on another device is moved.

    Every entry is checked before anything is written, so on an error the module is exactly as
    it was.

    Args:
        module: the model to write into (a ``torch.nn.Module``).
        params: a flat mapping keyed like ``module.named_parameters()`` (tied names included),
            for instance the params :func:`fprune.oneshot.prune` returns; a part is fine (the
            other parameters keep their values).

    Returns:
        ``module``, changed in place.

    Raises:
        TypeError: ``module`` is not a module, ``params`` not a mapping, a key not a string, a
            value not a tensor, or a value whose kind (floating, complex, integer, bool) differs
            from its parameter's (``torch.bool`` masks given as params, say).
        ValueError: a key that is no parameter of ``module`` (a buffer, a misspelling, the
            ``weight_orig`` of a ``torch.nn.utils.prune`` hook), a value of another shape, a
            value on the ``meta`` device, or two names of one tied parameter given different
            values.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(4, 2)
        >>> params = dict(model.named_parameters())
        >>> masks = fprune.l1_unstructured(params, 0.5)
        >>> _ = fprune.load_into(model, fprune.apply_masks(params, masks))
        >>> int((model.weight == 0).sum())
        4
    """
    writes = _checked(module, params)
    with torch.no_grad():
        for parameter, value in writes:
            if _same_memory(parameter, value):
                continue  # the parameter itself (or an alias of it): nothing to copy
            parameter.copy_(value)
    return module


def _checked(module: Any, params: Any) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """The ``(parameter, value)`` pairs to write, one per parameter; raises on any bad entry."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(params, Mapping):
        raise TypeError(
            f"Expected params to be a flat mapping of name -> tensor keyed like "
            f"module.named_parameters(), got {type(params).__name__}."
        )
    own = dict(module.named_parameters(remove_duplicate=False))
    buffers = {name for name, _ in module.named_buffers(remove_duplicate=False)}
    chosen: dict[int, tuple[str, torch.nn.Parameter, torch.Tensor]] = {}
    for name, value in params.items():
        if not isinstance(name, str):
            raise TypeError(
                f"Expected the keys of params to be parameter names (str), got {name!r} "
                f"({type(name).__name__})."
            )
        where = f"params[{name!r}]"
        parameter = own.get(name)
        base = _tree.hook_base(name)
        if base is not None and base + "_mask" in buffers:
            raise _hooked(where, base)
        if parameter is None:
            if name in buffers:
                raise ValueError(
                    f"{where} is a buffer of the module, not a parameter; load_into writes "
                    f"parameters only (buffers stay as they are: use module.load_state_dict for them)."
                )
            if name + _tree.HOOK_SUFFIX in own and name + "_mask" in buffers:
                raise _hooked(where, name)
            near = _tree.nearest([name], [[n] for n in own])
            raise ValueError(f"{where}: the module has no parameter named {name!r}{near}.")
        _check_value(where, value, parameter)
        earlier = chosen.get(id(parameter))
        if earlier is not None and earlier[2] is not value:
            other, _, first = earlier
            if not _equal(first, value):
                raise ValueError(
                    f"{where} and params[{other!r}] name one tied parameter of the module but hold "
                    f"different values; give one of the two names (the other follows)."
                )
        chosen.setdefault(id(parameter), (name, parameter, value))
    return [(parameter, value) for _, parameter, value in chosen.values()]


def _hooked(where: str, base: str) -> ValueError:
    orig, mask = base + _tree.HOOK_SUFFIX, base + "_mask"
    return ValueError(
        f"{where}: the module has a torch.nn.utils.prune hook on {base!r} (the parameter "
        f"{orig!r} and the buffer {mask!r}), which recomputes {base!r} from those two before every "
        f"forward, so a value loaded into either would be masked or overwritten. Remove the hooks "
        f"first (fprune.compat.strip_pruning(module), or torch.nn.utils.prune.remove), then load "
        f"params keyed like the unpruned module."
    )


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating"
    return "integer"


def _check_value(where: str, value: Any, parameter: torch.nn.Parameter) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Expected {where} to be a torch.Tensor, got {type(value).__name__}.")
    if value.shape != parameter.shape:
        raise ValueError(
            f"Expected {where} to have the parameter's shape {tuple(parameter.shape)}, got "
            f"{tuple(value.shape)}."
        )
    if _kind(value.dtype) != _kind(parameter.dtype):
        raise TypeError(
            f"Expected {where} to be a {_kind(parameter.dtype)} tensor like the parameter "
            f"({parameter.dtype}), got {value.dtype}"
            + (
                " (masks? pass the pruned params, fprune.apply_masks(params, masks))."
                if value.dtype == torch.bool
                else "."
            )
        )
    if value.is_meta:
        raise ValueError(f"{where} is on the meta device: it holds no values to load.")
    if parameter.is_meta:
        raise ValueError(
            f"The module's parameter for {where} is on the meta device; materialize the module "
            f"first (module.to_empty(device=...))."
        )


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and bool(torch.equal(a, b.to(a.device)))


def _same_memory(parameter: torch.Tensor, value: torch.Tensor) -> bool:
    return (
        value.device == parameter.device
        and value.dtype == parameter.dtype
        and value.data_ptr() == parameter.data_ptr()
        and value.stride() == parameter.stride()
    )
