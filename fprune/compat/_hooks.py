"""Private: the module bookkeeping of prune-style re-parametrization.

This is the only code in fprune that touches modules' hooks, parameters and buffers:

* :func:`apply_method` - ``BasePruningMethod.apply``: move ``name`` to ``name + "_orig"`` (the
  same Parameter object), register the ``name + "_mask"`` buffer, recompute ``name``, and
  register (or extend) the forward pre-hook, as torch.nn.utils.prune does, but all-or-nothing.
* :func:`transaction` - a snapshot of modules that is restored if anything inside fails.
* :func:`pruned_tensor` - ``mask * orig``, the value of the ``name`` attribute, made safe to
  ``copy.deepcopy`` and ``pickle`` (pytorch#37322).
* :func:`make_permanent` - ``remove``.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections import OrderedDict
from typing import Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn.utils.prune as _torch_prune

from fprune.compat import _errors


# ---------------------------------------------------------------------------------------------
# Rollback


class _Snapshot:
    """What ``apply``/``global_unstructured``/``remove`` may change in one module, to put back."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.attrs = dict(module.__dict__)
        self.parameters = dict(module._parameters)
        self.buffers = dict(module._buffers)
        self.non_persistent = set(module._non_persistent_buffers_set)
        self.pre_hooks = OrderedDict(module._forward_pre_hooks)
        self.pre_hooks_with_kwargs = dict(module._forward_pre_hooks_with_kwargs)
        # Pruning containers are extended in place (torch keeps the hook object): their history too.
        self.histories = [
            (hook, hook._pruning_methods)
            for hook in module._forward_pre_hooks.values()
            if isinstance(hook, _torch_prune.PruningContainer)
        ]

    def restore(self) -> None:
        module = self.module
        for live, saved in (
            (module._parameters, self.parameters),
            (module._buffers, self.buffers),
            (module._forward_pre_hooks, self.pre_hooks),
            (module._forward_pre_hooks_with_kwargs, self.pre_hooks_with_kwargs),
        ):
            live.clear()
            live.update(saved)
        module._non_persistent_buffers_set.clear()
        module._non_persistent_buffers_set.update(self.non_persistent)
        for key in [k for k in module.__dict__ if k not in self.attrs]:
            del module.__dict__[key]
        module.__dict__.update(self.attrs)
        for hook, history in self.histories:
            hook._pruning_methods = history


@contextlib.contextmanager
def transaction(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Run the block; if it raises, put every module back exactly as it was, then re-raise."""
    snapshots = {}
    for module in modules:
        snapshots.setdefault(id(module), _Snapshot(module))
    try:
        yield
    except BaseException:
        for snapshot in snapshots.values():
            snapshot.restore()
        raise


# ---------------------------------------------------------------------------------------------
# The pruned tensor (the ``name`` attribute)


def _rebuild_pruned(orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mask * orig`` as the hooks compute it; the target of the pickled/deep-copied attribute."""
    return _with_copy_support(mask.to(dtype=orig.dtype) * orig, orig, mask)


class _DeepcopyPruned:
    """``pruned.__deepcopy__``: recompute from the copies of ``orig`` and ``mask``.

    ``copy.deepcopy`` refuses tensors that are not graph leaves, and the hook-computed
    attribute is one (pytorch#37322). Deep-copying ``orig`` and ``mask`` through the same
    ``memo`` gives the very copies that the copied module holds, so the copied attribute is
    ``mask_copy * orig_copy``: what the copy's own hook computes.
    """

    def __init__(self, orig: torch.Tensor, mask: torch.Tensor) -> None:
        self.orig, self.mask = orig, mask

    def __call__(self, memo: dict) -> torch.Tensor:
        return _rebuild_pruned(copy.deepcopy(self.orig, memo), copy.deepcopy(self.mask, memo))


class _ReducePruned:
    """``pruned.__reduce_ex__``: pickle the attribute as ``_rebuild_pruned(orig, mask)``."""

    def __init__(self, orig: torch.Tensor, mask: torch.Tensor) -> None:
        self.orig, self.mask = orig, mask

    def __call__(self, protocol: int):
        return _rebuild_pruned, (self.orig, self.mask)


def _with_copy_support(pruned: torch.Tensor, orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # copy.deepcopy and pickle look these two up on the instance (getattr), so setting them on
    # this one tensor fixes copying without changing its type, value or grad_fn. Leaves copy
    # fine already; transforms and the compiler get the plain tensor.
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return pruned  # checked first: the compiler cannot trace .grad_fn
    if torch._C._functorch.is_functorch_wrapped_tensor(pruned) or pruned.grad_fn is None:
        return pruned
    pruned.__deepcopy__ = _DeepcopyPruned(orig, mask)
    pruned.__reduce_ex__ = _ReducePruned(orig, mask)
    return pruned


def prepare_attribute_copy(hook, memo: dict) -> None:
    """Let ``copy.deepcopy`` of the hook's module copy its pruned attribute, whatever computed it.

    Called from the hook's ``__deepcopy__``. A module's ``_forward_pre_hooks`` come before the
    hook-computed attribute in its ``__dict__``, so the hook is copied first: it puts the copy
    of the attribute (``mask_copy * orig_copy``) in ``memo``, where ``copy.deepcopy`` finds it
    instead of refusing the non-leaf tensor. This covers attributes set by compiled code, which
    :func:`pruned_tensor` cannot mark.
    """
    ref = hook.__dict__.get("_module_ref")
    module = ref() if ref is not None else None
    if module is None or id(module) not in memo:
        return  # the hook is copied on its own, not as part of its module
    name = getattr(hook, "_tensor_name", None)
    value = module.__dict__.get(name) if isinstance(name, str) else None
    orig = module._parameters.get(name + "_orig") if value is not None else None
    mask = module._buffers.get(name + "_mask") if value is not None else None
    if not isinstance(value, torch.Tensor) or value.grad_fn is None or id(value) in memo:
        return
    if orig is None or mask is None:
        return
    memo[id(value)] = _rebuild_pruned(copy.deepcopy(orig, memo), copy.deepcopy(mask, memo))
    memo.setdefault(id(memo), []).append(value)  # keep it alive for the copy, as deepcopy does


def copy_hook(hook, memo: dict):
    """``__deepcopy__`` of a pruning method: its state, and a link to the copied module."""
    prepare_attribute_copy(hook, memo)
    new = object.__new__(type(hook))
    memo[id(hook)] = new
    state = {key: value for key, value in hook.__dict__.items() if key != "_module_ref"}
    new.__dict__.update(copy.deepcopy(state, memo))
    ref = hook.__dict__.get("_module_ref")
    module = ref() if ref is not None else None
    if module is not None and id(module) in memo:
        new._module_ref = weakref.ref(memo[id(module)])
    return new


def pruned_tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    """``module.<name>_mask * module.<name>_orig``, read from the module (no copy is kept)."""
    mask = getattr(module, name + "_mask")
    orig = getattr(module, name + "_orig")
    return _with_copy_support(mask.to(dtype=orig.dtype) * orig, orig, mask)


# ---------------------------------------------------------------------------------------------
# Finding hooks


def pruning_hooks(module: torch.nn.Module, name: str) -> List[Tuple[int, _torch_prune.BasePruningMethod]]:
    """The (hook id, hook) pairs of ``module`` that prune ``name``: torch's and fprune.compat's."""
    return [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, _torch_prune.BasePruningMethod)
        and getattr(hook, "_tensor_name", None) == name
    ]


def existing_hook(module: torch.nn.Module, name: str) -> Optional[Tuple[int, _torch_prune.BasePruningMethod]]:
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
# apply


def _check_scores(importance_scores, orig, name: str, module: torch.nn.Module) -> None:
    if importance_scores is None:
        return
    shape = getattr(importance_scores, "shape", None)
    if shape != getattr(orig, "shape", None):
        raise _errors.ImportanceScoresShapeError(
            f"Expected importance_scores to have the shape of parameter {name!r} of "
            f"{type(module).__name__}, {tuple(orig.shape) if orig is not None else None}, got "
            f"{tuple(shape) if shape is not None else type(importance_scores).__name__}."
        )


def _new_hook(old, method, name: str):
    """The hook after ``method`` joins ``old`` (None, one method, or a container); ``old`` is untouched."""
    from fprune.compat.methods import PruningContainer  # methods imports this module

    if old is None:
        return method
    container = PruningContainer()
    container._tensor_name = name
    if isinstance(old, _torch_prune.PruningContainer):
        container._pruning_methods = tuple(old._pruning_methods)
    else:
        container.add_pruning_method(old)
    container.add_pruning_method(method)
    return container


def apply_method(make_method, module: torch.nn.Module, name: str, importance_scores=None):
    """``BasePruningMethod.apply``: ``make_method()`` builds the method; returns the hook.

    The steps and their order are torch's (so the same mistake raises the same exception), but
    nothing is left half done: on any exception the module is restored from a snapshot.
    """
    from fprune.compat.methods import PruningContainer

    found = existing_hook(module, name)
    method = make_method()
    method._tensor_name = name
    with transaction([module]):
        old = None
        if found is not None:
            key, old = found
            del module._forward_pre_hooks[key]
        hook = _new_hook(old, method, name)
        orig = getattr(module, name)
        _check_scores(importance_scores, orig, name, module)
        scores = orig if importance_scores is None else importance_scores
        if old is None:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            # A method that only reads default_mask (CustomFromMask) gets a broadcast view of one
            # 1: same values, no full-size allocation (global_unstructured applies one per tensor).
            if getattr(method, "_READS_DEFAULT_MASK_ONLY", False):
                default_mask = torch.ones((), dtype=orig.dtype, device=orig.device).expand_as(orig)
            else:
                default_mask = torch.ones_like(orig)
        else:
            default_mask = getattr(module, name + "_mask").detach().clone(
                memory_format=torch.contiguous_format
            )
        mask = hook.compute_mask(scores, default_mask=default_mask)
        if getattr(method, "_CORE_BACKED", False) and isinstance(mask, torch.Tensor):
            # fprune's own methods: the buffer is always in the parameter's dtype.
            mask = mask.to(dtype=getattr(module, name + "_orig").dtype)
        module.register_buffer(name + "_mask", mask)
        if isinstance(old, PruningContainer):
            # Keep the hook object (as torch does) now that nothing can fail any more.
            old._pruning_methods = hook._pruning_methods
            hook = old
        setattr(module, name, hook.apply_mask(module))
        module.register_forward_pre_hook(hook)
        hook._module_ref = weakref.ref(module)  # for copy.deepcopy, see prepare_attribute_copy
    release = getattr(method, "_release_after_apply", None)
    if release is not None:
        release()
    return hook


# ---------------------------------------------------------------------------------------------
# remove


def make_permanent(method, module: torch.nn.Module) -> None:
    """``BasePruningMethod.remove``: ``name`` becomes the pruned ``_orig`` Parameter again."""
    name = getattr(method, "_tensor_name", None)
    if name is None:
        raise _errors.NotPrunedError(
            f"This {type(method).__name__} has not been applied to a tensor yet (its _tensor_name "
            f"is unset); prune module {type(module).__name__} with it before removing pruning."
        )
    if name + "_orig" not in module._parameters or name + "_mask" not in module._buffers:
        raise KeyError(
            f"Module {type(module).__name__} has no parameter {name + '_orig'!r} and buffer "
            f"{name + '_mask'!r}; was {name!r} pruned, and its re-parametrization kept?"
        )
    orig = module._parameters[name + "_orig"]
    mask = module._buffers[name + "_mask"]
    with torch.no_grad():
        weight = mask.to(dtype=orig.dtype) * orig
    with transaction([module]):
        if hasattr(module, name):
            delattr(module, name)
        del module._parameters[name + "_orig"]
        del module._buffers[name + "_mask"]
        setattr(module, name, orig)
    orig.data = weight.data
