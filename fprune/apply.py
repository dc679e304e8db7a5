"""Applying masks: pruned values as a new pytree, or a module run with them via functional_call."""

from __future__ import annotations

from typing import Any

import torch
from torch.func import functional_call

from fprune import _names, _torch, _tree, packed
from fprune.distributed import _fsdp

__all__ = ["apply_masks", "masked_call"]


# Under torch.compile, inductor's CPU code reads a torch.bool input slowly (docs/performance.md,
# "Reading bool masks"), so a bool mask enters the graph as a uint8 copy made by this opaque op;
# the graph converts uint8 to the weight's dtype, which it fuses well. No gradient (not
# floating-point) and elementwise, so vmap batches it as it is.
@torch.library.custom_op("fprune::mask_as_uint8", mutates_args=())
def _mask_as_uint8(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.uint8)


@_mask_as_uint8.register_fake
def _(mask: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(mask, dtype=torch.uint8)


@_mask_as_uint8.register_vmap
def _(info: Any, in_dims: tuple[int | None, ...], mask: torch.Tensor) -> tuple[torch.Tensor, int | None]:
    return _mask_as_uint8(mask), in_dims[0]


def apply_masks(params: Any, masks: Any, *, straight_through: bool = False) -> Any:
    """The pruned parameters: each leaf with its pruned entries set to zero.

    ``masks`` has the structure of ``params`` or is a part of it: a dict may leave keys out,
    and those leaves come back as they are (unpruned). Masks are ``torch.bool`` (``True`` =
    kept), 0/1 tensors of any dtype (such as torch.nn.utils.prune's float buffers), or
    bit-packed masks from :func:`fprune.packed.pack_masks` (unpacked here, in eager code). Each
    leaf becomes ``p * mask`` (the mask cast to ``p``'s dtype), exactly as torch.nn.utils.prune's
    hook computes it: pruned entries are zeros (``-0.0`` where the weight is negative; an inf or
    NaN weight gives NaN, as in torch), and gradients through the result are zero there. A mask
    already in ``p``'s dtype is multiplied as it is, with no conversion.

    With ``straight_through=True`` the values are the same but the gradient is dense: the
    backward pass hands the incoming gradient to ``p`` unmasked (a straight-through
    estimator), so one backward pass gives both the masked model's loss and the dense
    gradient that RigL grows connections by. Mask it yourself before an optimizer step.

    Example:
        >>> import torch, fprune
        >>> params = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
        >>> fprune.apply_masks(params, {"w": torch.tensor([True, False])})
        {'w': tensor([1., 0.]), 'b': tensor([3.])}
        >>> w = torch.tensor([1.0, 2.0], requires_grad=True)
        >>> out = fprune.apply_masks({"w": w}, {"w": torch.tensor([True, False])}, straight_through=True)
        >>> out["w"].sum().backward(); w.grad
        tensor([1., 1.])
    """
    if not isinstance(straight_through, bool):
        raise TypeError(f"Expected straight_through to be a bool, got {straight_through!r}.")
    return _apply(_tree.flatten(params, "params"), masks, straight_through)


def _apply(flat: _tree.Flat, masks: Any, straight_through: bool) -> Any:
    """:func:`apply_masks` of flattened, checked ``params``."""
    if packed.holds_packed(masks):
        masks = packed.unpack_masks(masks)
    matched = _tree.align_masks(flat, masks)
    for path, p, m in zip(flat.paths, flat.leaves, matched, strict=True):
        if m is not None and m.device != p.device and not (m.dim() == 0 and m.device.type == "cpu"):
            # torch would raise its own "Expected all tensors to be on the same device" (or, for
            # a meta leaf, "not on the expected device") deep inside the multiply; a CPU 0-dim
            # mask is a scalar operand that torch accepts on any device.
            raise ValueError(
                f"Expected {_tree.describe('masks', path)} on the device of "
                f"{_tree.describe('params', path)}, {p.device}, got {m.device}; move the masks "
                f"with .to({str(p.device)!r})."
            )
    # The values of non-bool masks (0/1 only) are read in eager code, one read for all of them.
    others = [m for m in matched if m is not None and m.dtype != torch.bool]
    if others:
        _tree.check_mask_values(flat, matched, _torch.is_traced(flat.leaves + others))
    mask_fn = _masked_straight_through if straight_through else _masked
    out = [p if m is None else mask_fn(p, m) for p, m in zip(flat.leaves, matched, strict=True)]
    return _tree.unflatten(flat, out)


def _masked(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``p * mask`` with the mask in ``p``'s dtype, as torch.nn.utils.prune's hook computes it.

    A multiply rather than ``torch.where``: faster on the CPU (docs/performance.md), exactly
    torch's arithmetic, and the same pure op in eager code, under transforms and when compiled.
    The mask is cast once here (a bool operand would be cast again in the backward). A bool
    mask is read as uint8, the faster read: a uint8 view in eager code, a uint8 copy when
    compiling (:func:`_mask_as_uint8`). A mask of another dtype holds 0 and 1 (checked in
    eager code), so it is cast as it is.
    """
    if mask.dtype == p.dtype:
        return p * mask
    if mask.dtype == torch.bool:
        if _torch.is_dynamo_compiling():
            mask = _mask_as_uint8(mask)
        else:
            mask = mask.view(torch.uint8)
    return p * mask.to(p.dtype)


def _masked_straight_through(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pruned values forward, the gradient passed to every entry of ``p``.

    ``p - p.detach()`` is zero with a gradient of one. Not an ``autograd.Function``:
    ``torch.compile`` of ``torch.func.grad`` ignores a custom backward (torch 2.13), while
    this is plain autograd everywhere. Pruned entries are ``+0.0`` (``p * mask`` gives ``-0.0``
    for a negative weight; they compare equal) and NaN for a non-finite weight, as in torch.
    """
    return torch.where(_tree.as_bool(mask), p, p - p.detach())


def masked_call(
    module: torch.nn.Module,
    params: Any,
    masks: Any,
    args: Any,
    kwargs: dict | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
    straight_through: bool = False,
) -> Any:
    """Run ``module`` with its parameters replaced by the pruned ``params``.

    A thin wrapper over ``torch.func.functional_call(module, apply_masks(params, masks), args,
    kwargs)``: ``params`` is a flat dict keyed like ``module.named_parameters()`` (a part of
    them is fine); buffers and parameters not in ``params`` are used as they are. Since the
    tensors are substituted by name, masks also reach weights that are read outside
    ``forward`` hooks (``nn.MultiheadAttention.out_proj``, ``nn.LSTM``'s flat weights), and
    the call works under ``vmap``, ``grad`` and ``torch.compile``. ``straight_through=True``
    makes the gradient with respect to ``params`` dense (see :func:`apply_masks`).

    Args:
        module: the module to run; it is not modified.
        params: a flat dict ``name -> tensor``. Every key must name a parameter or buffer of
            ``module`` (``named_parameters()`` / ``named_buffers()``, tied aliases included),
            or a plain tensor attribute (which ``functional_call`` replaces too).
        masks: masks keyed like ``params`` (or a part of them), bool, 0/1 or bit-packed.
        args, kwargs: the positional and keyword arguments of ``module``'s forward.
        tie_weights, strict: passed to ``torch.func.functional_call``: ``strict=True`` also
            requires every parameter and buffer of ``module`` to be in ``params``.

    Returns:
        What ``module`` returns.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module`` or ``params`` is not a dict.
        ValueError: a key of ``params`` names nothing in ``module`` (``functional_call`` would
            silently ignore it, and its mask with it: the module would run on its own dense
            tensor); the message names the nearest real names. So does a key whose tensor a
            ``torch.nn.utils.prune`` hook recomputes (the hook would overwrite it), a key of
            ``masks`` that is not in ``params``, a mask of the wrong shape, and two keys that
            name one tied tensor with different (pruned) values (with ``tie_weights=True``:
            keep one of them).

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(2, 1)
        >>> params = dict(model.named_parameters())
        >>> masks = {"weight": torch.tensor([[True, False]])}
        >>> x = torch.tensor([[1.0, 100.0]])
        >>> torch.allclose(fprune.masked_call(model, params, masks, (x,)), model.weight[0, 0] + model.bias)
        True
    """
    _tree.check_module_and_params(module, params)
    if not isinstance(straight_through, bool):
        raise TypeError(f"Expected straight_through to be a bool, got {straight_through!r}.")
    _check_names(module, params)
    if _fsdp.is_fsdp(module):  # FSDP2 owns the parameters: mask inside its forward instead
        return _fsdp.masked_call(module, params, masks, args, kwargs, straight_through=straight_through)
    # The names were checked against the module itself (_check_names), not by the name alone.
    pruned = _apply(_tree.flatten(params, "params", hook_names=False), masks, straight_through)
    if tie_weights:
        _check_tied(module, pruned)
    return functional_call(
        module,
        pruned,
        args,
        kwargs,
        tie_weights=tie_weights,
        strict=strict,
    )


def _check_names(module: torch.nn.Module, params: dict) -> None:
    """Every key of ``params`` must name a parameter, buffer or tensor attribute of ``module``.

    ``functional_call`` silently ignores a key that matches nothing, and so would the mask
    given for it: the module would run on its own dense tensor. That is always a mistake
    (typically ``torch.nn.utils.prune``'s ``weight_orig`` names, or a prefix such as
    ``model.``), so it raises here, naming the key and the nearest real names. A tensor that a
    prune hook recomputes before every forward (``weight`` of a hook-pruned layer) is refused
    too: the hook would overwrite what ``params`` gives.
    """
    resolved = _names.Names(module)
    names, buffers = resolved.tensors, resolved.buffers
    for key in params:
        base = _tree.hook_base(str(key))
        if key in names and base is not None and base + "_mask" in buffers:
            raise _tree.hook_names_error(
                f"params[{key!r}]",
                base,
                f"the {type(module).__name__} module has the hook's {base + '_mask'!r} buffer beside it",
                by_name=False,
            )
    unknown = [key for key in params if key not in names]
    for key in unknown:
        if f"{key}_orig" in names and _is_tensor_attribute(module, key):
            raise ValueError(
                f"params[{key!r}] is recomputed by a torch.nn.utils.prune hook of the "
                f"{type(module).__name__} module before every forward, so what params gives "
                f"for it would be overwritten. Run masked_call on an unpruned module (say "
                f"fprune.compat.strip_pruning(model)), with params and masks from "
                f"fprune.compat.hooks_to_functional(model)."
            )
    # Plain tensor attributes (not parameters or buffers) are replaced by functional_call too.
    missing = [key for key in unknown if not _is_tensor_attribute(module, key)]
    if not missing:
        return
    key = missing[0]
    hint = ""
    if isinstance(key, str) and key.endswith("_orig") and key[: -len("_orig")] in names:
        hint = (
            " It looks like a torch.nn.utils.prune name: "
            "fprune.compat.hooks_to_functional(model) gives params and masks keyed like the "
            "unpruned model."
        )
    near = _names.near(key, names)
    shown = _tree.listing([repr(k) for k in missing])
    raise ValueError(
        f"params[{key!r}] names no parameter or buffer of the {type(module).__name__} module"
        f"{near}, so neither it nor its mask would be used. Expected keys of "
        f"module.named_parameters() or module.named_buffers(); unknown keys: {shown}.{hint}"
    )


def _check_tied(module: torch.nn.Module, params: dict) -> None:
    """Two keys of ``params`` (pruned) that name one tied tensor with two different values.

    ``functional_call(tie_weights=True)`` refuses two values for tied names and suggests
    ``tie_weights=False``, which would let the two uses of one weight differ (each pruned by
    its own mask), silently untying it. Keeping one name is what the user means.
    """
    seen: dict = {}
    for name, tensor in _names.Names(module).tensors.items():
        if name in params:
            first = seen.setdefault(id(tensor), name)
            if first != name and params[first] is not params[name]:
                raise ValueError(
                    f"params has both {first!r} and {name!r}, two names of one tied tensor of "
                    f"the {type(module).__name__} module; keep one (module.named_parameters() "
                    f"lists it once, as {first!r}) with its mask: masked_call gives the pruned "
                    f"tensor to every use (tie_weights=True). tie_weights=False would untie them."
                )


def _is_tensor_attribute(module: torch.nn.Module, key: Any) -> bool:
    try:
        sub, attr = _names.owner(module, str(key))
    except AttributeError:
        return False
    return isinstance(getattr(sub, attr, None), torch.Tensor)
