"""Pruning during training: pruners as pure ``(init, update)`` pairs over the selection layer.

A pruner is a :class:`Pruner` named tuple of two pure functions, in the manner of optax::

    state = pruner.init(params)                                  # state.masks readable at once
    masks, state = pruner.update(params, state, grads=grads)     # once per training step

Each pruner's state is its own named tuple of tensors (:class:`GradualState`,
:class:`DynamicSparseState`, :class:`MovementState`), as each optax transform has its own.
All share a core (:class:`PrunerState`): ``masks`` (bool, shaped like ``params``) and ``step``
(a 0-dim int64 tensor: the number of updates so far), the first two fields; the shared helpers
(``_core.py``) read and replace only those, so a pruner with more state adds fields to its own
tuple and edits nothing else. Being tensors only, a state saves with ``torch.save`` and loads
with ``torch.load(weights_only=True)`` (each pruner's file registers its state class as a safe
global), stacks and ``vmap``-s over seeds, and threads through a
``torch.compile(fullgraph=True)`` step: ``update`` is a tensor program whose masks and counts
may change every step without recompiling. Whether a step updates the masks is a tensor
``where``, not a Python ``if``; only where the step is a plain tensor (eager code, or a
``vmap`` that leaves ``state.step`` unbatched) does ``update`` read it on the host, to skip the
work of a step that changes nothing.

Each ``update`` advances ``state.step`` by one; the first update sees step 0. "Every
``every`` steps" means at steps where ``step % every == 0``; ``end`` is exclusive. Only the
leaves ``where(name, tensor)`` selects are pruned; by default (``where=None``) those with two
dimensions or more, so biases and normalization weights stay dense.

Every mask change is a selection of :mod:`fprune.select` (so the selection rule is its: count-
exact, ties to the first position, row-major, leaves in optree's flatten order; NaN scores rank
above ``+inf``; and DTensor params, FSDP2's, go to its sharded backend), with a *count rule*
as its amount, ``rule(remaining, size) -> count``, which the selection applies to what the prior
masks left:

* :func:`gradual_magnitude`: at update steps, the lowest magnitudes among the kept entries,
  until ``round(schedule(step) * size)`` are pruned (one ``Global`` ranking, or per leaf).
* :func:`dynamic_sparse` (SET, RigL, and any other drop/grow pair): per leaf,
  ``k = min(round(drop_fraction(step) * active), inactive)``; drop the ``k`` active entries of
  lowest ``drop`` score, grow the ``k`` entries inactive before the update of highest ``grow``
  score (the lowest of the negated scores: ties to the first position, NaN last).
* :func:`movement`: scores accumulate ``-grad * param`` at every step; at update steps the
  ``round(schedule(step) * size)`` lowest scores are pruned, among all entries (pruned ones
  come back when their score rises).

A drop or grow criterion is one function ``criterion(leaf) -> scores``: it gets a :class:`Leaf`
(``param``, ``grad``, ``mask``, ``seed``, ``index``, ``name``) and returns a tensor shaped like
the parameter, higher = more important. :func:`magnitude`, :func:`gradient_magnitude` and
:func:`uniform_random` are the built-in ones.

One pruner a private file, its state class beside it: ``_gradual.py`` (:func:`gradual_magnitude`),
``_dynamic.py`` (:func:`dynamic_sparse`, :func:`sparse_evolutionary`, :func:`rigl`),
``_criteria.py`` (:class:`Leaf` and the criteria), ``_movement.py`` (:func:`movement`), on the
shared core in ``_core.py`` (:class:`Pruner`, :class:`PrunerState`, :func:`zero_regrown` and
the helpers). This module only re-exports; a new pruner is one new file here plus its names
below (docs/development.md walks through one).
"""

from fprune.pruners._core import Pruner, PrunerState, zero_regrown
from fprune.pruners._criteria import Leaf, gradient_magnitude, magnitude, uniform_random
from fprune.pruners._dynamic import DynamicSparseState, dynamic_sparse, rigl, sparse_evolutionary
from fprune.pruners._gradual import GradualState, gradual_magnitude
from fprune.pruners._movement import MovementState, movement

__all__ = [
    "Pruner",
    "PrunerState",
    "GradualState",
    "DynamicSparseState",
    "MovementState",
    "Leaf",
    "gradual_magnitude",
    "dynamic_sparse",
    "sparse_evolutionary",
    "rigl",
    "movement",
    "magnitude",
    "gradient_magnitude",
    "uniform_random",
    "zero_regrown",
]
