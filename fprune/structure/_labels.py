"""The values the channel analysis propagates: label tensors of atom ids, and parameter references.

A *label* is an int64 tensor shaped like a node's value: each element holds the id of the channel
atom it comes from, or -1 when it carries no channel. A parameter (or buffer) read by the graph is
a :class:`ParamRef` until an op uses it as a plain tensor; then it becomes a label (see
``Propagation.label``).
"""

from __future__ import annotations

from typing import Any, overload

import torch

__all__ = ["ParamRef", "compress", "concrete", "varies"]


class ParamRef:
    """A parameter (or buffer) seen through ``perm``: axis ``i`` of this value is dim ``perm[i]``."""

    __slots__ = ("name", "perm", "shape")

    def __init__(self, name: str, perm: tuple[int, ...], shape: tuple[int, ...]):
        self.name, self.perm, self.shape = name, perm, shape


def _hint(x: Any) -> Any:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = x.node.hint
        if hint is None:
            raise ValueError(
                f"fprune.structure cannot analyse data-dependent sizes ({x} has no example "
                f"value); channel groups need every channel count known."
            )
        return hint
    return x


def concrete(val: Any) -> Any:
    """Example values with symbolic sizes replaced by their example sizes (meta tensors)."""
    if isinstance(val, torch.Tensor):
        return torch.empty(tuple(int(_hint(s)) for s in val.shape), dtype=val.dtype, device="meta")
    if isinstance(val, (list, tuple)):
        return type(val)(concrete(v) for v in val)
    return _hint(val)


def varies(x: torch.Tensor, dim: int) -> bool:
    """True when the atoms of ``x`` are not all the same along ``dim`` (ignoring no-atom -1s)."""
    if x.dim() == 0 or x.shape[dim] <= 1:
        return False
    hi = x.amax(dim=dim, keepdim=True)
    lo = torch.where(x >= 0, x, hi).amin(dim=dim, keepdim=True)
    return bool(((hi != lo) & (hi >= 0)).any())


@overload
def compress(label: torch.Tensor, /) -> torch.Tensor: ...
@overload
def compress(*labels: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor: ...
def compress(*labels: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
    """``labels`` (of one shape) cut to one index along every dim on which all are constant.

    Labels repeat a channel along batch, space and sequence; what an op learns from them (pairs
    of atoms to merge, distinct atoms) is the same on one index of those dims.
    """
    for d in range(labels[0].dim()):
        if labels[0].shape[d] > 1 and all(
            x.stride(d) == 0 or bool((x == x.narrow(d, 0, 1)).all()) for x in labels
        ):
            labels = tuple(x.narrow(d, 0, 1) for x in labels)
    return labels if len(labels) > 1 else labels[0]
