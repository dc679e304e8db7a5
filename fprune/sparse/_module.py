"""Private: :func:`load_into`, which puts ``to_sparse``'s params into the module itself."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from fprune.sparse._convert import is_semi_structured, kind_of
from fprune.sparse._weight import SparseWeight

__all__ = ["load_into", "sparse_weights"]


class _Slot(NamedTuple):
    key: str  # the key of params
    owner: torch.nn.Module
    attr: str
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
        >>> load_into(model, to_sparse({"weight": model.weight.detach()}, {"weight": keep}, layout="csr"))
        >>> list(sparse_weights(model)), [name for name, _ in model.named_parameters()]
        (['weight'], ['bias'])
    """
    return {name: b for name, b in module.named_buffers() if _is_sparse(b)}


def load_into(module: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Puts ``params`` into ``module`` in place, so that its own forward (and ``generate``) runs them.

    ``params`` is a flat dict keyed like ``module.named_parameters()`` (or a part of it; buffers
    too), first of all :func:`to_sparse`'s result or :func:`from_state`'s. A dense value is
    copied into the existing parameter (or buffer) under ``torch.no_grad()``, as
    ``load_state_dict`` does: the ``nn.Parameter`` object stays, so optimizers and tied weights
    keep it. A sparse value (a :class:`SparseWeight`, or torch's 2:4 tensor) replaces the
    parameter: it becomes a buffer of its layer under the same name, so ``layer.weight`` is the
    sparse weight and ``nn.Linear`` / ``Conv1D`` run the sparse kernel in their own forward.
    A dense value for a weight that holds a sparse one turns it back into an ``nn.Parameter``.

    The module afterwards: ``named_parameters()`` lacks the sparse weights, ``named_buffers()``
    and ``state_dict()`` hold them (:class:`SparseWeight` tensors: ``to_state(module.state_dict())``
    is its checkpoint, ``load_into(module, from_state(state))`` loads it back); ``.to(dtype or
    device)`` converts them, still sparse; ``load_state_dict`` copies into a sparse weight by
    replacing its matrix (a dense value is re-sparsified in the same layout: its zeros are left
    out).

    Args:
        module: the module ``params`` belong to.
        params: name -> tensor, every name a parameter or buffer of ``module``.

    Raises:
        TypeError: ``module`` not a module, ``params`` not a mapping of names to tensors.
        ValueError: a name that is not one of ``module``'s, a value of another shape, a sparse
            value for a weight that is not an ``nn.Linear`` / ``Conv1D`` weight (or oriented for
            the other one), a sparse value for a weight tied to another name, or two names of
            one tied weight with different values. Checked before anything is changed.

    Example:
        >>> import torch, fprune
        >>> from fprune.sparse import load_into, to_sparse
        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
        >>> params = {k: v.detach() for k, v in model.named_parameters()}
        >>> masks = fprune.l1_unstructured(params, 0.9, where=lambda name, p: p.dim() == 2)
        >>> x = torch.randn(3, 256)
        >>> with torch.no_grad():
        ...     want = fprune.masked_call(model, params, masks, (x,))
        >>> load_into(model, to_sparse(params, masks, layout="csr", module=model))
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


def _slots(module: Any, params: Any) -> list[_Slot]:
    """Every change to make, each checked (nothing is changed here)."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(params, Mapping):
        raise TypeError(
            f"Expected params to be a flat dict of name -> tensor (to_sparse's or from_state's result), "
            f"got {type(params).__name__}."
        )
    current: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    current.update(module.named_buffers(remove_duplicate=False))
    # names that share one tensor (tied weights): id -> names
    ties: dict[int, list[str]] = {}
    for name, t in current.items():
        ties.setdefault(id(t), []).append(name)
    slots: list[_Slot] = []
    for key, value in params.items():
        where = f"params[{key!r}]"
        if not isinstance(key, str):
            raise TypeError(
                f"Expected params keyed by str names like module.named_parameters(), got {key!r}."
            )
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"Expected {where} to be a torch.Tensor, got {type(value).__name__}.")
        if key not in current:
            close = difflib.get_close_matches(key, sorted(current), n=3, cutoff=0.5)
            near = f" (nearest: {', '.join(map(repr, close))})" if close else ""
            raise ValueError(
                f"{where} names no parameter or buffer of the {type(module).__name__} module{near}; "
                f"expected keys of module.named_parameters()."
            )
        target = current[key]
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(
                f"Expected {where} to have the shape of the module's {key!r}, {tuple(target.shape)}, "
                f"got {tuple(value.shape)}."
            )
        owner_name, _, attr = key.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        sparse = _is_sparse(value)
        tied = [n for n in ties[id(target)] if n != key]
        if sparse:
            _check_sparse(where, key, value, owner, attr, tied)
        for other in tied:
            if other in params and params[other] is not value and not _same_values(params[other], value):
                raise ValueError(
                    f"params[{key!r}] and params[{other!r}] name one tied weight of the module but "
                    f"hold different values; give one of them, or equal values."
                )
        slots.append(_Slot(key, owner, attr, value, sparse))
    return slots


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
    return a.shape == b.shape and bool(torch.equal(a.detach().to(b.dtype), b.detach()))


def _put(slot: _Slot) -> None:
    owner, attr, value = slot.owner, slot.attr, slot.value
    if slot.sparse:
        owner._parameters.pop(attr, None)
        owner._buffers.pop(attr, None)
        owner.register_buffer(attr, value)
        return
    if attr in owner._buffers and _is_sparse(owner._buffers[attr]):
        # back to a dense parameter
        del owner._buffers[attr]
        owner.register_parameter(attr, torch.nn.Parameter(value.detach().clone()))
        return
    target = owner._parameters[attr] if attr in owner._parameters else owner._buffers[attr]
    if target is not None and value is not target:
        target.copy_(value)
