"""What fprune.compat reads from a pruning method beyond torch's API."""

from __future__ import annotations

import weakref
from typing import Protocol, runtime_checkable

import torch


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
