"""The pruning-method classes of ``torch.nn.utils.prune``, with their masks computed by fprune's core.

Same names, constructors, ``PRUNING_TYPE``, ``compute_mask``/``apply``/``apply_mask``/
``prune``/``remove`` and class hierarchy as torch's (each class here derives from torch's
``BasePruningMethod``, so ``torch.nn.utils.prune`` recognizes these hooks and fprune.compat
recognizes torch's). What differs is underneath:

* The built-in methods select entries with fprune's count-exact selection
  (:func:`fprune.l1_unstructured`, :func:`fprune.ln_structured`, ...). Random methods draw
  from torch's global generator exactly as torch does (same calls, shapes and order) and hand
  the draws to the core as importance scores, so ``torch.manual_seed`` gives torch's masks.
* In a :class:`PruningContainer` the built-in methods rank the whole tensor with the prior mask
  (no ``t[mask == 1]`` copy); methods written by users (subclasses that define
  ``compute_mask``) run through torch's generic container code, unchanged.
* ``apply`` (``BasePruningMethod.apply``, here as in torch) is all-or-nothing, and hooks read
  the ``name + "_mask"`` buffer every time; the module bookkeeping is :mod:`fprune.compat._hooks`.
* What fprune.compat reads from a method beyond torch's API is written down in
  :class:`CompatMethod`.
"""

from __future__ import annotations

import numbers
import weakref
from typing import Any, Protocol, cast, runtime_checkable

import torch
import torch.nn.utils.prune as _torch_prune
from torch.nn.utils import parametrize

import fprune
from fprune import _amount, _warn
from fprune.compat import _errors, _hooks
from fprune.select import NaNScoresWarning, select
from fprune.select._inputs import check_dim

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
]

# ---------------------------------------------------------------------------------------------
# Argument checks, in torch's order and with torch's exception types


def _check_amount(amount: Any) -> None:
    """torch's ``_validate_pruning_amount_init``: the core's check, whose messages are torch's.

    Two cases differ from the core, as they do in torch: a tensor is refused (the core takes a
    floating-point one) and NaN passes here (counting raises ``ValueError`` later, at the point
    torch does, in torch's words for an amount out of range). Unlike torch, a bool is refused:
    torch takes it for an int and then fails in ``topk`` (``True``) or silently prunes nothing.
    """
    if isinstance(amount, torch.Tensor) or callable(amount):  # (the core takes count rules too)
        raise TypeError(f"Invalid type for amount: {amount!r}. Must be int or float.")
    if isinstance(amount, numbers.Real) and amount != amount:
        return  # NaN
    _amount.check_amount(amount)


def check_target(module: torch.nn.Module, name: str, reads_values: bool) -> None:
    """Refuse, before anything changes, a tensor compat cannot prune in place.

    A parametrized tensor (``torch.nn.utils.parametrize``) is computed, not a Parameter: torch
    fails deep inside with "cannot assign ... to parameter 'weight_orig'". A meta tensor has no
    values for the methods that rank them (``reads_values``).
    """
    if parametrize.is_parametrized(module, name):
        raise TypeError(
            f"{type(module).__name__}.{name} is computed by a parametrization "
            f"(torch.nn.utils.parametrize); expected a plain parameter: prune its original "
            f"instead, e.g. prune.l1_unstructured(module.parametrizations.{name}, 'original', "
            f"amount), or use the functional API on named_parameters() "
            f"('parametrizations.{name}.original')."
        )
    t = getattr(module, name, None)
    if reads_values and isinstance(t, torch.Tensor) and t.device.type == "meta":
        raise ValueError(
            f"Expected {type(module).__name__}.{name} to hold values, got a meta tensor (shape "
            f"{tuple(t.shape)}, no data): masks are computed from values. Load or initialize "
            f"the weights first (e.g. module.to_empty(device='cpu') and a state_dict)."
        )


def prune_count(amount: Any, size: int) -> int:
    """How many of ``size`` units to prune: the int itself, or torch's ``round(amount * size)``
    (:func:`fprune._amount.round_count`, fprune's one count rule)."""
    # No place named: the count error keeps torch's wording (see fprune._amount.count).
    if amount != amount:
        # torch: "cannot convert float NaN to integer"; the range check's words say more
        raise _amount.range_error(amount)
    return int(_amount.count(amount, size, "parameters"))


def _check_structured(t: torch.Tensor, dim: Any) -> int:
    """torch's structured checks: >= 2 dims (ValueError), ``dim`` in range (IndexError)."""
    return check_dim(dim, t, hint="prune 1-d tensors (biases) with an unstructured method.")


def _norm_order(n: Any) -> Any:
    """``n`` as the core takes it; ``torch.norm`` reads ``None`` as 2 and ``True`` as 1."""
    if n is None:
        return 2.0
    if isinstance(n, bool):
        return float(n)
    if isinstance(n, str) and n not in ("fro", "nuc"):
        raise _errors.InvalidNormError(
            f"Expected n to be a number, inf, -inf, 'fro' or 'nuc' (torch.norm's p), got {n!r}."
        )
    return n


def _channel_liveness(prior: torch.Tensor, dim: int) -> torch.Tensor:
    others = [d for d in range(prior.dim()) if d != dim]
    return prior.any(dim=others)


def largest_first(draws: torch.Tensor) -> torch.Tensor:
    """torch prunes the largest draws: ``-draws`` (in place; exact, so no new ties) ranked by value."""
    return draws.neg_()


# ---------------------------------------------------------------------------------------------
# The hook protocol


@runtime_checkable
class CompatMethod(Protocol):
    """What fprune.compat reads from a pruning method beyond torch's API (``compute_mask``, ...).

    :class:`BasePruningMethod` holds the defaults. torch's own methods lack the protocol and are
    treated as the defaults say: not core-backed, a full mask of ones, nothing to release.

    Attributes:
        _tensor_name: the tensor the method prunes, set by ``apply`` (torch's attribute).
        _module_ref: a weak reference to the module ``apply`` installed the hook on, or None;
            ``copy.deepcopy`` of the module uses it. Never pickled or deep-copied.
        _core_backed: True when fprune's core selects the mask through :meth:`_select` (the
            built-in methods); False for a ``compute_mask`` a user wrote (subclasses of the
            built-ins included), which runs as torch runs it.
    """

    _tensor_name: str
    _module_ref: weakref.ref[torch.nn.Module] | None

    @property
    def _core_backed(self) -> bool: ...

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        """The entries of ``t`` kept (bool, or broadcastable to ``t``) after pruning ``prior``'s.

        ``prior`` (bool, None for all) holds the candidates: the entries still unpruned (for
        structured methods, the channels with any entry unpruned), as torch's container slices
        them; outside it the result may say anything, callers keep their old mask there.
        None means "nothing pruned" (and, as in torch, nothing drawn).
        """

    def _first_mask(self, orig: torch.Tensor) -> torch.Tensor:
        """``default_mask`` for the first pruning of ``orig``: ones of its shape and dtype (a
        broadcast view where ``compute_mask`` never writes into it)."""

    def _after_apply(self) -> None:
        """Called once ``apply`` has succeeded (``CustomFromMask`` drops its mask here)."""


# ---------------------------------------------------------------------------------------------
# Base classes


class BasePruningMethod(_torch_prune.BasePruningMethod):
    """Abstract base class of pruning methods, as ``torch.nn.utils.prune.BasePruningMethod``.

    Subclass it, set ``PRUNING_TYPE`` (``"unstructured"``, ``"structured"`` or ``"global"``)
    and write ``compute_mask(t, default_mask)``; ``apply``, ``apply_mask``, ``prune`` and
    ``remove`` come from here. Instances are also ``torch.nn.utils.prune.BasePruningMethod``
    instances, so both libraries see each other's hooks.

    Differences from torch: ``apply`` leaves the module as it was if anything fails, the hook
    reads the ``name + "_mask"`` buffer each time (it keeps no mask of its own), and the
    ``name`` attribute it computes survives ``copy.deepcopy`` and ``pickle``.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> class EveryOther(prune.BasePruningMethod):
        ...     PRUNING_TYPE = "unstructured"
        ...     def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        ...         mask = default_mask.clone()
        ...         mask.view(-1)[::2] = 0
        ...         return mask
        >>> layer = torch.nn.Linear(2, 4)
        >>> _ = EveryOther.apply(layer, "bias")
        >>> layer.bias_mask
        tensor([0., 1., 0., 1.])
    """

    _tensor_name: str
    _module_ref: weakref.ref[torch.nn.Module] | None = None

    # The defaults of the CompatMethod protocol.

    @property
    def _core_backed(self) -> bool:
        return type(self).compute_mask in _CORE_COMPUTE_MASKS

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        raise NotImplementedError(f"{type(self).__name__} is not core-backed.")

    def _first_mask(self, orig: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(orig)

    def _after_apply(self) -> None:
        pass

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return _hooks.copy_hook(self, memo)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_module_ref", None)  # a weak reference to the module: not picklable
        return state

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        """The forward pre-hook: recompute ``module.<name>`` from ``_orig`` and ``_mask``."""
        setattr(module, self._tensor_name, self.apply_mask(module))

    def apply_mask(self, module: torch.nn.Module) -> torch.Tensor:
        """The pruned tensor ``module.<name>_mask * module.<name>_orig`` (read from the module).

        Args:
            module (nn.Module): the module holding the tensor this method prunes.

        Returns:
            The pruned tensor; ``copy.deepcopy`` and ``pickle`` recompute it from the copies of
            ``_orig`` and ``_mask``.
        """
        return _hooks.pruned_tensor(module, self._name_in(module))

    @classmethod
    def apply(
        cls,
        module: torch.nn.Module,
        name: str,
        *args: Any,
        importance_scores: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)`` and re-parametrize it.

        Moves the parameter to ``name + "_orig"`` (the same Parameter object), registers the
        mask as the buffer ``name + "_mask"``, sets ``module.<name>`` to the pruned tensor and
        registers the method as a forward pre-hook. If ``name`` was pruned before, the methods
        are combined in a :class:`PruningContainer` and the new one acts on what remains.

        Args:
            module (nn.Module): module containing the tensor to prune.
            name (str): parameter name within ``module``.
            args: passed on to the constructor of ``cls``.
            importance_scores (torch.Tensor): scores of the shape of the parameter used instead
                of it to compute the mask.
            kwargs: passed on to the constructor of ``cls``.

        Returns:
            The method installed as the hook (a :class:`PruningContainer` on repeated pruning).

        Raises:
            ImportanceScoresShapeError (an ``AssertionError`` and ``ValueError``): scores of the
                wrong shape. Whatever the method raises. The module is unchanged afterwards.
        """
        # torch's steps in torch's order (the same mistake raises the same exception), but on
        # any exception the module is restored.
        found = _hooks.existing_hook(module, name)
        method = cls(*args, **kwargs)
        method._tensor_name = name
        check_target(module, name, method._core_backed and not isinstance(method, (Identity, CustomFromMask)))
        with _hooks.transaction([module]):
            old = None
            if found is not None:
                key, old = found
                del module._forward_pre_hooks[key]
            hook = method if old is None else _joined(old, method, name)
            orig = getattr(module, name)
            _check_scores(importance_scores, orig, name, module)
            if old is None:
                _hooks.reparametrize(module, name, orig)
                default_mask = method._first_mask(orig)
            else:
                default_mask = (
                    getattr(module, name + _hooks.MASK).detach().clone(memory_format=torch.contiguous_format)
                )
            scores = orig if importance_scores is None else importance_scores
            mask = hook.compute_mask(scores, default_mask=default_mask)
            if method._core_backed and isinstance(mask, torch.Tensor):
                # fprune's own methods: the buffer is always in the parameter's dtype.
                mask = mask.to(dtype=_hooks.orig_of(module, name).dtype)
            if isinstance(old, PruningContainer):
                # Keep the hook object, as torch does.
                old._pruning_methods = cast(PruningContainer, hook)._pruning_methods
                hook = old
            _hooks.set_mask(module, name, mask, hook)
        method._after_apply()
        return hook

    def prune(
        self,
        t: torch.Tensor,
        default_mask: torch.Tensor | None = None,
        importance_scores: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``t`` times the mask :meth:`compute_mask` computes for it (torch's contract)."""
        if importance_scores is not None and importance_scores.shape != t.shape:
            raise _errors.ImportanceScoresShapeError(
                f"Expected importance_scores to have the shape of t, {tuple(t.shape)}, got "
                f"{tuple(importance_scores.shape)}."
            )
        return super().prune(t, default_mask=default_mask, importance_scores=importance_scores)

    def remove(self, module: torch.nn.Module) -> None:
        """Make the pruning permanent: ``name`` is the pruned ``_orig`` Parameter again.

        The Parameter object is kept (an optimizer holding it goes on training it); the
        ``_orig`` parameter and ``_mask`` buffer are removed. The hook itself is removed by the
        module-level :func:`fprune.compat.remove`.
        """
        _hooks.make_permanent(module, self._name_in(module))

    def _name_in(self, module: torch.nn.Module) -> str:
        name = getattr(self, "_tensor_name", None)
        if name is None:
            raise _errors.NotPrunedError(
                f"This {type(self).__name__} has not been applied to a tensor yet (its "
                f"_tensor_name is unset); prune module {type(module).__name__} with it first."
            )
        return name


def _check_scores(importance_scores: Any, orig: Any, name: str, module: torch.nn.Module) -> None:
    if importance_scores is None:
        return
    shape = getattr(importance_scores, "shape", None)
    if shape != getattr(orig, "shape", None):
        raise _errors.ImportanceScoresShapeError(
            f"Expected importance_scores to have the shape of parameter {name!r} of "
            f"{type(module).__name__}, {tuple(orig.shape) if orig is not None else None}, got "
            f"{tuple(shape) if shape is not None else type(importance_scores).__name__}."
        )


def _joined(
    old: _torch_prune.BasePruningMethod, method: _torch_prune.BasePruningMethod, name: str
) -> PruningContainer:
    """A new container: the methods of ``old`` (one method, or a container), then ``method``."""
    container = PruningContainer()
    container._tensor_name = name
    if isinstance(old, _torch_prune.PruningContainer):
        container._pruning_methods = tuple(old._pruning_methods)
    else:
        container.add_pruning_method(old)
    container.add_pruning_method(method)
    return container


def _combine_with_core(method: Any, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
    """A container's new mask for a built-in ``method``: ranked by the core over the whole ``t``.

    torch slices ``t[mask == 1]`` (or the live channels) and ranks the slice; ranking the whole
    tensor with the prior mask selects the same entries without the copy. Entries that were
    candidates and are now pruned become 0; every other entry keeps its old mask value.
    """
    if method.PRUNING_TYPE == "structured":
        prior = default_mask != 0  # torch: a channel lives while its mask sums to non-zero
    else:
        prior = default_mask == 1
    keep = method._select(t, prior)
    new_mask = default_mask.to(dtype=t.dtype, copy=True)
    if keep is not None:
        new_mask.masked_fill_(prior & ~keep, 0)
    return new_mask


class PruningContainer(_torch_prune.PruningContainer, BasePruningMethod):
    """Container holding the sequence of pruning methods applied to one tensor (iterative pruning).

    As ``torch.nn.utils.prune.PruningContainer`` (which it subclasses): ``compute_mask`` applies
    the latest method to what earlier ones left. For fprune's built-in methods the core ranks
    the whole tensor with the prior mask; other methods get torch's slice of remaining entries
    or channels. Unlike torch, several methods can be given at once (torch fails to set the
    container's ``_tensor_name`` then).

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> layer = torch.nn.Linear(4, 3)
        >>> _ = prune.l1_unstructured(layer, "weight", amount=3)
        >>> _ = prune.ln_structured(layer, "weight", amount=1, n=2, dim=0)
        >>> hook = next(iter(layer._forward_pre_hooks.values()))
        >>> [type(m).__name__ for m in hook]
        ['L1Unstructured', 'LnStructured']
    """

    def __init__(self, *args: Any) -> None:
        if len(args) > 1 and isinstance(args[0], _torch_prune.BasePruningMethod):
            # None until the method is applied, as torch leaves it (read through _name_in).
            self._tensor_name = getattr(args[0], "_tensor_name", None)  # type: ignore[assignment]
        super().__init__(*args)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """The mask after the latest method acts on the part of ``t`` that ``default_mask`` keeps.

        Args:
            t (torch.Tensor): the scores of the tensor to prune.
            default_mask (torch.Tensor): the mask of the earlier methods, same shape as ``t``.

        Returns:
            The combined mask, in ``t``'s dtype as torch returns it.
        """
        method = self._pruning_methods[-1]
        if isinstance(method, BasePruningMethod) and method._core_backed:
            return _combine_with_core(method, t, default_mask)
        return super().compute_mask(t, default_mask)


# ---------------------------------------------------------------------------------------------
# Built-in methods


def _unstructured_mask(keep: torch.Tensor | None, default_mask: torch.Tensor) -> torch.Tensor:
    # torch: mask = default_mask.clone(); mask.view(-1)[pruned] = 0
    mask = default_mask.clone(memory_format=torch.contiguous_format)
    if keep is not None:
        mask.view(-1).masked_fill_(~keep.reshape(-1), 0)
    return mask


def _structured_mask(keep: torch.Tensor | None, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
    # torch: mask = zeros_like(t); mask[kept channels] = 1; mask *= default_mask (or default_mask if k == 0)
    if keep is None:
        return default_mask
    mask = torch.zeros_like(t)
    mask.masked_fill_(keep, 1)
    mask *= default_mask.to(dtype=mask.dtype)
    return mask


class Identity(BasePruningMethod):
    """Prunes nothing, but installs the re-parametrization (a mask of ones).

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> prune.Identity.apply(torch.nn.Linear(2, 3), "bias").compute_mask(None, torch.ones(3))
        tensor([1., 1., 1.])
    """

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Returns ``default_mask`` itself."""
        return default_mask

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        return None

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str) -> Any:  # type: ignore[override]
        """Add the pruning re-parametrization of ``module.<name>`` without pruning anything."""
        return super().apply(module, name)


class RandomUnstructured(BasePruningMethod):
    """Prune ``amount`` of the (currently unpruned) entries at random.

    Draws from torch's global generator exactly as ``torch.nn.utils.prune`` does (one
    ``rand_like`` over the entries still unpruned, none when nothing is pruned), so the same
    ``torch.manual_seed`` gives the same mask; the draws are ranked by fprune's selection.

    Args:
        amount (int or float): how many entries to prune (int), or the fraction of the entries
            still unpruned (float in [0, 1]).

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> mask = prune.RandomUnstructured(amount=2).compute_mask(torch.randn(5), torch.ones(5))
        >>> int((mask == 0).sum())
        2
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Any) -> None:
        _check_amount(amount)
        self.amount = amount

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """``default_mask`` with ``amount`` random entries of ``t`` (ranked among all) set to 0."""
        return _unstructured_mask(self._select(t, None), default_mask)

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        size = t.numel() if prior is None else int(prior.sum())
        count = prune_count(self.amount, size)
        if count == 0:
            return None
        with torch.no_grad():
            if prior is None:
                scores = largest_first(torch.rand_like(t))
            else:
                draws = torch.rand((size,), dtype=t.dtype, device=t.device)  # = rand_like(t[prior])
                scores = torch.zeros(t.shape, dtype=t.dtype, device=t.device)
                scores[prior] = largest_first(draws)
            return select(scores, count, rank="value", masks=prior)

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, amount: Any) -> Any:  # type: ignore[override]
        """Prune ``amount`` random (currently unpruned) entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(BasePruningMethod):
    """Prune the ``amount`` (currently unpruned) entries of lowest magnitude.

    Args:
        amount (int or float): how many entries to prune (int), or the fraction of the entries
            still unpruned (float in [0, 1]).

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> prune.L1Unstructured(amount=2).compute_mask(torch.tensor([3.0, -1.0, 0.5, 2.0]), torch.ones(4))
        tensor([1., 0., 0., 1.])
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Any) -> None:
        _check_amount(amount)
        self.amount = amount

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """``default_mask`` with the ``amount`` entries of lowest ``|t|`` (among all) set to 0."""
        return _unstructured_mask(self._select(t, None), default_mask)

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        count = prune_count(self.amount, t.numel() if prior is None else int(prior.sum()))
        if count == 0:
            return None
        with torch.no_grad(), _warn.suppressed(NaNScoresWarning):  # as silent as torch
            return fprune.l1_unstructured(t, count, masks=prior)

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: torch.nn.Module, name: str, amount: Any, importance_scores: torch.Tensor | None = None
    ) -> Any:
        """Prune the ``amount`` lowest-magnitude entries of ``module.<name>`` (or of the scores)."""
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class RandomStructured(BasePruningMethod):
    """Prune ``amount`` of the (currently unpruned) channels along ``dim`` at random.

    Draws ``torch.rand(channels)`` from the global generator as torch does.

    Args:
        amount (int or float): how many channels to prune (int), or the fraction of the
            channels still unpruned (float in [0, 1]).
        dim (int, optional): the dim along which channels are defined. Default: -1.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> mask = prune.RandomStructured(amount=1, dim=0).compute_mask(torch.randn(3, 2), torch.ones(3, 2))
        >>> mask.sum(dim=1).tolist().count(0.0)
        1
    """

    PRUNING_TYPE = "structured"

    def __init__(self, amount: Any, dim: int = -1) -> None:
        _check_amount(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Zero ``amount`` random channels of ``t`` (among all) on top of ``default_mask``."""
        return _structured_mask(self._select(t, None), t, default_mask)

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        dim = _check_structured(t, self.dim)
        alive = None if prior is None else _channel_liveness(prior, dim)
        channels = t.shape[dim]
        size = channels if alive is None else int(alive.sum())
        count = prune_count(self.amount, size)
        if count == 0:
            return None
        draws = torch.rand(size)  # torch's call: default dtype, CPU generator, live channels only
        if alive is not None:
            alive = alive.cpu()
            scores = torch.zeros(channels, dtype=draws.dtype)
            scores[alive] = draws
            draws = scores
        # One score per channel; the lowest draws are pruned, as torch's ``prob > kthvalue(prob, k)``.
        keep = select(draws, count, rank="value", masks=alive)
        shape = [1] * t.dim()
        shape[dim] = channels
        return keep.to(t.device).view(shape)  # broadcasts over the channel's entries

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, amount: Any, dim: int = -1) -> Any:  # type: ignore[override]
        """Prune ``amount`` random (currently unpruned) channels of ``module.<name>`` along ``dim``."""
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(BasePruningMethod):
    r"""Prune the ``amount`` (currently unpruned) channels along ``dim`` of lowest L\ ``n`` norm.

    Args:
        amount (int or float): how many channels to prune (int), or the fraction of the
            channels still unpruned (float in [0, 1]).
        n (int, float, inf, -inf, 'fro', 'nuc'): the norm's order, as ``p`` of ``torch.norm``.
        dim (int, optional): the dim along which channels are defined. Default: -1.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> w = torch.tensor([[1.0, 1.0], [0.1, 0.1], [2.0, 0.0]])
        >>> prune.LnStructured(amount=1, n=2, dim=0).compute_mask(w, torch.ones(3, 2))
        tensor([[1., 1.],
                [0., 0.],
                [1., 1.]])
    """

    PRUNING_TYPE = "structured"

    def __init__(self, amount: Any, n: Any, dim: int = -1) -> None:
        _check_amount(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Zero the ``amount`` channels of ``t`` of lowest norm (among all) on ``default_mask``."""
        return _structured_mask(self._select(t, None), t, default_mask)

    def _select(self, t: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor | None:
        dim = _check_structured(t, self.dim)
        size = t.shape[dim] if prior is None else int(_channel_liveness(prior, dim).sum())
        count = prune_count(self.amount, size)
        n = _norm_order(self.n)
        with torch.no_grad(), _warn.suppressed(NaNScoresWarning):  # as silent as torch
            # importance_scores=t: channel norms of t itself, as torch ranks them.
            keep = fprune.ln_structured(t, count, n, dim, importance_scores=t, masks=prior)
        return None if count == 0 else keep

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: Any,
        n: Any,
        dim: int,
        importance_scores: torch.Tensor | None = None,
    ) -> Any:
        """Prune the ``amount`` lowest-norm (currently unpruned) channels of ``module.<name>``."""
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod):
    """Prune with a given mask (multiplied into the current one).

    Unlike torch's, the method drops its ``mask`` once ``apply`` has stored it in the
    ``name + "_mask"`` buffer (``self.mask`` is then None), so hooks hold no copy of it
    (pytorch#34257); the buffer is the one source of truth.

    Args:
        mask (torch.Tensor): the mask (0/1 or bool), of the shape of the tensor to prune.

    Example:
        >>> import torch
        >>> from fprune import compat as prune
        >>> prune.CustomFromMask(torch.tensor([0, 1, 1])).compute_mask(None, torch.ones(3))
        tensor([0., 1., 1.])
    """

    PRUNING_TYPE = "global"

    def __init__(self, mask: torch.Tensor | None) -> None:
        self.mask = mask

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """``default_mask * mask`` in ``default_mask``'s dtype."""
        if self.mask is None:
            raise RuntimeError(
                "This CustomFromMask has been applied and no longer holds its mask (the module's "
                "name_mask buffer does); create a new CustomFromMask to compute a mask again."
            )
        if default_mask.shape != self.mask.shape:
            raise _errors.MaskShapeError(
                f"Expected mask to have the shape of the tensor it prunes, "
                f"{tuple(default_mask.shape)}, got {tuple(self.mask.shape)}."
            )
        mask = self.mask.to(dtype=default_mask.dtype, device=default_mask.device)
        if mask is self.mask:
            return default_mask * mask
        return mask.mul_(default_mask)  # mask is our own copy: multiply in place, one allocation

    def _first_mask(self, orig: torch.Tensor) -> torch.Tensor:
        # compute_mask never writes into default_mask: for large tensors a broadcast view of
        # one 1 has the same values and no full-size allocation (global_unstructured applies
        # one per tensor); for small ones a plain allocation is faster than the view.
        if orig.numel() < _BROADCAST_ONES_FROM or type(orig) not in (torch.Tensor, torch.nn.Parameter):
            return torch.ones_like(orig)  # (a tensor subclass needs ones of its own kind, not a view)
        return torch.ones((), dtype=orig.dtype, device=orig.device).expand_as(orig)

    def _after_apply(self) -> None:
        self.mask = None

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, mask: torch.Tensor) -> Any:  # type: ignore[override]
        """Prune ``module.<name>`` with ``mask``."""
        return super().apply(module, name, mask=mask)


_BROADCAST_ONES_FROM = 1 << 16  # entries

_CORE_COMPUTE_MASKS = frozenset(
    cls.compute_mask for cls in (Identity, RandomUnstructured, L1Unstructured, RandomStructured, LnStructured)
)
