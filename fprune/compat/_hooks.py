"""Private: the module bookkeeping of prune-style re-parametrization, below the pruning methods.

The only module in fprune that knows torch.nn.utils.prune's names (``name + "_orig"``, the
Parameter; ``name + "_mask"``, the buffer) and edits modules' parameters, buffers and hooks:

* :func:`transaction` - a snapshot of modules that is restored if anything inside fails.
* :func:`reparametrize` / :func:`set_mask` - the steps of ``apply`` that change the module.
* :func:`pruned_tensor` - ``mask * orig``, the value of the ``name`` attribute, made safe to
  ``copy.deepcopy`` and ``pickle`` (pytorch#37322).
* :func:`make_permanent` - ``remove`` (and :func:`fprune.compat.strip_pruning`).
* :func:`pruning_hooks` / :func:`existing_hook` - the hooks that prune a tensor.

``BasePruningMethod.apply`` itself, which puts these steps in torch's order, lives with the
methods (:mod:`fprune.compat.methods`), as in torch.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import torch
import torch.nn.utils.prune as _torch_prune

from fprune import _torch
from fprune.compat import _errors

ORIG = "_orig"  # name + ORIG: the Parameter being pruned (the very object that was ``name``)
MASK = "_mask"  # name + MASK: the mask buffer, in the parameter's dtype


def base_name(key: str) -> str | None:
    """``"fc.weight"`` for ``"fc.weight_orig"``; None for a key that is no ``_orig``."""
    return key[: -len(ORIG)] if key.endswith(ORIG) else None


def orig_of(module: torch.nn.Module, name: str) -> torch.nn.Parameter:
    """The ``_orig`` Parameter of pruned ``name`` (``KeyError`` naming it when there is none)."""
    orig = module._parameters.get(name + ORIG)
    if orig is None:
        raise KeyError(name + ORIG)
    return orig


def mask_of(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The mask buffer of pruned ``name`` (``KeyError`` naming it when there is none)."""
    mask = module._buffers.get(name + MASK)
    if mask is None:
        raise KeyError(name + MASK)
    return mask


def mask_if_pruned(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """The mask buffer of ``name``, or None (no AttributeError raised and caught per tensor)."""
    return module._buffers.get(name + MASK)


# ---------------------------------------------------------------------------------------------
# Rollback


class _Snapshot(_torch.ModuleSnapshot):
    """A module snapshot that also restores the history of its pruning containers."""

    __slots__ = ("histories",)

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__(module)
        # Containers are extended in place (torch keeps the hook object): their history too.
        self.histories = [
            (hook, hook._pruning_methods)
            for hook in module._forward_pre_hooks.values()
            if isinstance(hook, _torch_prune.PruningContainer)
        ]

    def restore(self) -> None:
        super().restore()
        for hook, history in self.histories:
            hook._pruning_methods = history


_ACTIVE = threading.local()  # ids of the modules that a transaction of this thread covers


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (restored as it was after it).

    Pruning many tensors at once makes a few small objects per tensor (hooks, snapshots,
    parameters, buffers) that all outlive the call: the collector would run many times
    during it, each run walking every object of the process (most of the call's time at
    thousands of tensors). Reference counting still frees everything as usual; what the
    block leaves for the collector it finds in its next regular run.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class transaction:
    """``with transaction(modules):`` if the block raises, every module is put back exactly as
    it was (then the exception propagates).

    Inside another transaction that covers the same modules this one does nothing: the outer
    one restores them (``global_unstructured`` snapshots each module once, not once more per
    ``apply``). A class, not a generator: it runs once per pruned tensor.
    """

    __slots__ = ("covered", "snapshots")

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        covered = getattr(_ACTIVE, "ids", None)
        if covered is None:
            covered = _ACTIVE.ids = set()
        self.covered = covered
        self.snapshots: dict[int, _Snapshot] = {}
        for module in modules:
            if id(module) not in covered and id(module) not in self.snapshots:
                self.snapshots[id(module)] = _Snapshot(module)

    def __enter__(self) -> None:
        self.covered.update(self.snapshots)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.covered.difference_update(self.snapshots)
        if kind is not None:
            for snapshot in self.snapshots.values():
                snapshot.restore()


# ---------------------------------------------------------------------------------------------
# The pruned tensor (the ``name`` attribute)


def _rebuild_pruned(orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mask * orig`` as the hooks compute it; the target of the pickled/deep-copied attribute."""
    return _with_copy_support(mask.to(dtype=orig.dtype) * orig, orig, mask)


def _deepcopy_pruned(orig: torch.Tensor, mask: torch.Tensor, memo: dict) -> torch.Tensor:
    # copy.deepcopy refuses tensors that are not graph leaves, and the hook-computed attribute
    # is one (pytorch#37322). Deep-copying orig and mask through the same memo gives the very
    # copies the copied module holds: the copy is mask_copy * orig_copy, what its hook computes.
    return _rebuild_pruned(copy.deepcopy(orig, memo), copy.deepcopy(mask, memo))


def _reduce_pruned(
    orig: torch.Tensor, mask: torch.Tensor, protocol: int
) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return _rebuild_pruned, (orig, mask)  # pickled as the product of the restored tensors


def _with_copy_support(pruned: torch.Tensor, orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # copy.deepcopy and pickle look these two up on the instance (getattr), so setting them on
    # this one tensor fixes copying without changing its type, value or grad_fn. Leaves copy
    # fine already; transforms and the compiler get the plain tensor.
    if _torch.is_compiling():
        return pruned  # checked first: the compiler cannot trace .grad_fn
    if pruned.grad_fn is None or _torch.is_functorch_wrapped(pruned):
        return pruned
    pruned.__deepcopy__ = functools.partial(_deepcopy_pruned, orig, mask)  # type: ignore[method-assign]
    pruned.__reduce_ex__ = functools.partial(_reduce_pruned, orig, mask)  # type: ignore[method-assign]
    return pruned


def pruned_tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    """``module.<name>_mask * module.<name>_orig``, read from the module (no copy is kept)."""
    mask = getattr(module, name + MASK)
    orig = getattr(module, name + ORIG)
    return _with_copy_support(mask.to(dtype=orig.dtype) * orig, orig, mask)


def _hooked_module(hook: Any) -> torch.nn.Module | None:
    """The module that ``hook`` (an fprune.compat method: see ``CompatMethod``) was applied to."""
    return hook._module_ref() if hook._module_ref is not None else None


def prepare_attribute_copy(hook: Any, memo: dict) -> None:
    """Let ``copy.deepcopy`` of the hook's module copy its pruned attribute, whatever computed it.

    Called from the hook's ``__deepcopy__``. A module's ``_forward_pre_hooks`` come before the
    hook-computed attribute in its ``__dict__``, so the hook is copied first: it puts the copy
    of the attribute (``mask_copy * orig_copy``) in ``memo``, where ``copy.deepcopy`` finds it
    instead of refusing the non-leaf tensor. This covers attributes set by compiled code, which
    :func:`pruned_tensor` cannot mark.
    """
    module = _hooked_module(hook)
    if module is None or id(module) not in memo:
        return  # the hook is copied on its own, not as part of its module
    name = hook.__dict__.get("_tensor_name")
    value = module.__dict__.get(name) if isinstance(name, str) else None
    if not isinstance(value, torch.Tensor) or value.grad_fn is None or id(value) in memo:
        return
    orig, mask = module._parameters.get(name + ORIG), module._buffers.get(name + MASK)
    if orig is None or mask is None:
        return
    memo[id(value)] = _rebuild_pruned(copy.deepcopy(orig, memo), copy.deepcopy(mask, memo))
    memo.setdefault(id(memo), []).append(value)  # keep it alive for the copy, as deepcopy does


def copy_hook(hook: Any, memo: dict) -> Any:
    """``__deepcopy__`` of a pruning method: its state, and a link to the copied module."""
    prepare_attribute_copy(hook, memo)
    new = object.__new__(type(hook))
    memo[id(hook)] = new
    state = {key: value for key, value in hook.__dict__.items() if key != "_module_ref"}
    new.__dict__.update(copy.deepcopy(state, memo))
    module = _hooked_module(hook)
    if module is not None and id(module) in memo:
        new._module_ref = weakref.ref(memo[id(module)])
    return new


# ---------------------------------------------------------------------------------------------
# Finding hooks


def pruning_hooks(module: torch.nn.Module, name: str) -> list[tuple[int, _torch_prune.BasePruningMethod]]:
    """The (hook id, hook) pairs of ``module`` that prune ``name``: torch's and fprune.compat's."""
    return [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, _torch_prune.BasePruningMethod) and getattr(hook, "_tensor_name", None) == name
    ]


def existing_hook(module: torch.nn.Module, name: str) -> tuple[int, _torch_prune.BasePruningMethod] | None:
    """The one pruning hook on ``module.<name>``, or None; two or more is an error (as in torch)."""
    found = pruning_hooks(module, name)
    if len(found) > 1:
        raise _errors.MultiplePruningHooksError(
            f"Found {len(found)} pruning hooks on tensor {name!r} of module "
            f"{type(module).__name__}; expected at most one. Combine pruning methods on one "
            f"tensor with a PruningContainer (apply does this when you prune again)."
        )
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# The steps of apply that change the module


def reparametrize(module: torch.nn.Module, name: str, orig: torch.nn.Parameter) -> None:
    """The Parameter ``name`` moves to ``name + "_orig"`` (the same object)."""
    module.register_parameter(name + ORIG, orig)
    del module._parameters[name]


def set_mask(module: torch.nn.Module, name: str, mask: torch.Tensor, hook: Any) -> None:
    """Register the mask buffer, recompute ``name`` from it and (re-)register ``hook``."""
    module.register_buffer(name + MASK, mask)
    setattr(module, name, hook.apply_mask(module))
    module.register_forward_pre_hook(hook)
    hook._module_ref = weakref.ref(module)  # for copy.deepcopy, see prepare_attribute_copy


def make_permanent(module: torch.nn.Module, name: str, bake: bool = True) -> None:
    """Undo the re-parametrization of ``name``: it is the ``_orig`` Parameter object again.

    With ``bake`` (``remove``) its values become ``mask * orig``; without, they stay unmasked.
    Hooks are left to the caller.
    """
    if name + ORIG not in module._parameters or name + MASK not in module._buffers:
        raise KeyError(
            f"Module {type(module).__name__} has no parameter {name + ORIG!r} and buffer "
            f"{name + MASK!r}; was {name!r} pruned, and its re-parametrization kept?"
        )
    orig = orig_of(module, name)
    weight = None
    if bake:
        with torch.no_grad():
            weight = mask_of(module, name).to(dtype=orig.dtype) * orig
    with transaction([module]):
        if hasattr(module, name):
            delattr(module, name)
        del module._parameters[name + ORIG]
        del module._buffers[name + MASK]
        setattr(module, name, orig)
    if weight is not None:
        orig.data = weight.data
