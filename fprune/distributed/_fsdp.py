"""Private: ``masked_call`` on models sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``).

``torch.func.functional_call`` cannot run an FSDP2 model with other tensors: FSDP2 owns its
parameters' storage, all-gathers them from its own shards before each forward (so the swapped
tensors are ignored), and at its lazy initialisation adopts whatever tensor the module holds as
its sharded parameter (the masked, non-leaf tensor), after which ``.grad`` never reaches the
real parameters. Here the masks are applied *inside* FSDP2's lifecycle instead: for the call's
duration, a forward pre-hook on each FSDP2 module (it runs after FSDP2's own pre-hook has
all-gathered its parameters) replaces each masked unsharded parameter with ``unsharded * mask``
for that module's forward, and a forward hook puts it back before FSDP2 reshards. Gradients flow through
the product into the unsharded parameter, which FSDP2 reduce-scatters into the sharded
``.grad`` as usual: the loss, gradients and optimizer step are those of the same
``masked_call`` in one process. The full mask of a module is gathered (1 byte per entry) when
its forward starts, like its weights, and its backward keeps only that bool mask. The hooks
exist only during the call: activation checkpointing, which re-runs forwards during the
backward, would re-run them unmasked.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from fprune import _tree, packed


def is_fsdp(module: torch.nn.Module) -> bool:
    """True when ``module`` or a submodule is managed by FSDP2's ``fully_shard``."""
    # An imported submodule is an attribute of its package (read as one constant when traced,
    # where a lookup in sys.modules would wrap the whole dict of modules).
    fsdp = getattr(torch.distributed, "fsdp", None)
    if fsdp is None:  # never imported: nothing can be sharded by it
        return False
    return any(isinstance(m, fsdp.FSDPModule) for m in module.modules())


class _MaskMul(torch.autograd.Function):
    """``w * mask`` (the mask cast to ``w``'s dtype) whose backward keeps only the bool mask
    (or, straight-through, passes the gradient on dense: RigL's dense gradient)."""

    @staticmethod
    def forward(
        ctx: Any, weight: torch.Tensor, mask: torch.Tensor, straight_through: bool = False
    ) -> torch.Tensor:
        ctx.straight_through = straight_through
        ctx.save_for_backward(mask)
        return weight * mask.to(weight.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if ctx.straight_through:
            return grad, None, None
        (mask,) = ctx.saved_tensors
        return grad * mask.to(grad.dtype), None, None


def _full(mask: torch.Tensor) -> torch.Tensor:
    mask = _tree.as_bool(mask)
    dtensor = getattr(torch.distributed, "tensor", None)
    if dtensor is not None and isinstance(mask, dtensor.DTensor):
        return mask.full_tensor()
    return mask


def masked_call(
    module: torch.nn.Module,
    params: dict,
    masks: Any,
    args: Any,
    kwargs: dict | None,
    straight_through: bool = False,
) -> Any:
    """:func:`fprune.masked_call` on an FSDP2 model: ``params`` must be the model's own."""
    if packed.holds_packed(masks):
        masks = packed.unpack_masks(masks)
    own = dict(module.named_parameters())
    for name, p in params.items():
        if own.get(name) is not p:
            raise ValueError(
                f"masked_call on an FSDP2 (fully_shard) model runs the model's own parameters: "
                f"FSDP2 owns their storage and all-gathers them itself, so other tensors cannot "
                f"be substituted. params[{name!r}] is not module.get_parameter({name!r}); pass "
                f"dict(model.named_parameters())."
            )
    flat = _tree.flatten(params, "params")
    matched = _tree.align(flat, masks, "masks")
    managers = _managers(module)
    by_hook_owner: dict = {}
    for path, mask in zip(flat.paths, matched, strict=True):
        if mask is None:
            continue
        name = _tree.dotted(path)
        owner_name, _, param_name = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        # The masked tensor is put in place by a hook on the FSDP module that all-gathers the
        # parameter (its whole forward sees it: weights read outside their own module's forward,
        # such as MultiheadAttention's out_proj, are masked too), or on the owner if none does.
        hook_owner = managers.get((id(owner), param_name), owner)
        by_hook_owner.setdefault(id(hook_owner), (hook_owner, []))[1].append((owner, param_name, mask, name))
    handles = []
    try:
        for hook_owner, entries in by_hook_owner.values():
            handles.extend(_install(hook_owner, entries, straight_through))
        if not isinstance(args, tuple):
            args = (args,)
        return module(*args, **({} if kwargs is None else kwargs))
    finally:
        for handle in handles:
            handle.remove()


def _managers(module: torch.nn.Module) -> dict:
    """``(id(owner module), param name) -> the FSDPModule whose forward all-gathers it``."""
    fsdp = sys.modules["torch.distributed.fsdp"]
    out = {}
    for m in module.modules():
        if not isinstance(m, fsdp.FSDPModule):
            continue
        group = m._get_fsdp_state()._fsdp_param_group
        for fsdp_param in [] if group is None else group.fsdp_params:
            info = fsdp_param._module_info
            out[(id(info.module), info.param_name)] = m
            for shared, shared_name in zip(info.shared_modules, info.shared_param_names, strict=True):
                out[(id(shared), shared_name)] = m
    return out


def _install(hook_owner: torch.nn.Module, entries: list, straight_through: bool = False) -> list[Any]:
    state: list = []

    def pre_hook(mod: torch.nn.Module, args: Any) -> None:
        for owner, param_name, mask, name in entries:
            unsharded = owner._parameters[param_name]
            full = _full(mask)
            if tuple(full.shape) != tuple(unsharded.shape):
                raise ValueError(
                    f"masks[{name!r}] has shape {tuple(full.shape)} but the all-gathered "
                    f"parameter has shape {tuple(unsharded.shape)} (FSDP2 combined with tensor "
                    f"parallelism is not supported by masked_call)."
                )
            masked = _MaskMul.apply(unsharded, full.to(unsharded.device), straight_through)
            state.append((owner, param_name, unsharded, masked))
            owner._parameters[param_name] = masked

    def post_hook(mod: torch.nn.Module, args: Any, output: Any) -> None:
        for owner, param_name, unsharded, masked in state:
            if owner._parameters.get(param_name) is masked:
                owner._parameters[param_name] = unsharded
        state.clear()

    # The pre-hook runs after FSDP2's (prepended) all-gather; the post-hook before its reshard.
    return [
        hook_owner.register_forward_pre_hook(pre_hook),
        hook_owner.register_forward_hook(post_hook, prepend=True, always_call=True),
    ]
