"""Private: every private or version-dependent torch API fprune uses, each behind one function.

torch may move or drop its private names in any release; when it does, only this module changes,
``import fprune`` keeps working, and every function here falls back to an answer that is always
correct, if slower or less convenient:

* a probe that cannot tell whether code is being traced answers "traced", so the selection takes
  its traced path (a stable sort), which is correct everywhere, eager code included;
* the same answer makes fprune.compat hand out the plain pruned tensor (torch's own behaviour),
  without the marks that let ``copy.deepcopy`` copy it;
* a module snapshot that cannot find torch's containers by name copies every one it finds;
* a DTensor shard layout is computed here from the placements (torch.chunk's split), and a
  missing ``_StridedShard`` class matches no placement.

Checked on torch 2.13.0 (the oldest and newest version fprune is tested on; see pyproject.toml).
The attributes through which ``torch.nn.utils.prune`` itself talks to modules and hooks
(``module._forward_pre_hooks``, ``module._parameters``, ``module._buffers``, ``hook._tensor_name``,
``PruningContainer._pruning_methods``) are the contract fprune.compat interoperates with, and are
used in fprune.compat directly.
"""

from __future__ import annotations

import collections
import functools
import importlib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.utils.prune as _torch_prune


def _lookup(path: str) -> Callable[..., Any] | None:
    """The object at the dotted ``path`` under ``torch``, or None if this torch has none there."""
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# Each probe is None where this torch lacks it; the functions below then fall back.
# torch 2.13.0: public torch.compiler.is_compiling; torch._dynamo.is_compiling before it existed.
_IS_COMPILING = _lookup("torch.compiler.is_compiling") or _lookup("torch._dynamo.is_compiling")
# torch 2.13.0: torch.utils._python_dispatch._get_current_dispatch_mode (None outside any mode).
_DISPATCH_MODE: Callable[[], Any] | None
try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode as _DISPATCH_MODE
except ImportError:
    _DISPATCH_MODE = None
# torch 2.13.0: torch._C._functorch.is_functorch_wrapped_tensor (True for vmap/grad wrappers).
_IS_FUNCTORCH_WRAPPED = _lookup("torch._C._functorch.is_functorch_wrapped_tensor")


def run_eagerly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, run eagerly under ``torch.compile`` (``torch.compiler.disable``, applied at the first
    call made with dynamo imported): decorating with ``torch.compiler.disable`` at import time
    would import dynamo, a second of every ``import fprune``. Nothing compiles before dynamo is
    imported, so until then ``fn`` is called as it is."""
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not disabled:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    return call


def is_dynamo_compiling() -> bool:
    """True while ``torch.compile`` (dynamo) traces; True when this torch cannot tell."""
    return True if _IS_COMPILING is None else bool(_IS_COMPILING())


def is_compiling() -> bool:
    """True while ``torch.compile`` or ``torch.jit.trace`` traces; True when this torch cannot tell."""
    # torch.jit.is_tracing is public and documented, but torch.jit's __all__ leaves it out.
    return is_dynamo_compiling() or torch.jit.is_tracing()  # type: ignore[attr-defined]


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
# Tensor versions


def tensor_version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (it grows with every in-place change of its data, views
    included), or None where it cannot be read (inference tensors have none; a torch without
    ``Tensor._version``): then nothing may be assumed unchanged.

    torch 2.13.0: ``Tensor._version``.
    """
    try:
        return int(tensor._version)
    except (AttributeError, RuntimeError):
        return None


# ---------------------------------------------------------------------------------------------
# Loading with torch.load(weights_only=True)

# torch 2.13.0: torch.serialization.add_safe_globals (public since torch 2.4).
_ADD_SAFE_GLOBALS = _lookup("torch.serialization.add_safe_globals")


def allow_loading(*classes: type) -> bool:
    """Declare ``classes`` safe for ``torch.load(weights_only=True)`` (the default), so that a
    ``torch.save``-d object holding them loads as it is. Returns False where this torch has no
    such declaration (then such objects need ``weights_only=False``; fprune.packed's
    ``to_state``/``from_state`` work everywhere).
    """
    if _ADD_SAFE_GLOBALS is None:
        return False
    _ADD_SAFE_GLOBALS(list(classes))
    return True


# ---------------------------------------------------------------------------------------------
# Device capabilities

# Device types without float64 tensors: Apple's MPS backend has none (torch raises "Cannot
# convert a MPS Tensor to float64 dtype"). fprune then takes float64-free paths (integer keys
# for integer-seed draws, float32 for ``normalize=`` and :func:`fprune.sparsity`, tensor-amount
# counts made on the CPU); every other device keeps the float64 paths.
NO_FLOAT64 = frozenset({"mps"})


def has_float64(device: torch.device | str | None) -> bool:
    """Whether tensors of dtype float64 can live on ``device`` (a device, a string or None: CPU).

    Example:
        >>> has_float64("cpu"), has_float64(torch.device("mps"))
        (True, False)
    """
    if device is None:
        return True
    return torch.device(device).type not in NO_FLOAT64


# ---------------------------------------------------------------------------------------------
# DTensor layouts (fprune.distributed, the sharded backend of the selection). Looked up on first
# use: torch.distributed.tensor is slow to import, and a DTensor only exists once it is imported.


@functools.cache
def _dtensor_private(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def shard_layout(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[Any],
) -> tuple:
    """``(local_shape, global_offset)`` of the shard at mesh ``coordinate`` of a DTensor.

    torch 2.13.0: ``torch.distributed.tensor._utils._compute_local_shape_and_global_offset``.
    Without it, the same layout is computed here for ``Shard``/``Replicate`` placements (the
    only ones fprune.distributed accepts): each sharded mesh dim splits the current local size
    into ``torch.chunk``'s pieces (``ceil(size / n)`` each, the last ones shorter or empty), in
    mesh-dim order; an empty shard's offset is the dim's global size, as torch reports it.
    """
    compute = _dtensor_private("torch.distributed.tensor._utils", "_compute_local_shape_and_global_offset")
    if compute is not None:
        local, offset = compute(tuple(global_shape), tuple(mesh_shape), list(coordinate), tuple(placements))
        return tuple(local), tuple(offset)
    return _shard_layout(global_shape, mesh_shape, coordinate, placements)


def _shard_layout(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[Any],
) -> tuple:
    local, offset = list(global_shape), [0] * len(global_shape)
    for mesh_dim, placement in enumerate(placements):
        if not placement.is_shard():
            continue
        d = placement.dim % len(local)
        size, n = local[d], mesh_shape[mesh_dim]
        chunk = -(-size // n)
        start = min(coordinate[mesh_dim] * chunk, size)
        local[d] = min(start + chunk, size) - start
        offset[d] = global_shape[d] if local[d] == 0 else offset[d] + start
    return tuple(local), tuple(offset)


def strided_shard_type() -> Any:
    """torch's private ``_StridedShard`` placement class (FSDP2 with tensor parallelism), or ``()``
    where this torch has none: ``isinstance(p, ())`` is False, and no placement can be one.

    torch 2.13.0: ``torch.distributed.tensor.placement_types._StridedShard``.
    """
    found = _dtensor_private("torch.distributed.tensor.placement_types", "_StridedShard")
    return () if found is None else found


# ---------------------------------------------------------------------------------------------
# nn.Module state, for fprune.compat's all-or-nothing calls


class ModuleSnapshot:
    """What a pruning call may change in one module, to put back exactly if the call fails.

    That is the module's ``__dict__`` (its attributes) and the contents of the containers in
    which torch keeps parameters, buffers and forward pre-hooks: the ones ``register_parameter``,
    ``register_buffer``, ``register_forward_pre_hook``, ``__setattr__`` and ``__delattr__``
    write to (torch 2.13.0: :data:`MODULE_CONTAINERS`). A module lacking one of those names (a
    torch that renamed it) gets every dict and set in its ``__dict__`` saved instead. Few
    objects per module matter: ``global_unstructured`` keeps one snapshot per tensor alive, and
    every object it keeps is walked by each of Python's garbage collections.
    """

    __slots__ = ("attrs", "containers", "module")

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.attrs = attrs = module.__dict__.copy()
        try:
            self.containers = [(attrs[name], _copy(attrs[name])) for name in MODULE_CONTAINERS]
        except KeyError:
            self.containers = [(v, _copy(v)) for v in attrs.values() if type(v) in _ALL_CONTAINERS]

    def restore(self) -> None:
        attrs = self.module.__dict__
        for key in [k for k in attrs if k not in self.attrs]:
            del attrs[key]
        attrs.update(self.attrs)
        for live, saved in self.containers:
            live.clear()
            live.update(saved)


# torch 2.13.0's containers (in a module's __dict__) that the calls fprune.compat makes write to.
MODULE_CONTAINERS = (
    "_parameters",
    "_buffers",
    "_non_persistent_buffers_set",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)
_ALL_CONTAINERS = frozenset({dict, set, collections.OrderedDict})


def _copy(container: Any) -> Any:
    return container.copy()


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
PRUNE_HELPERS: dict[str, Any] = {
    name: getattr(_torch_prune, name) for name in _PRUNE_HELPER_NAMES if hasattr(_torch_prune, name)
}


# ---------------------------------------------------------------------------------------------
# Sparse weights (fprune.sparse)

# torch 2.13.0: ``torch.Tensor._make_wrapper_subclass`` (a tensor with a shape and dtype but no
# storage, whose every op goes to the class's ``__torch_dispatch__``) and
# ``torch._C._disabled_torch_function_impl`` (the ``__torch_function__`` that such a class needs
# so that torch does not turn the results of its ops into instances of the class).
_MAKE_WRAPPER_SUBCLASS = getattr(torch.Tensor, "_make_wrapper_subclass", None)
_DISABLED_TORCH_FUNCTION = getattr(torch._C, "_disabled_torch_function_impl", None)


def has_wrapper_subclasses() -> bool:
    """Whether this torch can make storage-less tensor subclasses (fprune.sparse's weights).

    Where it cannot, fprune.sparse keeps every weight dense (``p * mask``): correct, not faster.
    """
    return _MAKE_WRAPPER_SUBCLASS is not None and _DISABLED_TORCH_FUNCTION is not None


def make_wrapper_subclass(cls: type, shape: tuple, dtype: torch.dtype, device: torch.device) -> Any:
    """A ``cls`` instance of ``shape``, ``dtype`` and ``device`` holding no storage of its own."""
    if _MAKE_WRAPPER_SUBCLASS is None:
        raise RuntimeError("This torch cannot make wrapper tensor subclasses (see has_wrapper_subclasses).")
    return _MAKE_WRAPPER_SUBCLASS(cls, shape, dtype=dtype, device=device, requires_grad=False)


# torch 2.13.0: ``torch._C.DisableTorchFunctionSubclass``, the context in which a subclass's
# ``__torch_function__`` hands an op on to torch without seeing it again.
_DISABLE_TORCH_FUNCTION_SUBCLASS = getattr(torch._C, "DisableTorchFunctionSubclass", None)


def has_torch_function_passthrough() -> bool:
    """Whether a wrapper subclass may take ops at the ``__torch_function__`` level too.

    Where it cannot, fprune.sparse takes every op in ``__torch_dispatch__`` alone: the same
    results, a few microseconds more per call.
    """
    return _DISABLE_TORCH_FUNCTION_SUBCLASS is not None


def torch_function_passthrough() -> Any:
    """The context in which a ``__torch_function__`` calls torch on its own class's tensors."""
    if _DISABLE_TORCH_FUNCTION_SUBCLASS is None:
        raise RuntimeError(
            "This torch has no DisableTorchFunctionSubclass (see has_torch_function_passthrough)."
        )
    return _DISABLE_TORCH_FUNCTION_SUBCLASS()


def disabled_torch_function() -> Any:
    """The ``__torch_function__`` of a wrapper subclass that handles every op in ``__torch_dispatch__``."""
    if _DISABLED_TORCH_FUNCTION is not None:
        return _DISABLED_TORCH_FUNCTION
    # Never used to build a weight (has_wrapper_subclasses() is False without it); a class still
    # needs some classmethod here to be defined.
    return classmethod(lambda cls, func, types, args=(), kwargs=None: NotImplemented)


# torch 2.13.0's shape rules of ``torch.sparse.to_sparse_semi_structured`` per backend and dtype:
# (min rows, min cols) of the sparse matrix; both dims must be at least these and multiples of
# them (``SparseSemiStructuredTensorCUTLASS/CUSPARSELT._DTYPE_SHAPE_CONSTRAINTS``). Used where a
# torch lacks the private tables.
SEMI_STRUCTURED_SHAPES: dict[str, dict[torch.dtype, tuple]] = {
    "cutlass": {
        torch.int8: (16, 128),
        torch.float16: (32, 64),
        torch.bfloat16: (32, 64),
        torch.float32: (32, 32),
    },
    "cusparselt": {
        torch.int8: (32, 32),
        torch.float16: (16, 16),
        torch.bfloat16: (16, 16),
    },
}


def semi_structured_backend() -> str:
    """The backend ``torch.sparse.to_sparse_semi_structured`` uses: "cutlass" or "cusparselt".

    torch 2.13.0 takes CUTLASS where ``SparseSemiStructuredTensor._FORCE_CUTLASS`` is set and
    cuSPARSELt otherwise. A torch without the flag is taken to use cuSPARSELt (its default).
    """
    base = getattr(getattr(torch, "sparse", None), "SparseSemiStructuredTensor", None)
    return "cutlass" if getattr(base, "_FORCE_CUTLASS", False) else "cusparselt"


def semi_structured_shapes(backend: str) -> dict[torch.dtype, tuple]:
    """``{dtype: (min_rows, min_cols)}`` of ``backend`` as this torch states them (private class
    attributes ``_DTYPE_SHAPE_CONSTRAINTS``), or torch 2.13.0's table where it has none."""
    name = {
        "cutlass": "SparseSemiStructuredTensorCUTLASS",
        "cusparselt": "SparseSemiStructuredTensorCUSPARSELT",
    }
    cls = getattr(getattr(torch, "sparse", None), name[backend], None)
    table = getattr(cls, "_DTYPE_SHAPE_CONSTRAINTS", None)
    if not isinstance(table, dict):
        return dict(SEMI_STRUCTURED_SHAPES[backend])
    try:
        return {dtype: (int(c.sparse_min_rows), int(c.sparse_min_cols)) for dtype, c in table.items()}
    except AttributeError:
        return dict(SEMI_STRUCTURED_SHAPES[backend])
