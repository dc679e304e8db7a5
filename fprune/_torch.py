"""Private: every private or version-dependent torch API fprune uses, each behind one function.

torch may move or drop its private names in any release; when it does, only this module changes,
``import fprune`` keeps working, and every function here falls back to an answer that is always
correct, if slower or less convenient:

* a probe that cannot tell whether code is being traced answers "traced", so the selection takes
  its traced path (a stable sort), which is correct everywhere, eager code included;
* the same answer makes fprune.compat hand out the plain pruned tensor (torch's own behaviour),
  without the marks that let ``copy.deepcopy`` copy it;
* a module snapshot that cannot name torch's containers copies every one it finds.

Checked on torch 2.13.0 (the oldest and newest version fprune is tested on; see pyproject.toml).
The attributes through which ``torch.nn.utils.prune`` itself talks to modules and hooks
(``module._forward_pre_hooks``, ``module._parameters``, ``module._buffers``, ``hook._tensor_name``,
``PruningContainer._pruning_methods``) are the contract fprune.compat interoperates with, and are
used in fprune.compat directly.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict, Iterable, Optional

import torch
import torch.nn.utils.prune as _torch_prune


def _lookup(path: str) -> Optional[Callable[..., Any]]:
    """The object at the dotted ``path`` under ``torch``, or None if this torch has none there."""
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _import_dispatch_mode_probe() -> Optional[Callable[[], Any]]:
    # torch 2.13.0: torch.utils._python_dispatch._get_current_dispatch_mode.
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:
        return None
    return _get_current_dispatch_mode


# Each probe is None where this torch lacks it; the functions below then fall back.
# torch 2.13.0: public torch.compiler.is_compiling; torch._dynamo.is_compiling before it existed.
_IS_COMPILING = _lookup("torch.compiler.is_compiling") or _lookup("torch._dynamo.is_compiling")
_DISPATCH_MODE = _import_dispatch_mode_probe()
# torch 2.13.0: torch._C._functorch.is_functorch_wrapped_tensor (True for vmap/grad wrappers).
_IS_FUNCTORCH_WRAPPED = _lookup("torch._C._functorch.is_functorch_wrapped_tensor")


def is_compiling() -> bool:
    """True while ``torch.compile`` (dynamo) or ``torch.jit.trace`` traces; True when this torch cannot tell."""
    if _IS_COMPILING is None:
        return True
    return bool(_IS_COMPILING()) or torch.jit.is_tracing()


def in_dispatch_mode() -> bool:
    """True inside a Python dispatch mode (make_fx, fake tensors); True when this torch cannot tell."""
    if _DISPATCH_MODE is None:
        return True
    return _DISPATCH_MODE() is not None


def is_functorch_wrapped(tensor: torch.Tensor) -> bool:
    """True for a tensor wrapped by a torch.func transform; True when this torch cannot tell."""
    if _IS_FUNCTORCH_WRAPPED is None:
        return True
    return bool(_IS_FUNCTORCH_WRAPPED(tensor))


def is_traced(tensors: Iterable[torch.Tensor]) -> bool:
    """True inside torch.compile, jit tracing, a dispatch mode (make_fx, fake tensors) or torch.func.

    Where a probe is missing from this torch the answer is True: the traced path is always correct.
    """
    if is_compiling() or in_dispatch_mode():
        return True
    return any(is_functorch_wrapped(t) for t in tensors)


# ---------------------------------------------------------------------------------------------
# nn.Module state, for fprune.compat's all-or-nothing calls


class ModuleSnapshot:
    """Everything a pruning call may change in one module, to put back exactly if the call fails.

    That is the module's ``__dict__`` (its attributes) and the contents of every dict and set it
    holds there: torch keeps parameters, buffers, submodules and every kind of hook in such
    containers (``_parameters``, ``_buffers``, ``_forward_pre_hooks``, ... in torch 2.13.0). The
    containers are found by type, not by name, so a container a later torch adds is covered too.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.attrs = dict(module.__dict__)
        self.containers = [
            (value, value.copy()) for value in self.attrs.values() if type(value) in _CONTAINERS
        ]

    def restore(self) -> None:
        attrs = self.module.__dict__
        for key in [k for k in attrs if k not in self.attrs]:
            del attrs[key]
        attrs.update(self.attrs)
        for live, saved in self.containers:
            live.clear()
            live.update(saved)


# The container types torch 2.13.0 keeps in a module's __dict__; copy() keeps type and order.
_CONTAINERS = frozenset({dict, set, collections.OrderedDict})


# ---------------------------------------------------------------------------------------------
# torch.nn.utils.prune's private helpers


_PRUNE_HELPER_NAMES = (
    "_compute_norm",
    "_compute_nparams_toprune",
    "_validate_pruning_amount",
    "_validate_pruning_amount_init",
    "_validate_pruning_dim",
    "_validate_structured_pruning",
)

# torch 2.13.0 has all six; fprune.compat re-exports those this torch has, for custom methods
# written against them (``prune._compute_nparams_toprune``). fprune itself never calls them.
PRUNE_HELPERS: Dict[str, Any] = {
    name: getattr(_torch_prune, name)
    for name in _PRUNE_HELPER_NAMES
    if hasattr(_torch_prune, name)
}
