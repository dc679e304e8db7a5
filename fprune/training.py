"""A bridge between fprune's pure functions and stateful ``torch.optim`` training of modules.

fprune computes masks as pure functions and applies them functionally (:func:`fprune.masked_call`).
Training with ``torch.optim`` is stateful: an optimizer updates ``module.parameters()`` in place
from their ``.grad``. These helpers connect the two, each doing one in-place thing:

* :func:`set_grads` - gradients from ``torch.func.grad`` (a dict keyed like
  ``named_parameters()``) into each parameter's ``.grad``, so ``optimizer.step()`` uses them;
* :func:`load_buffers` - buffers that a functional call updated (BatchNorm's running statistics,
  passed in as copies) back into the module;
* :func:`apply_masks_` - the pruned entries of the module's own parameters set to zero, in place
  (the in-place twin of :func:`fprune.apply_masks`);
* :func:`mask_grads_` - the ``.grad`` of pruned entries set to zero, in place;
* :func:`keep_masked` - an optimizer hook: before every ``optimizer.step()`` the gradients are
  masked, after it the pruned entries are set to zero again, so no optimizer (momentum, weight
  decay, Adam's moments) can bring a pruned weight back. Returns a handle; ``handle.remove()``.

Every function checks names before changing anything: a key that names no parameter (or buffer)
of the module raises ``ValueError`` naming the nearest real names, and a shape that differs
raises too, so a call either does all of its work or none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fprune import _names, _tree, packed

__all__ = ["set_grads", "load_buffers", "apply_masks_", "mask_grads_", "keep_masked", "MaskHandle"]


def _lookup(
    module: torch.nn.Module, tree: Mapping, argname: str, *, buffers: bool
) -> dict[str, torch.Tensor]:
    """``{key: module tensor}`` for each key of the flat dict ``tree``; errors name the nearest."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    return _names.Names(module, parameters=not buffers, buffers=buffers).resolve(argname, tree)


def _bool_masks(masks: Any) -> Mapping:
    if packed.holds_packed(masks):
        masks = packed.unpack_masks(masks)
    return masks


def set_grads(module: torch.nn.Module, grads: Mapping, *, accumulate: bool = False) -> None:
    """Write gradients (say from ``torch.func.grad``) into the ``.grad`` of ``module``'s parameters.

    Args:
        module: the module whose parameters the optimizer holds.
        grads: a flat dict ``name -> tensor`` keyed like ``module.named_parameters()`` (a part
            of them is fine: the others keep their ``.grad``).
        accumulate: add to an existing ``.grad`` (as ``backward()`` does) instead of replacing it.
            Without it, ``.grad`` is ``grads[name]`` itself (no copy is made).

    Raises:
        TypeError / ValueError: a key that names no parameter (nearest names in the message),
            a non-tensor value, or a shape that differs. Nothing is written then.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(2, 1)
        >>> params = {k: v.detach() for k, v in model.named_parameters()}
        >>> loss = lambda p, x: fprune.masked_call(model, p, {}, (x,)).sum()
        >>> grads = torch.func.grad(loss)(params, torch.tensor([[1.0, 2.0]]))
        >>> fprune.training.set_grads(model, grads)
        >>> model.weight.grad
        tensor([[1., 2.]])
    """
    targets = _lookup(module, grads, "grads", buffers=False)
    for key, param in targets.items():
        g = grads[key].detach().to(dtype=param.dtype, device=param.device)
        # No copy: ``.grad`` shares memory with ``grads[key]`` (out of place when accumulating).
        param.grad = param.grad + g if accumulate and param.grad is not None else g


@torch.no_grad()
def load_buffers(module: torch.nn.Module, buffers: Mapping) -> None:
    """Copy ``buffers`` (say BatchNorm statistics a functional call updated) into ``module``'s buffers.

    ``torch.func.grad`` cannot update a module's own buffers in place; pass copies in
    (``masked_call(model, {**params, **buffers}, ...)`` updates ``buffers`` in training mode) and
    copy them back with this.

    Raises:
        TypeError / ValueError: a key that names no buffer (nearest names in the message), or a
            shape that differs. Nothing is copied then.

    Example:
        >>> import torch, fprune
        >>> bn = torch.nn.BatchNorm1d(2)
        >>> buffers = {k: v.clone() for k, v in bn.named_buffers()}
        >>> params = {k: v.detach() for k, v in bn.named_parameters()}
        >>> _ = fprune.masked_call(bn, {**params, **buffers}, {}, (torch.tensor([[0.0, 2.0], [2.0, 4.0]]),))
        >>> fprune.training.load_buffers(bn, buffers)
        >>> bn.running_mean, int(bn.num_batches_tracked)
        (tensor([0.1000, 0.3000]), 1)
    """
    targets = _lookup(module, buffers, "buffers", buffers=True)
    for key, buffer in targets.items():
        buffer.copy_(buffers[key])


@torch.no_grad()
def apply_masks_(module: torch.nn.Module, masks: Any) -> torch.nn.Module:
    """Set the pruned entries of ``module``'s parameters to zero, in place; returns ``module``.

    The in-place twin of :func:`fprune.apply_masks` (each parameter becomes ``p * mask``, so
    the values are the same), for models trained with ``torch.optim`` or saved with their
    ``state_dict``. ``masks`` is a flat dict keyed like ``named_parameters()`` (a part of them
    is fine), of bool, 0/1 or bit-packed masks.

    Raises:
        TypeError / ValueError: a key that names no parameter (nearest names in the message), or
            a shape that differs. Nothing is changed then.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(3, 1)
        >>> params = dict(model.named_parameters())
        >>> masks = fprune.l1_unstructured(params, 2, where=lambda n, p: n == "weight")
        >>> _ = fprune.training.apply_masks_(model, masks)
        >>> int((model.weight == 0).sum())
        2
    """
    masks = _bool_masks(masks)
    targets = _lookup(module, masks, "masks", buffers=False)
    for key, param in targets.items():
        param.mul_(_tree.as_bool(masks[key]).to(param.dtype))
    return module


@torch.no_grad()
def mask_grads_(module: torch.nn.Module, masks: Any) -> torch.nn.Module:
    """Set the ``.grad`` of pruned entries to zero, in place; returns ``module``.

    Parameters without a ``.grad`` are skipped. Needed when gradients come from the dense
    module (``model(x).backward()``); gradients through :func:`fprune.masked_call` are zero at
    pruned entries already.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(2, 1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> _ = fprune.training.mask_grads_(model, {"weight": torch.tensor([[True, False]])})
        >>> model.weight.grad
        tensor([[1., 0.]])
    """
    masks = _bool_masks(masks)
    targets = _lookup(module, masks, "masks", buffers=False)
    for key, param in targets.items():
        if param.grad is not None:
            param.grad.mul_(_tree.as_bool(masks[key]).to(param.grad.dtype))
    return module


class MaskHandle:
    """What :func:`keep_masked` returns: ``remove()`` takes its optimizer hooks off."""

    def __init__(self, handles: list[Any]) -> None:
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def keep_masked(optimizer: torch.optim.Optimizer, module: torch.nn.Module, masks: Any) -> MaskHandle:
    """Keep ``module`` pruned through every ``optimizer.step()``: a pair of optimizer hooks.

    Before each step the gradients of pruned entries are set to zero (:func:`mask_grads_`);
    after it the pruned entries themselves are set to zero (:func:`apply_masks_`), so momentum,
    weight decay or Adam's moments cannot revive them. The masks are also applied once now.

    ``masks`` is read at every step: to prune further during training, update the same dict in
    place (``masks.update(new_masks)``), or ``remove()`` the handle and call this again.

    Args:
        optimizer: any ``torch.optim.Optimizer`` over (some of) ``module``'s parameters.
        module: the module whose parameters ``masks`` is keyed by.
        masks: a flat dict keyed like ``module.named_parameters()`` (a part of them is fine).

    Returns:
        A :class:`MaskHandle`; ``handle.remove()`` stops the masking.

    Raises:
        TypeError / ValueError: as :func:`apply_masks_`, checked now.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Linear(4, 1)
        >>> params = dict(model.named_parameters())
        >>> masks = fprune.l1_unstructured(params, 0.5, where=lambda n, p: n == "weight")
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
        >>> handle = fprune.training.keep_masked(opt, model, masks)
        >>> for _ in range(3):
        ...     model(torch.randn(8, 4)).square().mean().backward()
        ...     opt.step()
        ...     opt.zero_grad()
        >>> bool((model.weight[~masks["weight"]] == 0).all())
        True
        >>> handle.remove()
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"Expected optimizer to be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    apply_masks_(module, masks)  # checks the names and shapes once, and starts from zeros

    def before(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        mask_grads_(module, masks)

    def after(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        apply_masks_(module, masks)

    return MaskHandle([optimizer.register_step_pre_hook(before), optimizer.register_step_post_hook(after)])
