"""Pruning sharded models: ``DTensor`` parameters (FSDP2, tensor parallelism) on ``torch.distributed``.

Sharding is a backend of the selection layer: :func:`fprune.select.select_inputs` (and so every
mask function, :func:`fprune.select.select` with every scope, and the pruners) hands a call
whose leaves are ``torch.distributed.tensor.DTensor`` with ``Shard(d)`` / ``Replicate()``
placements to this package, and returns masks as DTensors with the params' mesh and placements.
There is nothing new to call, and a new method (a score function over the selection layer) is
sharded for free. Every rank of the mesh makes the same call; the masks equal those of the same
call on the full tensors in one process, ties included. Only histograms, counts and per-channel
vectors cross the network (docs/distributed.md says how much). :func:`fprune.masked_call` runs
FSDP2 (``fully_shard``) models with their own parameters.

Public here: :func:`last_communication` and its :class:`Communication`. The package:

* ``_backend``: the ranks' agreement and the ``Call`` each scope's sharded form selects with
  (the scopes themselves live in :mod:`fprune.select`; nothing here knows one);
* ``_radix``: the radix selects whose histograms are summed over the mesh;
* ``_layout``: DTensor leaves (local shards, global positions) and their checks;
* ``_comm``: the collectives and what they cost;
* ``_fsdp``: :func:`fprune.masked_call` on FSDP2 models.
"""

from fprune.distributed._comm import Communication, last_communication

__all__ = ["Communication", "last_communication"]
