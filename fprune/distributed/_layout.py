"""Private: DTensor leaves as the distributed selection sees them: local shards and where they sit.

A :class:`Leaf` is one DTensor on this rank: its local shard, the shard's offset in the full
tensor (from the global shape and the placements, :func:`fprune._torch.shard_layout`), the
global row-major positions of its entries, and whether this rank owns it (a ``Replicate()``
copy is counted on the first replica only). The checks here refuse what the selection cannot
run exactly: plain tensors mixed with DTensors, two meshes, placements other than ``Shard(d)``
and ``Replicate()``, scores or prior masks placed otherwise than the params.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import optree
import torch

from fprune import _torch, _tree

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def dtensor_module() -> Any:  # torch.distributed.tensor, or None
    # torch.distributed.tensor takes seconds to import: a DTensor can only exist once it is
    # imported, so its absence means there is no DTensor to look for. Importing a submodule sets
    # it as an attribute of its package: reading that attribute is what sys.modules would tell,
    # and torch.compile traces it as one constant (a lookup in sys.modules has it wrap the whole
    # dict of modules, thousands of entries, in every selection it traces).
    return getattr(torch.distributed, "tensor", None)


def holds_dtensor(*trees: Any) -> bool:
    """True when any leaf of ``trees`` (``None`` trees skipped) is a ``DTensor``."""
    module = dtensor_module()
    if module is None:
        return False
    return any(
        isinstance(leaf, module.DTensor)
        for tree in trees
        if tree is not None
        for leaf in optree.tree_leaves(tree)
    )


def any_dtensor(*leaf_lists: Sequence[Any]) -> bool:
    """True when any entry of the lists of leaves (``None`` entries skipped) is a ``DTensor``."""
    module = dtensor_module()
    if module is None:
        return False
    dtensor = module.DTensor
    return any(isinstance(t, dtensor) for leaves in leaf_lists for t in leaves)


def is_dtensor(t: Any) -> bool:
    module = dtensor_module()
    return module is not None and isinstance(t, module.DTensor)


class Leaf:
    """One DTensor leaf on this rank: its local shard and where that shard sits."""

    def __init__(
        self,
        index: int,
        param: Any,
        mesh: DeviceMesh,
        coordinate: Sequence[int],
        layouts: dict | None = None,
    ) -> None:
        module = dtensor_module()
        self.index = index
        self.placements = tuple(param.placements)
        self.shape = tuple(param.shape)
        self.local = param.to_local()
        # Leaves of one shape and placements share their layout (many-leaf models repeat them).
        layouts = {} if layouts is None else layouts
        layout = layouts.get((self.shape, self.placements))
        if layout is None:
            layout = layouts[(self.shape, self.placements)] = _torch.shard_layout(
                self.shape, tuple(mesh.shape), coordinate, self.placements
            )
        local_shape, offset = layout
        self.local_shape = tuple(local_shape)
        self.offset = tuple(offset)
        if tuple(self.local.shape) != self.local_shape:
            raise ValueError(
                f"The local shard of a DTensor leaf has shape {tuple(self.local.shape)}, expected "
                f"{self.local_shape} for global shape {self.shape} and placements "
                f"{self.placements}."
            )
        self.numel = math.prod(self.shape)
        self.local_numel = self.local.numel()
        # Count this shard only on the first replica along every Replicate() mesh dim.
        self.owned = all(
            coordinate[m] == 0 for m, p in enumerate(self.placements) if isinstance(p, module.Replicate)
        )
        self.contiguous_rows = all(s == n for s, n in zip(self.shape[1:], self.local_shape[1:], strict=True))

    def positions(self, start: int, stop: int) -> torch.Tensor:
        """Global row-major positions (in the full tensor) of local flat entries start:stop."""
        index = torch.arange(start, stop, dtype=torch.int64, device=self.local.device)
        if self.contiguous_rows:
            # The shard is whole rows: its entries are one contiguous range of the full tensor.
            first = self.offset[0] * (self.numel // self.shape[0]) if self.shape else 0
            return index + first
        position = torch.zeros_like(index)
        stride = 1
        for size, local_size, offset in reversed(
            list(zip(self.shape, self.local_shape, self.offset, strict=True))
        ):
            coordinate = index % local_size
            index = index // local_size
            position += (coordinate + offset) * stride
            stride *= size
        return position

    def dtensor(self, local: torch.Tensor, mesh: DeviceMesh) -> Any:
        module = dtensor_module()
        strides = torch.empty(self.shape, device="meta").stride()
        return module.DTensor.from_local(
            local, mesh, self.placements, run_check=False, shape=torch.Size(self.shape), stride=strides
        )


def check_leaves(flat: _tree.Flat, others: dict, mesh: DeviceMesh, argname: str = "params") -> None:
    """Every leaf a DTensor on ``mesh`` with Shard/Replicate placements, scores and masks alike."""
    module = dtensor_module()
    _StridedShard = _torch.strided_shard_type()

    def check_one(leaf: Any, where: str, placements: Any = None) -> Any:
        if not isinstance(leaf, module.DTensor):
            raise TypeError(
                f"Expected every leaf to be a DTensor when any is (plain tensors and DTensors "
                f"cannot be mixed), got a plain {type(leaf).__name__} at {where}; convert it with "
                f"torch.distributed.tensor.distribute_tensor or DTensor.from_local."
            )
        if leaf.device_mesh != mesh:
            raise ValueError(
                f"Expected every DTensor leaf on one device mesh ({mesh}), got {leaf.device_mesh} at {where}."
            )
        for p in leaf.placements:
            if isinstance(p, _StridedShard) or not isinstance(p, (module.Shard, module.Replicate)):
                raise ValueError(
                    f"Expected placements Shard(d) or Replicate() for {where}, got "
                    f"{tuple(leaf.placements)}; redistribute Partial leaves first "
                    f"(dtensor.redistribute(mesh, [Replicate()])). _StridedShard (FSDP2 over "
                    f"tensor parallelism) is not supported."
                )
        if placements is not None and tuple(leaf.placements) != placements:
            raise ValueError(
                f"Expected {where} to have the placements of the params, {placements}, got "
                f"{tuple(leaf.placements)}."
            )

    for path, leaf in zip(flat.paths, flat.leaves, strict=True):
        check_one(leaf, _tree.describe(argname, path))
    for argname, leaves in others.items():
        for path, leaf, param in zip(flat.paths, leaves, flat.leaves, strict=True):
            if leaf is not None:
                check_one(leaf, _tree.describe(argname, path), tuple(param.placements))


def first_mesh(*trees: Any) -> DeviceMesh:
    module = dtensor_module()
    for tree in trees:
        if tree is None:
            continue
        for leaf in optree.tree_leaves(tree):
            if isinstance(leaf, module.DTensor):
                return leaf.device_mesh
    raise AssertionError("no DTensor leaf")  # holds_dtensor was checked by the caller


def local(t: Any) -> torch.Tensor | None:
    """A DTensor's local shard (``None`` stays ``None``)."""
    return None if t is None else t.to_local()


def local_bool(t: Any) -> torch.Tensor | None:
    """A DTensor mask's local shard as bool (``None`` stays ``None``)."""
    return None if t is None else _tree.as_bool(t.to_local())


def _coordinates(mesh: DeviceMesh) -> list[tuple]:
    shape = tuple(mesh.shape)
    out: list[tuple] = [()]
    for size in shape:
        out = [c + (j,) for c in out for j in range(size)]
    return out


def shards_along(leaf: Leaf, mesh: DeviceMesh, d: int) -> list[tuple]:
    """``(offset, size)`` along dim ``d`` of every rank's shard of ``leaf`` (from the global shape)."""
    out = set()
    for coordinate in _coordinates(mesh):
        shape, offset = _torch.shard_layout(leaf.shape, tuple(mesh.shape), coordinate, leaf.placements)
        out.add((offset[d], shape[d]))
    return sorted(out)


def split_along(leaf: Leaf, d: int) -> bool:
    """True when some placement shards ``leaf`` along a dim other than ``d`` (then the slices
    along ``d``, its rows or channels, are split across ranks; else each rank holds them whole)."""
    module = dtensor_module()
    return any(isinstance(p, module.Shard) and p.dim % len(leaf.shape) != d for p in leaf.placements)


def sharded_dims(leaf: Leaf) -> set[int]:
    """The dims some placement shards ``leaf`` along (the same on every rank)."""
    module = dtensor_module()
    return {p.dim % len(leaf.shape) for p in leaf.placements if isinstance(p, module.Shard)}


def sharded(leaf: Leaf) -> bool:
    module = dtensor_module()
    return any(isinstance(p, module.Shard) for p in leaf.placements)


def other_positions(leaf: Leaf, d: int) -> torch.Tensor:
    """Row-major positions, in the full tensor with dim ``d`` removed, of the local entries of
    ``leaf.local.movedim(d, 0)[r]`` (the same for every local index ``r`` along ``d``)."""
    shape = [s for j, s in enumerate(leaf.shape) if j != d]
    local_shape = [s for j, s in enumerate(leaf.local_shape) if j != d]
    offset = [o for j, o in enumerate(leaf.offset) if j != d]
    device = leaf.local.device
    position = torch.zeros(local_shape, dtype=torch.int64, device=device)
    stride = 1
    for j in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[j] = local_shape[j]
        position += (torch.arange(local_shape[j], dtype=torch.int64, device=device) + offset[j]).view(
            view
        ) * stride
        stride *= shape[j]
    return position.reshape(-1)


def slices(leaf: Leaf) -> tuple:
    """The index of this rank's shard in the full tensor (a tuple of slices)."""
    return tuple(slice(o, o + n) for o, n in zip(leaf.offset, leaf.local_shape, strict=True))


def localize(leaf: Leaf, values: Any, mesh: Any, name: str) -> Any:
    """This rank's part of scores shaped like ``leaf``: a DTensor placed like the leaf gives its
    local shard, a ``Replicate()`` one (or a plain tensor of the full shape, made on every rank)
    its slice; ``name`` names the leaf in errors."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"Expected the scores of {name} to be a tensor, got {type(values).__name__}.")
    if tuple(values.shape) != leaf.shape:
        raise ValueError(
            f"Expected the scores of {name} to have its shape {leaf.shape}, got {tuple(values.shape)}."
        )
    if not is_dtensor(values):
        return values[slices(leaf)]
    scores: Any = values
    module = dtensor_module()
    if scores.device_mesh != mesh:
        raise ValueError(
            f"Expected the scores of {name} on the params' device mesh ({mesh}), got {scores.device_mesh}."
        )
    placements = tuple(scores.placements)
    if placements == leaf.placements:
        return scores.to_local()
    if all(isinstance(p, module.Replicate) for p in placements):
        return scores.to_local()[slices(leaf)]
    raise ValueError(
        f"Expected the scores of {name} placed like it, {leaf.placements} (or replicated), got "
        f"{placements}; redistribute them (scores.redistribute(mesh, {list(leaf.placements)}))."
    )
