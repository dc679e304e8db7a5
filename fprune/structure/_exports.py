"""Private: the last ``torch.export`` of each module, reused while nothing export depends on changed.

:func:`~fprune.structure.groups` and :func:`~fprune.compact_graph` both export the module on the
example inputs, and exporting is most of their time (seconds for a torchvision model, more with
dynamic shapes). Calling them again on the same module, as a sweep over amounts does, reuses the
module's last exported program when its *key* is unchanged. The key holds what the traced graph
can depend on:

- the module tree: each submodule's name, identity, class, ``forward`` (the class's and an
  instance's own) and forward hooks, and the global forward hooks (not the training flags:
  export always runs in eval mode);
- each parameter's and buffer's name, identity, shape, dtype, device and ``requires_grad``, and
  each plain tensor attribute's identity, shape, dtype and version;
- each submodule's plain attributes (numbers, strings, None, and tuples, lists and dicts of them),
  and those of a config-like object one level down (Hugging Face's ``config``);
- the inputs' tree structure, each tensor's shape, dtype, device and ``requires_grad``, and each
  other input's value (numbers, strings, None only);
- ``dynamic_shapes``, the torch version, the default dtype and grad mode.

An input or ``dynamic_shapes`` the key cannot describe exactly (another object) means no reuse:
the module is exported again. Parameter *values* are not in the key: the graph does not depend on
them (export traces with fake tensors), and the program holds the module's own tensors (the key
has their identities), so :func:`~fprune.compact_graph` reads the values as they are now. Only
the last export of each module is kept, weakly keyed by the module, so it goes with the module;
the program shares the module's tensors and holds no copies.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["exported", "forget"]

_LAST: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, Any]] = weakref.WeakKeyDictionary()

_SIMPLE = (bool, int, float, str, type(None))

# Plain values longer than this are not described (the key says "unknown" and export runs).
_MAX_ITEMS = 256


class _Unknown(Exception):
    """A value the key cannot describe exactly."""


def _plain(value: Any, depth: int = 0) -> Any:
    """A hashable description of a plain value, or raise :class:`_Unknown`."""
    if isinstance(value, _SIMPLE):
        return (type(value).__name__, value)
    if depth < 3 and isinstance(value, (tuple, list)) and len(value) <= _MAX_ITEMS:
        return (type(value).__name__, tuple(_plain(v, depth + 1) for v in value))
    if depth < 3 and isinstance(value, dict) and len(value) <= _MAX_ITEMS:
        return ("dict", tuple((_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, torch.dtype | torch.device):
        return (type(value).__name__, str(value))
    raise _Unknown


def _attributes(obj: Any, deep: bool) -> tuple:
    """The plain public attributes of ``obj`` (and, with ``deep``, of its config-like objects)."""
    out: list[tuple] = []
    for name, value in sorted(vars(obj).items()):
        if name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor):
            out.append((name, "tensor", id(value), tuple(value.shape), value.dtype, value._version))
            continue
        try:
            out.append((name, _plain(value)))
        except _Unknown:
            if deep and not isinstance(value, torch.nn.Module) and hasattr(value, "__dict__"):
                out.append((name, type(value), _attributes(value, deep=False)))
    return tuple(out)


def _hooks(m: torch.nn.Module) -> tuple:
    return tuple(
        tuple(id(h) for h in getattr(m, attr, {}).values())
        for attr in ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs")
    )


def _own_forward(m: torch.nn.Module) -> Any:
    """An instance's own ``forward`` (by identity and code; a bound method or closure is not
    kept, since it may reference the module, which the key must not keep alive)."""
    f = m.__dict__.get("forward")
    if f is None:
        return None
    return id(f), getattr(getattr(f, "__func__", f), "__code__", None)


def _module_key(module: torch.nn.Module) -> tuple:
    from torch.nn.modules import module as module_mod

    tree = tuple(
        (
            name,
            id(m),
            type(m),
            type(m).forward,
            _own_forward(m),
            _hooks(m),
            _attributes(m, deep=True),
        )
        for name, m in module.named_modules(remove_duplicate=False)
    )
    tensors = tuple(
        (name, id(t), tuple(t.shape), t.dtype, t.device, t.requires_grad)
        for named in (
            module.named_parameters(remove_duplicate=False),
            module.named_buffers(remove_duplicate=False),
        )
        for name, t in named
    )
    global_hooks = tuple(
        tuple(id(h) for h in getattr(module_mod, attr, {}).values())
        for attr in ("_global_forward_pre_hooks", "_global_forward_hooks")
    )
    return tree, tensors, global_hooks


def _inputs_key(args: tuple, kwargs: dict) -> tuple:
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    described = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            described.append(("tensor", tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad))
        else:
            described.append(_plain(leaf))
    text = str(spec)
    if " at 0x" in text:  # an object held in the tree's structure (a pytree constant), not described
        raise _Unknown
    return text, tuple(described)


def _dynamic_key(dynamic_shapes: Any) -> str:
    text = repr(dynamic_shapes)
    if " at 0x" in text:  # an object without a value repr: not described exactly
        raise _Unknown
    return text


def key_of(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any) -> tuple | None:
    """What the export of ``module(*args, **kwargs)`` depends on, or None where it cannot say."""
    try:
        return (
            torch.__version__,
            torch.get_default_dtype(),
            torch.is_grad_enabled(),
            _dynamic_key(dynamic_shapes),
            _inputs_key(args, kwargs),
            _module_key(module),
        )
    except _Unknown:
        return None


def exported(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    dynamic_shapes: Any,
    export: Callable[[torch.nn.Module, tuple, dict, Any], Any],
) -> Any:
    """``export(module, args, kwargs, dynamic_shapes)``, or the module's last exported program
    when the key (see the module docstring) is the same as then."""
    key = key_of(module, args, kwargs, dynamic_shapes)
    if key is not None:
        last = _LAST.get(module)
        if last is not None and last[0] == key:
            return last[1]
    ep = export(module, args, kwargs, dynamic_shapes)
    if key is None:
        _LAST.pop(module, None)
    else:
        _LAST[module] = (key, ep)
    return ep


def forget(module: torch.nn.Module) -> None:
    """Drop ``module``'s kept export: the next :func:`groups` or :func:`~fprune.compact_graph`
    on it exports it again.

    Needed only after changing something the forward reads that the reuse does not compare (a
    global, or a mutable object the forward reads that is not a plain attribute of a submodule).

    Args:
        module: the model given to ``groups`` / ``compact_graph``.

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> s = fprune.structure.groups(net, (torch.randn(2, 4),))
        >>> fprune.structure.forget(net)  # the next groups(net, ...) exports again
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    _LAST.pop(module, None)
