"""The functions of ``torch.nn.utils.prune``: same signatures, defaults, results and exceptions.

``global_unstructured`` with ``L1Unstructured`` or ``RandomUnstructured`` ranks the tensors
through :func:`fprune.global_unstructured`, which streams over them: no concatenated copy of
every score and mask is made. Custom methods get torch's generic path (they are written to see
the concatenated vector).
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.nn.utils.prune as _torch_prune

import fprune
from fprune import _warn
from fprune.compat import _errors, _hooks
from fprune.compat._checks import check_target, largest_first, prune_count
from fprune.compat.methods import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    PruningContainer,
    RandomStructured,
    RandomUnstructured,
)

__all__ = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
]


def identity(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Install the pruning re-parametrization of ``module.<name>`` without pruning anything.

    Args:
        module (nn.Module): module containing the tensor.
        name (str): parameter name within ``module``.

    Returns:
        ``module``, with ``name + "_orig"``, the all-ones buffer ``name + "_mask"`` and the hook.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> prune.identity(torch.nn.Linear(2, 3), "bias").bias_mask
        tensor([1., 1., 1.])
    """
    Identity.apply(module, name)
    return module


def random_unstructured(module: torch.nn.Module, name: str, amount: int | float) -> torch.nn.Module:
    """Prune ``amount`` random (currently unpruned) entries of ``module.<name>``.

    Draws from torch's global generator exactly as ``torch.nn.utils.prune`` does, so under the
    same ``torch.manual_seed`` the mask is torch's.

    Args:
        module (nn.Module): module containing the tensor to prune.
        name (str): parameter name within ``module``.
        amount (int or float): how many entries to prune, or the fraction (in [0, 1]) of the
            entries still unpruned.

    Returns:
        ``module``, pruned in place.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = prune.random_unstructured(torch.nn.Linear(2, 3), "weight", amount=1)
        >>> int(torch.sum(m.weight_mask == 0))
        1
    """
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(
    module: torch.nn.Module, name: str, amount: int | float, importance_scores: torch.Tensor | None = None
) -> torch.nn.Module:
    """Prune the ``amount`` (currently unpruned) entries of ``module.<name>`` of lowest magnitude.

    Args:
        module (nn.Module): module containing the tensor to prune.
        name (str): parameter name within ``module``.
        amount (int or float): how many entries to prune, or the fraction (in [0, 1]) of the
            entries still unpruned.
        importance_scores (torch.Tensor): ranks the entries by ``|importance_scores|`` instead
            of ``|module.<name>|``; the shape of the parameter.

    Returns:
        ``module``, pruned in place.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = prune.l1_unstructured(torch.nn.Linear(2, 3), "weight", amount=0.2)
        >>> list(m.state_dict().keys())
        ['bias', 'weight_orig', 'weight_mask']
    """
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module: torch.nn.Module, name: str, amount: int | float, dim: int) -> torch.nn.Module:
    """Prune ``amount`` random (currently unpruned) channels of ``module.<name>`` along ``dim``.

    Args:
        module (nn.Module): module containing the tensor to prune.
        name (str): parameter name within ``module``.
        amount (int or float): how many channels to prune, or the fraction (in [0, 1]) of the
            channels still unpruned.
        dim (int): the dim along which channels are defined.

    Returns:
        ``module``, pruned in place.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = prune.random_structured(torch.nn.Linear(5, 3), "weight", amount=3, dim=1)
        >>> int(sum(torch.sum(m.weight, dim=0) == 0))
        3
    """
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(
    module: torch.nn.Module,
    name: str,
    amount: int | float,
    n: int | float | str,
    dim: int,
    importance_scores: torch.Tensor | None = None,
) -> torch.nn.Module:
    r"""Prune the ``amount`` (currently unpruned) channels of ``module.<name>`` of lowest L\ ``n`` norm.

    Args:
        module (nn.Module): module containing the tensor to prune.
        name (str): parameter name within ``module``.
        amount (int or float): how many channels to prune, or the fraction (in [0, 1]) of the
            channels still unpruned.
        n (int, float, inf, -inf, 'fro', 'nuc'): the norm's order, as ``p`` of ``torch.norm``.
        dim (int): the dim along which channels are defined.
        importance_scores (torch.Tensor): channels are ranked by their norms in these scores
            instead of the parameter's; the shape of the parameter.

    Returns:
        ``module``, pruned in place.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = prune.ln_structured(torch.nn.Conv2d(5, 3, 2), "weight", amount=0.3, dim=1, n=float("-inf"))
        >>> int((m.weight_mask.sum(dim=(0, 2, 3)) == 0).sum())
        2
    """
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: torch.nn.Module, name: str, mask: torch.Tensor) -> torch.nn.Module:
    """Prune ``module.<name>`` with a given ``mask`` (combined with any earlier pruning).

    The hook keeps no reference to ``mask``: it is multiplied into the ``name + "_mask"``
    buffer, which the hook reads (pytorch#34257).

    Args:
        module (nn.Module): module containing the tensor to prune.
        name (str): parameter name within ``module``.
        mask (Tensor): 0/1 (or bool) mask of the parameter's shape; 0 = pruned.

    Returns:
        ``module``, pruned in place.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = prune.custom_from_mask(torch.nn.Linear(5, 3), name="bias", mask=torch.tensor([0, 1, 0]))
        >>> m.bias_mask
        tensor([0., 1., 0.])
    """
    CustomFromMask.apply(module, name, mask)
    return module


def remove(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Make the pruning of ``module.<name>`` permanent and remove its hook.

    ``name`` becomes a Parameter again (the same object as ``name + "_orig"`` was), holding the
    pruned values; ``_orig`` and ``_mask`` are gone. Works on hooks installed by
    ``torch.nn.utils.prune`` too.

    Args:
        module (nn.Module): module containing the pruned tensor.
        name (str): parameter name within ``module``.

    Returns:
        ``module``.

    Raises:
        ValueError: ``module.<name>`` is not pruned.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = prune.random_unstructured(torch.nn.Linear(5, 7), name="weight", amount=0.2)
        >>> m = prune.remove(m, name="weight")
        >>> [name for name, _ in m.named_parameters()]
        ['bias', 'weight']
    """
    for key, hook in _hooks.pruning_hooks(module, name):
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module: torch.nn.Module) -> bool:
    """Whether ``module`` or any submodule carries a pruning hook (torch's or fprune.compat's).

    Args:
        module (nn.Module): the module to inspect.

    Returns:
        True if a forward pre-hook of some submodule is a ``BasePruningMethod``.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> m = torch.nn.Linear(5, 7)
        >>> prune.is_pruned(m)
        False
        >>> prune.is_pruned(prune.random_unstructured(m, name="weight", amount=0.2))
        True
    """
    for _, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, _torch_prune.BasePruningMethod):
                return True
    return False


# ---------------------------------------------------------------------------------------------
# global_unstructured


_FAST_L1 = (L1Unstructured, _torch_prune.L1Unstructured)
_FAST_RANDOM = (RandomUnstructured, _torch_prune.RandomUnstructured)


def global_unstructured(
    parameters: Iterable[tuple[torch.nn.Module, str]],
    pruning_method: Any,
    importance_scores: dict[tuple[torch.nn.Module, str], torch.Tensor] | None = None,
    **kwargs: Any,
) -> None:
    """Prune the tensors ``parameters`` together: one ranking across all of them.

    Same contract as ``torch.nn.utils.prune.global_unstructured``: each tensor gets a
    ``CustomFromMask`` hook (combined with earlier pruning) and a ``name + "_mask"`` buffer.
    For ``L1Unstructured`` and ``RandomUnstructured`` the ranking is
    :func:`fprune.global_unstructured` over the tensors one by one (random draws are torch's,
    from the global generator): no concatenated copy of all scores or masks is built, and the
    hooks keep no slice of one. Other methods (custom ones) see the concatenated vector, as in
    torch. All-or-nothing: if anything fails, every module is left as it was. ``parameters``
    may be any iterable, a generator included.

    Args:
        parameters (Iterable of (module, name) tuples): the tensors to prune together.
        pruning_method (type): a pruning method class with ``PRUNING_TYPE == "unstructured"``.
        importance_scores (dict): maps ``(module, name)`` to the scores of that tensor (its
            shape); the tensor itself is ranked where it has none.
        kwargs: passed on to ``pruning_method``, e.g. ``amount`` (int: how many entries to
            prune in all; float in [0, 1]: the fraction of all entries still unpruned).

    Raises:
        TypeError: ``parameters`` is not iterable, ``importance_scores`` is not a dict, the
            method is not unstructured, or the tensors lie on different devices.
        ValueError: ``parameters`` is empty, or ``amount`` is out of range.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> net = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.Linear(4, 1))
        >>> prune.global_unstructured(
        ...     [(net[0], "weight"), (net[1], "weight")], pruning_method=prune.L1Unstructured, amount=10
        ... )
        >>> int(sum(torch.nn.utils.parameters_to_vector(net.buffers()) == 0))
        10
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    with _hooks.gc_paused():
        _global_unstructured(parameters, pruning_method, importance_scores, kwargs)


def _global_unstructured(
    parameters: Any, pruning_method: Any, importance_scores: Any, kwargs: dict[str, Any]
) -> None:
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    parameters = list(parameters)  # torch iterates twice, which empties a generator
    if not parameters:
        # torch: ValueError from torch.cat of nothing.
        raise ValueError("global_unstructured(): expected at least one (module, name) pair, got none.")
    tensors = [getattr(module, name) for module, name in parameters]
    scores = tensors
    if importance_scores:
        scores = [importance_scores.get((m, n), t) for (m, n), t in zip(parameters, tensors, strict=True)]
    _check_same_device(scores)
    priors = [_hooks.mask_if_pruned(module, name) for module, name in parameters]

    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. Found method '
            f"{pruning_method} of type {method.PRUNING_TYPE}"
        )
    reads_values = type(method) in _FAST_L1 + _FAST_RANDOM
    for module, name in parameters:
        check_target(module, name, reads_values)
    distinct = len({(id(module), name) for module, name in parameters}) == len(parameters)
    # one tensor reached twice (tied weights): torch's generic path, which ranks it twice too
    distinct = distinct and len({id(t) for t in tensors}) == len(tensors)
    keeps: list[torch.Tensor | None]
    if type(method) in _FAST_L1 + _FAST_RANDOM and distinct:
        scores = _scores_as_parameters(scores, [t.shape for t in tensors], parameters)
        keeps = list(_global_core(method, scores, priors))
    else:
        keeps = list(_global_generic(method, scores, priors, parameters))
    with _hooks.transaction(module for module, _ in parameters):
        for i, (module, name) in enumerate(parameters):
            keep, keeps[i] = keeps[i], None  # each bool mask is freed once its buffer exists
            CustomFromMask.apply(module, name, mask=cast(torch.Tensor, keep))


def _check_same_device(tensors: Iterable[Any]) -> None:
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise _errors.DeviceMismatchError(
            f"global_unstructured(): found tensors on different devices ({sorted(map(str, devices))}); "
            f"expected all parameters (and importance scores) on one device, as torch requires."
        )


def _scores_as_parameters(
    scores: list[torch.Tensor], shapes: list[torch.Size], parameters: list[tuple[torch.nn.Module, str]]
) -> list[torch.Tensor]:
    """Scores of the parameters' shapes; torch reads them flat, so a same-size reshape is fine."""
    out = []
    for s, shape, (module, name) in zip(scores, shapes, parameters, strict=True):
        if s.shape != shape:
            if s.numel() != shape.numel():
                raise _errors.ImportanceScoresShapeError(
                    f"Expected importance_scores[(module, {name!r})] to have the shape of "
                    f"{type(module).__name__}.{name}, {tuple(shape)}, got {tuple(s.shape)}."
                )
            s = s.reshape(shape)
        out.append(s)
    return out


def _global_core(
    method: Any, scores: list[torch.Tensor], priors: list[torch.Tensor | None]
) -> list[torch.Tensor]:
    """``L1Unstructured`` / ``RandomUnstructured``: one call to the core, which streams.

    The core gets a dict keyed 0, 1, ...: int keys flatten in numeric order, the caller's (the
    tie-break), and a dict of masks may leave out the tensors not pruned yet.
    """
    candidates = [None if p is None else p == 1 for p in priors]  # torch ranks ``mask == 1``
    masks = {i: c for i, c in enumerate(candidates) if c is not None} or None
    random = type(method) in _FAST_RANDOM
    amount, ranked = method.amount, None
    sizes: list[int] = []
    if random or isinstance(amount, numbers.Integral):  # how many to draw; torch's count check
        sizes = [s.numel() if c is None else int(c.sum()) for s, c in zip(scores, candidates, strict=True)]
        amount = prune_count(amount, sum(sizes))
    if random and amount > 0:  # as torch: no draw when nothing is pruned
        ranked = _random_scores(scores, candidates, sizes)
    # A drop-in stays as silent as torch: the core's layer-collapse and NaN warnings would name
    # ``params[1]``, a key the caller never wrote. Silenced without warnings.catch_warnings, which
    # would reset Python's record of the warnings the program has already seen.
    quiet = _warn.suppressed(fprune.select.LayerCollapseWarning, fprune.select.NaNScoresWarning)
    with torch.no_grad(), quiet:
        keeps = fprune.global_unstructured(
            dict(enumerate(scores)), amount, importance_scores=ranked, masks=masks, signed=random
        )
    # The mask to multiply in: 0 where newly pruned, entries that were not candidates untouched.
    return [keeps[i] if c is None else keeps[i] | ~c for i, c in enumerate(candidates)]


def _random_scores(
    scores: list[torch.Tensor], candidates: list[torch.Tensor | None], sizes: list[int]
) -> dict[int, torch.Tensor]:
    """torch's draws (one ``rand`` over the unpruned entries of all tensors, in the promoted
    dtype), ranked as torch ranks them, on each tensor's candidates."""
    dtype = functools.reduce(torch.promote_types, [s.dtype for s in scores])
    draws = largest_first(torch.rand((sum(sizes),), dtype=dtype, device=scores[0].device))
    ranked = {}
    for i, (s, c, part) in enumerate(zip(scores, candidates, torch.split(draws, sizes), strict=True)):
        if c is None:
            ranked[i] = part.view(s.shape)
        else:
            ranked[i] = torch.zeros(s.shape, dtype=part.dtype, device=s.device)
            ranked[i][c] = part
    return ranked


def _global_generic(
    method: Any,
    scores: list[torch.Tensor],
    priors: list[torch.Tensor | None],
    parameters: list[tuple[torch.nn.Module, str]],
) -> list[torch.Tensor]:
    """torch's path: concatenate, let the container (and the method) compute, slice per tensor."""
    relevant = torch.nn.utils.parameters_to_vector(scores)
    default_mask = torch.nn.utils.parameters_to_vector(
        [
            p if p is not None else torch.ones_like(getattr(module, name))
            for p, (module, name) in zip(priors, parameters, strict=True)
        ]
    )
    container = PruningContainer()
    container._tensor_name = "temp"
    container.add_pruning_method(method)
    final_mask = container.compute_mask(relevant, default_mask)
    keeps, pointer = [], 0
    for module, name in parameters:
        param = getattr(module, name)
        keeps.append(final_mask[pointer : pointer + param.numel()].view_as(param))
        pointer += param.numel()
    return keeps
