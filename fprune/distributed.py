"""Pruning sharded models: ``DTensor`` parameters (FSDP2, tensor parallelism) on ``torch.distributed``.

There is nothing new to call: :func:`fprune.global_unstructured`, :func:`fprune.l1_unstructured`,
:func:`fprune.ln_structured`, :func:`fprune.random_unstructured`, :func:`fprune.n_m`,
:func:`fprune.rowwise_unstructured` and :func:`fprune.random_structured` accept params (and
``importance_scores``, prior ``masks``) whose leaves are ``torch.distributed.tensor.DTensor``
with ``Shard(d)`` / ``Replicate()`` placements on a 1-D or 2-D mesh, and return masks as
DTensors with the params' mesh and placements. Every rank of the mesh must make the same call.
The masks equal those of the same call on the full tensors in one process, ties included:
each rank counts its own shard, the histograms of a radix select are summed with
``all_reduce``, and ties at the threshold are split by global row-major position. Only
histograms, counts and per-channel vectors cross the network (see docs/distributed.md).
:func:`fprune.masked_call` runs FSDP2 (``fully_shard``) models with their own parameters, and
the pruners (:func:`fprune.gradual_magnitude`, :func:`fprune.set_`, :func:`fprune.rigl`) take
their DTensor parameters.

This module holds what is specific to the distributed case: :func:`last_communication`.
"""

from __future__ import annotations

from fprune import _distributed
from fprune._distributed import Communication

__all__ = ["Communication", "last_communication"]


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
    return _distributed.LAST
