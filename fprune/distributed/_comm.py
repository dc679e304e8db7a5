"""Private: the collectives of the distributed selection, what they cost, and the ranks' agreement.

Every collective of a sharded selection is an ``all_reduce`` over every rank of the DTensors'
mesh (:class:`Comm`: one per mesh dimension, which sums or maxes over the whole mesh); what a
call hands to them is counted in a :class:`Communication` and kept as the last call's
(:func:`last_communication`). Before anything else, the ranks compare hashes of what they were
called with (:func:`agree`), so that ranks called differently, or with invalid inputs on some
of them, all raise at once instead of waiting in different collectives.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass
class Communication:
    """What one distributed mask call handed to collectives on this rank."""

    collectives: int = 0
    bytes: int = 0
    passes: int = 0
    digit_bits: list[int] = field(default_factory=list)


_LAST = [Communication()]


def record(stats: Communication) -> None:
    """Keep ``stats`` as the last call's (see :func:`last_communication`)."""
    _LAST[0] = stats


def last_communication() -> Communication:
    """What the last mask call over DTensors handed to collectives on this rank.

    Returns:
        A :class:`Communication`: ``collectives`` (how many), ``bytes`` (their tensors' sizes,
        summed), ``passes`` (radix-select histogram passes) and ``digit_bits`` (the digit width
        of each select). Before any such call, all zeros.

    Example:
        >>> import fprune
        >>> stats = fprune.distributed.last_communication()
        >>> sorted(vars(stats))
        ['bytes', 'collectives', 'digit_bits', 'passes']
    """
    return _LAST[0]


class Comm:
    """All-reduces over every rank of a mesh (one collective per mesh dimension)."""

    def __init__(self, mesh: DeviceMesh, device: torch.device) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.groups = [mesh.get_group(d) for d in range(mesh.ndim)]
        self.device = device
        self.stats = Communication()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        reduce_op = {"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX}[op]
        for group in self.groups:
            self.dist.all_reduce(tensor, op=reduce_op, group=group)
            self.stats.collectives += 1
            self.stats.bytes += tensor.numel() * tensor.element_size()
        return tensor


def comm_of(mesh: DeviceMesh) -> Comm:
    """The collectives over ``mesh``, on its device type (cpu for gloo, the current cuda device
    for nccl)."""
    device = torch.device(mesh.device_type)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return Comm(mesh, device)


def _fingerprint(description: str) -> int:
    digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


def agree(comm: Comm, description: str, error: BaseException | None, what: str) -> None:
    """Raise on every rank unless every rank was called with the same inputs and all are valid.

    ``description`` says what this rank was called with (compared by hash: one ``all_reduce``
    of two int64, 16 bytes); ``error`` is this rank's own error in checking its inputs, raised
    here after the collective (the other ranks then raise "another rank rejected its inputs").
    ``what`` names the call in the messages.
    """
    code = -1 if error is not None else _fingerprint(description)
    both = torch.tensor([code, -code], dtype=torch.int64, device=comm.device)
    comm.all_reduce(both, "max")
    highest, lowest = int(both[0]), -int(both[1])
    if error is not None:
        raise error
    if lowest == -1:
        raise ValueError(
            f"{what}: another rank of the mesh rejected its inputs (see its error); this rank's "
            f"inputs were valid."
        )
    if highest != lowest:
        raise ValueError(
            f"{what}: the ranks of the mesh were called with different inputs (amount, scope, "
            f"tree structure, shapes, dtypes, placements, the leaves where= picks, or a "
            f"generator's state must agree on every rank). This rank: {description[:400]}"
        )
