"""Private: :func:`load_into`, the one function that writes values (dense or sparse) into a module.

fprune's functions return new tensors and leave the module as it was; :func:`load_into` writes
them into the module, so that the module's own methods (``forward``, ``generate``,
``save_pretrained``, ``state_dict``) see them. It lives here, beside the sparse weights it can
install, and :mod:`fprune.load` re-exports it as ``fprune.load_into``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from fprune import _names, _tree
from fprune.sparse._convert import is_semi_structured, kind_of
from fprune.sparse._weight import SparseWeight

__all__ = ["load_into", "sparse_weights"]


class _Slot(NamedTuple):
    key: str  # the key of params
    owner: torch.nn.Module
    attr: str
    target: torch.Tensor  # what the module holds under key now
    value: torch.Tensor
    sparse: bool  # a SparseWeight or torch 2:4 tensor, installed as it is; else copied


def _is_sparse(t: Any) -> bool:
    return isinstance(t, SparseWeight) or is_semi_structured(t)


def sparse_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The sparse weights :func:`load_into` put into ``module``, keyed like its parameters.

    Example:
        >>> import torch
        >>> from fprune.sparse import load_into, sparse_weights, to_sparse
        >>> model = torch.nn.Linear(8, 4)
        >>> keep = torch.rand(4, 8) > 0.5
        >>> _ = load_into(model, to_sparse({"weight": model.weight.detach()}, {"weight": keep}, layout="csr"))
        >>> list(sparse_weights(model)), [name for name, _ in model.named_parameters()]
        (['weight'], ['bias'])
    """
    return {name: b for name, b in module.named_buffers() if _is_sparse(b)}


def load_into(module: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Write ``params`` into ``module``, in place, and return ``module``.

    ``params`` is a flat mapping keyed like ``module.named_parameters()`` (tied names and buffers
    included; a part is fine: the rest keeps its values), for instance the params
    :func:`fprune.oneshot.prune` returns, ``fprune.apply_masks(params, masks)``, or
    :func:`fprune.sparse.to_sparse`'s result.

    * A dense value is copied into the existing parameter (or buffer) without autograd, as
      ``load_state_dict`` does: the module keeps its ``nn.Parameter`` objects, their dtype,
      device and ``requires_grad``, and its tied weights (writing ``"transformer.wte.weight"``
      of a GPT-2 also changes ``"lm_head.weight"``, the same parameter). A value of another
      floating dtype is converted to the parameter's, one on another device is moved.
    * A sparse value (a :class:`fprune.sparse.SparseWeight`, or torch's 2:4 tensor) replaces the
      weight's ``nn.Parameter``: it becomes a buffer of its layer under the same name, converted
      to the parameter's dtype and device, so ``layer.weight`` is the sparse weight and
      ``nn.Linear`` / ``Conv1D`` run the sparse kernel in their own forward. The layer's
      ``state_dict()`` then gives the weight's dense values (so ``save_pretrained``,
      ``torch.save(module.state_dict())`` and ``load_state_dict`` into a dense model work);
      ``fprune.sparse.to_state(module)`` is the sparse checkpoint. A dense value for a weight that
      holds a sparse one turns it back into an ``nn.Parameter``.

    Every entry is checked before anything is written, so on an error the module is exactly as
    it was.

    Args:
        module: the model to write into (a ``torch.nn.Module``).
        params: a flat mapping of name -> tensor, every name a parameter or buffer of ``module``
            (``named_parameters()`` / ``named_buffers()``, tied aliases included).

    Returns:
        ``module``, changed in place.

    Raises:
        TypeError: ``module`` is not a module, ``params`` not a mapping, a key not a string, a
            value not a tensor, or a value whose kind (floating, complex, integer, bool) differs
            from its target's (``torch.bool`` masks given as params, say).
        ValueError: a key that names nothing of ``module`` (a misspelling, or a tensor of a
            ``torch.nn.utils.prune`` hook, ``weight_orig`` / ``weight_mask``), a value of another
            shape, a value on the ``meta`` device, NaN or inf in a value for a parameter (or in a
            sparse value), two names of one tied weight given different values, a sparse value
            for a weight that is not an ``nn.Linear`` / ``Conv1D`` weight (or made for the other
            of the two), or a sparse value for a tied weight.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(4, 2)
        >>> params = dict(model.named_parameters())
        >>> masks = fprune.l1_unstructured(params, 0.5)
        >>> _ = fprune.load_into(model, fprune.apply_masks(params, masks))
        >>> int((model.weight == 0).sum())
        4

        Sparse weights, run by the module's own forward:

        >>> from fprune.sparse import to_sparse
        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
        >>> params = {k: v.detach() for k, v in model.named_parameters()}
        >>> masks = fprune.l1_unstructured(params, 0.9, where=lambda name, p: p.dim() == 2)
        >>> x = torch.randn(3, 256)
        >>> with torch.no_grad():
        ...     want = fprune.masked_call(model, params, masks, (x,))
        >>> model = fprune.load_into(model, to_sparse(params, masks, layout="csr", module=model))
        >>> type(model[0].weight).__name__
        'SparseWeight'
        >>> with torch.no_grad():
        ...     torch.allclose(model(x), want, atol=1e-5)
        True
    """
    slots = _slots(module, params)
    with torch.no_grad():
        for slot in slots:
            _put(slot)
    return module


def _slots(module: Any, params: Any) -> list[_Slot]:
    """Every change to make, each checked (nothing is changed here)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(params, Mapping):
        raise TypeError(
            f"Expected params to be a flat dict of name -> tensor keyed like "
            f"module.named_parameters(), got {type(params).__name__}."
        )
    names = _names.Names(module)
    chosen: dict[int, tuple[str, torch.Tensor]] = {}  # id of a module tensor -> its first key, value
    slots: list[_Slot] = []
    for key, value in params.items():
        if not isinstance(key, str):
            raise TypeError(
                f"Expected the keys of params to be names (str) like module.named_parameters() "
                f"gives, got {key!r} ({type(key).__name__})."
            )
        where = f"params[{key!r}]"
        _check_hooks(where, key, names)
        if key not in names:
            raise names.unknown("params", key, "module.named_parameters()")
        target = names[key]
        sparse = _is_sparse(value)
        weight = key in names.parameters or sparse or _is_sparse(target)
        _check_value(where, key, value, target, is_parameter=weight)
        owner, attr = names.owner(key)
        if sparse:
            _check_sparse(where, key, value, owner, attr, names.aliases(key))
        earlier = chosen.get(id(target))
        if earlier is not None and earlier[1] is not value and not _same_values(earlier[1], value):
            raise ValueError(
                f"{where} and params[{earlier[0]!r}] name one tied weight of the module but hold "
                f"different values; give one of the two names (the other follows), or equal values."
            )
        chosen.setdefault(id(target), (key, value))
        slots.append(_Slot(key, owner, attr, target, value, sparse))
    return slots


def _check_hooks(where: str, key: str, names: _names.Names) -> None:
    """A tensor of a ``torch.nn.utils.prune`` hook (``weight_orig``, ``weight_mask``, or the
    ``weight`` it recomputes): a value written there would be masked or overwritten."""
    base = _tree.hook_base(key)
    if base is not None and base + "_mask" in names.buffers:
        raise _hooked(where, base)
    if key.endswith("_mask") and key[: -len("_mask")] + _tree.HOOK_SUFFIX in names.parameters:
        raise _hooked(where, key[: -len("_mask")])
    if key not in names and key + _tree.HOOK_SUFFIX in names.parameters and key + "_mask" in names.buffers:
        raise _hooked(where, key)


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


def _check_value(where: str, key: str, value: Any, target: torch.Tensor, *, is_parameter: bool) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Expected {where} to be a torch.Tensor, got {type(value).__name__}.")
    if tuple(value.shape) != tuple(target.shape):
        raise ValueError(
            f"Expected {where} to have the shape of the module's {key!r}, {tuple(target.shape)}, "
            f"got {tuple(value.shape)}."
        )
    if _kind(value.dtype) != _kind(target.dtype):
        raise TypeError(
            f"Expected {where} to be a {_kind(target.dtype)} tensor like the module's {key!r} "
            f"({target.dtype}), got {value.dtype}"
            + (
                " (masks? pass the pruned params, fprune.apply_masks(params, masks))."
                if value.dtype == torch.bool
                else "."
            )
        )
    if value.is_meta:
        raise ValueError(f"{where} is on the meta device: it holds no values to load.")
    if target.is_meta:
        raise ValueError(
            f"The module's tensor for {where} is on the meta device; materialize the module "
            f"first (module.to_empty(device=...))."
        )
    # Weights: NaN or inf is a failed pruning or a broken checkpoint (oneshot.prune refuses such
    # weights too). Buffers may hold inf on purpose (attention masks), so they are taken as given.
    if is_parameter and (value.is_floating_point() or value.is_complex()):
        values = _stored_values(value)
        if values is not None and not bool(torch.isfinite(values).all()):
            bad = int((~torch.isfinite(values)).sum())
            raise ValueError(
                f"Expected {where} to hold finite values, got {bad} NaN or inf of its "
                f"{values.numel()} stored values; nothing was written. Check the pruning (or the "
                f"checkpoint) that made it."
            )


def _stored_values(value: torch.Tensor) -> torch.Tensor | None:
    """The values ``value`` stores (a sparse weight's kept ones), or None where they are not at hand."""
    if isinstance(value, SparseWeight):
        return value.matrix.values()
    if is_semi_structured(value):
        return None  # packed with its metadata; to_sparse checked the dense values
    return value.detach()


def _check_sparse(where: str, key: str, value: torch.Tensor, owner: Any, attr: str, tied: list) -> None:
    kind = kind_of(owner, attr)
    if kind is None:
        raise ValueError(
            f"Expected {where}, a sparse weight, to be for the weight of an nn.Linear or a "
            f"transformers Conv1D, got {key!r} of a {type(owner).__name__} (a sparse weight serves "
            f"F.linear / torch.addmm only); give it a dense value."
        )
    # a 2:4 tensor made for a Conv1D is the .t() of one, which has no packed values of its own
    transposed = value.transposed if isinstance(value, SparseWeight) else getattr(value, "packed", 0) is None
    if transposed != (kind == "conv1d"):
        made = "a Conv1D" if transposed else "an nn.Linear"
        raise ValueError(
            f"Expected {where} to be a sparse weight made for a "
            f"{'Conv1D' if kind == 'conv1d' else 'nn.Linear'} (to_sparse(..., module=module) stores a "
            f"Conv1D weight transposed), got one made for {made}."
        )
    if tied:
        raise ValueError(
            f"Expected {where}, a sparse weight, to be for a weight of its own, got {key!r}, which is "
            f"tied to {', '.join(map(repr, tied))} (one tensor used by two layers); keep it dense, "
            f"or untie the weights first."
        )


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if _is_sparse(a) or _is_sparse(b):
        return False
    return a.shape == b.shape and bool(torch.equal(a.detach().to(b.device, b.dtype), b.detach()))


def _put(slot: _Slot) -> None:
    owner, attr, target, value = slot.owner, slot.attr, slot.target, slot.value
    if slot.sparse:
        if isinstance(value, SparseWeight):  # in the dtype and on the device of what it replaces
            value = value.to(device=target.device, dtype=target.dtype)
        had_sparse = any(_is_sparse(b) for _, b in owner.named_buffers(recurse=False))
        owner._parameters.pop(attr, None)
        owner._buffers.pop(attr, None)
        owner.register_buffer(attr, value)
        if not had_sparse:
            owner.register_state_dict_post_hook(_dense_state)
        return
    if _is_sparse(target):  # back to a dense parameter, in the sparse weight's dtype and device
        del owner._buffers[attr]
        dense = value.detach().to(device=target.device, dtype=target.dtype, copy=True)
        owner.register_parameter(attr, torch.nn.Parameter(dense))
        return
    if not _same_memory(target, value):  # the tensor itself (or an alias of it): nothing to copy
        target.copy_(value)


def _same_memory(target: torch.Tensor, value: torch.Tensor) -> bool:
    return value is target or (
        value.device == target.device
        and value.dtype == target.dtype
        and value.data_ptr() == target.data_ptr()
        and value.stride() == target.stride()
    )


def _dense_state(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    """A ``state_dict`` post-hook of a layer holding a sparse weight: the weight's dense values
    (what ``save_pretrained``, ``safetensors`` and ``torch.load(weights_only=True)`` take)."""
    for attr, b in module.named_buffers(recurse=False):
        if prefix + attr in state_dict and _is_sparse(b):
            state_dict[prefix + attr] = _dense_values(b)


def _dense_values(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, SparseWeight):
        return t.dense().contiguous()
    if getattr(t, "packed", True) is None:  # a 2:4 Conv1D weight: the .t() of the packed one
        return t.t().to_dense().t().contiguous()
    return t.to_dense()
