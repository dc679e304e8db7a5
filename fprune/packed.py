"""An opt-in bit-packed mask format: 1 bit per entry instead of ``torch.bool``'s 1 byte.

Masks stay ``torch.bool`` everywhere in fprune; packing is for keeping or shipping many masks
(say one per step of iterative pruning, or per member of an ensemble) in an eighth of the memory.
:func:`fprune.apply_masks` and :func:`fprune.masked_call` accept packed masks as they are.

What works (``tests/apply/test_apply_packed.py`` checks each):

* eager code, ``torch.compile(fullgraph=True)`` (packing and unpacking trace), ``torch.func.grad``
  through ``apply_masks``/``masked_call`` with packed masks (zero gradient at pruned entries), and
  ``vmap`` with packed masks *closed over* (the same masks for every member);
* not ``vmap`` *over* packed masks (as an input with ``in_dims``, or returned from the vmapped
  function): a :class:`PackedMask` is a plain object to torch's pytrees, and ``vmap`` rejects it.
  Keep per-member masks as ``torch.bool`` inside ``vmap``, and pack them outside it;
* saving: ``torch.save(pack_masks(masks), path)`` then a plain ``torch.load(path)`` (the
  default ``weights_only=True``) gives the packed masks back: importing fprune declares
  :class:`PackedMask` safe to load (``torch.serialization.add_safe_globals``; it holds a uint8
  tensor and a ``torch.Size``, nothing that runs code). :func:`to_state` / :func:`from_state`
  give the same as plain tensors, tuples and dicts, for a reader without fprune.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optree
import torch

from fprune import _torch, _tree

__all__ = ["PackedMask", "pack_masks", "unpack_masks", "to_state", "from_state"]


@dataclass(frozen=True)
class PackedMask:
    """One mask packed 8 entries to a byte: entry ``i`` (flat, row-major) is bit ``i % 8``
    (least significant first) of byte ``i // 8``; ``True`` (kept) is a set bit.

    It is a leaf of a pytree (not a node), so a tree of them has the mask tree's structure.
    """

    bits: torch.Tensor  # uint8, ceil(numel / 8) entries
    shape: torch.Size

    @property
    def numel(self) -> int:
        return self.shape.numel()


# torch.load(weights_only=True) rebuilds PackedMask objects (a uint8 tensor and a torch.Size).
_torch.allow_loading(PackedMask)


def _weights(device: torch.device) -> torch.Tensor:
    # Made on the device (no host-to-device copy): 1 << [0, 1, ..., 7].
    return torch.ones(8, dtype=torch.uint8, device=device) << torch.arange(
        8, dtype=torch.uint8, device=device
    )


def _pack(mask: torch.Tensor) -> PackedMask:
    flat = _tree.as_bool(mask).reshape(-1)
    padding = (-flat.numel()) % 8
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding)])
    bits = (flat.view(-1, 8).to(torch.uint8) * _weights(flat.device)).sum(dim=1, dtype=torch.uint8)
    return PackedMask(bits, mask.shape)


def _unpack(packed: PackedMask) -> torch.Tensor:
    expected = (packed.numel + 7) // 8
    if packed.bits.dim() != 1 or packed.bits.numel() != expected or packed.bits.dtype != torch.uint8:
        raise ValueError(
            f"Expected a PackedMask of shape {tuple(packed.shape)} to hold {expected} uint8 bytes "
            f"(1-d), got bits of shape {tuple(packed.bits.shape)} and dtype {packed.bits.dtype}."
        )
    bits = packed.bits.unsqueeze(1).bitwise_and(_weights(packed.bits.device)) != 0
    return bits.reshape(-1)[: packed.numel].view(packed.shape)


def pack_masks(masks: Any) -> Any:
    """The masks with every leaf packed to 1 bit per entry (a :class:`PackedMask`).

    Args:
        masks: a pytree of ``torch.bool`` masks (``True`` = kept), or 0/1 masks of any dtype.

    Returns:
        A pytree of the same structure holding :class:`PackedMask` leaves.

    Raises:
        TypeError: a leaf is not a tensor.

    Example:
        >>> import torch
        >>> from fprune.packed import pack_masks, unpack_masks
        >>> masks = {"w": torch.tensor([[True, False, True], [False, True, True]])}
        >>> packed = pack_masks(masks)
        >>> packed["w"].bits, packed["w"].shape
        (tensor([53], dtype=torch.uint8), torch.Size([2, 3]))
        >>> torch.equal(unpack_masks(packed)["w"], masks["w"])
        True
    """
    flat = _tree.flatten(masks, "masks")
    return _tree.unflatten(flat, [_pack(leaf) for leaf in flat.leaves])


def unpack_masks(packed: Any) -> Any:
    """The ``torch.bool`` masks of a tree that holds :class:`PackedMask` leaves.

    Leaves that are tensors already (masks that were never packed) come back as they are.

    Args:
        packed: a pytree whose leaves are :class:`PackedMask` or tensors.

    Returns:
        A pytree of the same structure holding tensors: ``torch.bool`` masks where it held
        packed ones.

    Example:
        >>> import io, torch
        >>> from fprune.packed import pack_masks, unpack_masks
        >>> packed = pack_masks({"b": torch.ones(10, dtype=torch.bool)})
        >>> unpack_masks(packed)["b"].all().item(), packed["b"].bits.numel()
        (True, 2)
        >>> buffer = io.BytesIO()
        >>> torch.save(packed, buffer)
        >>> _ = buffer.seek(0)
        >>> torch.equal(unpack_masks(torch.load(buffer))["b"], unpack_masks(packed)["b"])  # weights_only=True
        True
    """
    return optree.tree_map(
        lambda leaf: _unpack(leaf) if isinstance(leaf, PackedMask) else leaf,
        packed,
        is_leaf=lambda leaf: isinstance(leaf, PackedMask),
    )


def holds_packed(tree: Any) -> bool:
    """True when a leaf of ``tree`` is a :class:`PackedMask`."""
    leaves = optree.tree_leaves(tree, is_leaf=lambda leaf: isinstance(leaf, PackedMask))
    return any(isinstance(leaf, PackedMask) for leaf in leaves)


def _is_state(leaf: Any) -> bool:
    return isinstance(leaf, dict) and set(leaf) == {"bits", "shape"}


def to_state(packed: Any) -> Any:
    """The tree with every :class:`PackedMask` as ``{"bits": uint8 tensor, "shape": tuple of ints}``.

    Only tensors, dicts and tuples, for a reader without fprune (with fprune imported,
    ``torch.load`` reads saved :class:`PackedMask` objects as they are). Leaves that are not
    packed (tensors) stay as they are.

    Example:
        >>> import io, torch
        >>> from fprune.packed import pack_masks, to_state, from_state, unpack_masks
        >>> masks = {"w": torch.tensor([[True, False, True], [False, True, True]])}
        >>> buffer = io.BytesIO()
        >>> torch.save(to_state(pack_masks(masks)), buffer)
        >>> _ = buffer.seek(0)
        >>> loaded = from_state(torch.load(buffer))     # weights_only=True, the default
        >>> torch.equal(unpack_masks(loaded)["w"], masks["w"])
        True
    """
    return optree.tree_map(
        lambda leaf: (
            {"bits": leaf.bits, "shape": tuple(int(s) for s in leaf.shape)}
            if isinstance(leaf, PackedMask)
            else leaf
        ),
        packed,
        is_leaf=lambda leaf: isinstance(leaf, PackedMask),
    )


def from_state(state: Any) -> Any:
    """The packed masks back from :func:`to_state`'s tree (every ``{"bits", "shape"}`` dict).

    Raises:
        ValueError: a ``bits`` tensor whose size does not fit its ``shape``.

    Example:
        >>> import torch
        >>> from fprune.packed import from_state
        >>> packed = from_state({"w": {"bits": torch.tensor([5], dtype=torch.uint8), "shape": (3,)}})
        >>> packed["w"].shape, unpack_masks(packed)["w"]
        (torch.Size([3]), tensor([ True, False,  True]))
    """

    def rebuild(leaf: Any) -> Any:
        if not _is_state(leaf):
            return leaf
        packed = PackedMask(leaf["bits"], torch.Size(leaf["shape"]))
        if packed.bits.numel() != (packed.numel + 7) // 8:
            raise ValueError(
                f"Expected bits of {(packed.numel + 7) // 8} bytes for shape {tuple(packed.shape)}, "
                f"got {packed.bits.numel()}."
            )
        return packed

    return optree.tree_map(rebuild, state, is_leaf=_is_state)
