"""Bridges between prune-style modules (hooks, ``_orig``/``_mask``) and fprune's functional masks.

* :func:`hooks_to_functional` - the ``(params, masks)`` of a hook-pruned model, keyed by the
  names that ``named_parameters()``/``functional_call`` use for the *unpruned* model
  (``"fc1.weight"``, not ``"fc1.weight_orig"``). Nothing is changed.
* :func:`strip_pruning` - turn a hook-pruned model back into a plain one, in place, and return
  its masks: then ``fprune.masked_call(model, dict(model.named_parameters()), masks, args)``
  computes what the hooks computed.
* :func:`functional_to_hooks` - the inverse: install functional masks as prune-style hooks.
* :func:`load_pruned_state_dict` - load a pruned checkpoint (``*_orig``/``*_mask`` keys) into
  an unpruned model, baking the masks into the weights or installing them as hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.utils.prune as _torch_prune

from fprune import packed
from fprune.compat import _hooks
from fprune.compat.functions import custom_from_mask

__all__ = ["hooks_to_functional", "strip_pruning", "functional_to_hooks", "load_pruned_state_dict"]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _pruned_tensors(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(full name, submodule, tensor name) of every tensor a pruning hook acts on."""
    out = []
    for prefix, sub in module.named_modules():
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, _torch_prune.BasePruningMethod):
                name = hook._tensor_name
                out.append((_join(prefix, name), sub, name))
    return out


def hooks_to_functional(
    module: torch.nn.Module,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The parameters and boolean masks of a hook-pruned model, keyed as in the unpruned model.

    ``params`` holds every parameter (for a pruned one, its ``_orig`` Parameter, unmasked) and
    ``masks`` one ``torch.bool`` mask per pruned tensor (``True`` = kept, from the
    ``_mask`` buffer). Both are keyed by the names the model has without pruning, so they go
    straight to :func:`fprune.masked_call` on an unpruned instance of the architecture (or on
    this model after :func:`strip_pruning`), and to the core's functions as ``masks=``.
    Works on models pruned by ``torch.nn.utils.prune`` too. Nothing is modified.

    Args:
        module (nn.Module): a model pruned with prune-style hooks.

    Returns:
        ``(params, masks)``, two dicts of tensors.

    Example:
        >>> import torch, fprune
        >>> from fprune import compat as prune
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3))
        >>> _ = prune.l1_unstructured(model[0], "weight", amount=6)
        >>> params, masks = prune.hooks_to_functional(model)
        >>> sorted(params), sorted(masks), int(masks["0.weight"].sum())
        (['0.bias', '0.weight'], ['0.weight'], 6)
        >>> plain = torch.nn.Sequential(torch.nn.Linear(4, 3))
        >>> x = torch.randn(2, 4)
        >>> torch.allclose(fprune.masked_call(plain, params, masks, (x,)), model(x))
        True
    """
    tensors = _pruned_tensors(module)
    pruned = {(id(sub), name) for _, sub, name in tensors}
    params: dict[str, torch.Tensor] = {}
    for full, param in module.named_parameters():
        prefix, _, leaf = full.rpartition(".")
        base = _hooks.base_name(leaf)
        if base is not None and (id(module.get_submodule(prefix)), base) in pruned:
            full = _join(prefix, base)
        params[full] = param
    masks = {full: _hooks.mask_of(sub, name) != 0 for full, sub, name in tensors}
    return params, masks


def strip_pruning(module: torch.nn.Module, *, bake: bool = False) -> dict[str, torch.Tensor]:
    """Remove every pruning hook of ``module`` in place and return the masks (``torch.bool``).

    Each pruned tensor ``name`` becomes a plain Parameter again: the ``_orig`` Parameter object
    (so optimizers keep training it), unmasked unless ``bake=True`` (then pruned entries are
    zeroed, as :func:`fprune.compat.remove` does). The ``_mask`` buffers are dropped; their
    contents come back as the returned dict, keyed as ``named_parameters()`` now names them.
    All-or-nothing.

    Args:
        module (nn.Module): a model pruned with prune-style hooks (torch's or fprune.compat's).
        bake (bool): also zero the pruned entries of the weights.

    Returns:
        ``{name: bool mask}`` for every tensor that was pruned.

    Example:
        >>> import torch, fprune
        >>> from fprune import compat as prune
        >>> model = torch.nn.Linear(4, 3)
        >>> _ = prune.l1_unstructured(model, "weight", amount=0.5)
        >>> x = torch.randn(2, 4)
        >>> expected = model(x)
        >>> masks = prune.strip_pruning(model)
        >>> prune.is_pruned(model), [n for n, _ in model.named_parameters()]
        (False, ['bias', 'weight'])
        >>> torch.allclose(fprune.masked_call(model, dict(model.named_parameters()), masks, (x,)), expected)
        True
    """
    tensors = _pruned_tensors(module)
    masks = {}
    with _hooks.transaction(sub for _, sub, _ in tensors):
        for full, sub, name in tensors:
            masks[full] = _hooks.mask_of(sub, name) != 0
            for key, _ in _hooks.pruning_hooks(sub, name):
                del sub._forward_pre_hooks[key]
            _hooks.make_permanent(sub, name, bake=False)
    if bake:
        with torch.no_grad():
            for full, sub, name in tensors:
                param = getattr(sub, name)
                param.mul_(masks[full].to(param.dtype))
    return masks


def functional_to_hooks(module: torch.nn.Module, masks: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Install functional masks on ``module`` as prune-style hooks (``_orig``, ``_mask``).

    Each entry ``"fc1.weight": mask`` prunes that parameter with ``custom_from_mask`` (so it
    combines with earlier pruning, as torch's global pruning does). Masks are ``torch.bool``
    (``True`` = kept) or 0/1 of any dtype; parameters left out of ``masks`` are not touched.
    All-or-nothing: on an error no module is changed.

    Args:
        module (nn.Module): the model.
        masks (Mapping[str, Tensor]): masks keyed by ``named_parameters()`` names (bit-packed
            ones from :func:`fprune.pack_masks` too).

    Returns:
        ``module``.

    Raises:
        KeyError: a key names no parameter of ``module``.

    Example:
        >>> import torch, fprune
        >>> from fprune import compat as prune
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        >>> masks = fprune.global_unstructured(dict(model.named_parameters()), 0.5)
        >>> _ = prune.functional_to_hooks(model, masks)
        >>> sorted(name for name, _ in model.named_buffers())
        ['0.bias_mask', '0.weight_mask', '1.bias_mask', '1.weight_mask']
    """
    if packed.holds_packed(masks):
        masks = packed.unpack_masks(masks)  # bit-packed masks (fprune.pack_masks), as apply_masks takes
    targets = []
    for full, mask in masks.items():
        prefix, _, name = full.rpartition(".")
        try:
            sub = module.get_submodule(prefix)
        except AttributeError as error:
            raise KeyError(f"masks[{full!r}] names no submodule of {type(module).__name__}.") from error
        if name not in sub._parameters and not _hooks.pruning_hooks(sub, name):
            example = next(iter(dict(module.named_parameters())), None)
            raise KeyError(
                f"masks[{full!r}] names no parameter of {type(module).__name__}; expected keys "
                f"of module.named_parameters(), such as {example!r}."
            )
        targets.append((sub, name, mask))
    with _hooks.transaction(sub for sub, _, _ in targets):
        for sub, name, mask in targets:
            custom_from_mask(sub, name, mask)
    return module


def load_pruned_state_dict(
    module: torch.nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    *,
    install_hooks: bool = False,
    strict: bool = True,
) -> Any:
    """Load a checkpoint of a pruned model (``*_orig``/``*_mask`` keys) into an unpruned model.

    With ``install_hooks=False`` (the default) the masks are baked in: ``name`` is loaded with
    ``name_mask * name_orig`` and the model stays a plain model. With ``install_hooks=True`` the
    model is pruned first (one ``custom_from_mask`` hook per pruned tensor) and the checkpoint
    then loads as it is, so the model can be trained further with the masks held fixed.
    Tensors already pruned in ``module`` load into their ``_orig``/``_mask`` either way.

    Args:
        module (nn.Module): the model (unpruned, or pruned in part).
        state_dict (Mapping[str, Tensor]): the checkpoint.
        install_hooks (bool): install the masks as hooks instead of baking them.
        strict (bool): as in ``load_state_dict``.

    Returns:
        ``load_state_dict``'s ``NamedTuple`` of ``missing_keys`` and ``unexpected_keys``.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> pruned = prune.l1_unstructured(torch.nn.Linear(4, 3), "weight", amount=6)
        >>> plain = torch.nn.Linear(4, 3)
        >>> prune.load_pruned_state_dict(plain, pruned.state_dict())
        <All keys matched successfully>
        >>> torch.equal(plain.weight, pruned.weight), prune.is_pruned(plain)
        (True, False)
    """
    already = {full for full, _, _ in _pruned_tensors(module)}
    bases = [_hooks.base_name(key) for key in state_dict]
    pairs = [base for base in bases if base is not None and base + _hooks.MASK in state_dict]
    todo = [base for base in pairs if base not in already]
    if not install_hooks:
        converted = {}
        skip = {base + suffix for base in todo for suffix in (_hooks.ORIG, _hooks.MASK)}
        for key, value in state_dict.items():
            if key not in skip:
                converted[key] = value
                continue
            base = _hooks.base_name(key)
            if base is not None:  # an ``_orig`` key; its ``_mask`` key is not loaded on its own
                with torch.no_grad():
                    converted[base] = state_dict[base + _hooks.MASK].to(value.dtype) * value
        return module.load_state_dict(converted, strict=strict)
    known = dict(module.named_parameters())
    targets = []
    for base in todo:
        if base not in known:
            if strict:
                raise KeyError(
                    f"The checkpoint prunes {base!r} ({base}_orig, {base}_mask), which is not a "
                    f"parameter of {type(module).__name__}; pass strict=False to skip it."
                )
            continue
        prefix, _, name = base.rpartition(".")
        targets.append((module.get_submodule(prefix), name, state_dict[base + _hooks.MASK]))
    with _hooks.transaction(list(module.modules())):
        for sub, name, mask in targets:
            custom_from_mask(sub, name, mask)
        result = module.load_state_dict(state_dict, strict=strict)
        for _, sub, name in _pruned_tensors(module):
            for _, hook in _hooks.pruning_hooks(sub, name):
                setattr(sub, name, hook.apply_mask(sub))
    return result
