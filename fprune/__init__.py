"""fprune: pruning masks as pure functions of parameter pytrees, for torch.func.

Masks are computed from a pytree of tensors (first of all ``dict(model.named_parameters())``)
and come back as a pytree of the same structure of ``torch.bool`` tensors (``True`` = kept).
Nothing is mutated. Masks are applied with :func:`apply_masks` or, to run a module,
:func:`masked_call` (``torch.func.functional_call``), so pruning composes with ``vmap``,
``grad`` and ``torch.compile``.

Layers (dependencies point one way, down this list; nothing below imports what is above it):

* ``fprune.compat`` - a drop-in ``torch.nn.utils.prune`` (hooks, ``_orig``/``_mask``); the only
  code that touches modules' hooks and buffers.
* :mod:`fprune.training` - the bridge to ``torch.optim`` and modules (``set_grads``,
  ``load_buffers``, ``apply_masks_``, ``mask_grads_``, ``keep_masked``); the only core-side code
  that changes a module, in place, on request.
* :mod:`fprune.scores`, :mod:`fprune.calibration`, :mod:`fprune.distributions`,
  :func:`fprune.iterative` - the research toolkit: saliency scores by ``torch.func``, Wanda's
  calibration norms, per-leaf sparsity distributions (ERK), iterative global pruning.
* :mod:`fprune.oneshot`, :mod:`fprune.reconstruct` - post-training pruning: the layer-by-layer
  pipeline over a model's blocks (SparseGPT, Wanda, magnitude, OWL), SparseGPT's weight update
  and least squares on a fixed mask, from :func:`fprune.calibration.hessians`.
* :mod:`fprune.structure` - dependency groups from ``torch.export`` (``groups``), masks by group
  (``group_structured``) and physical shrinking (``compact_params``, ``compact``: the model's own
  class, smaller; ``compact_graph``: an exported graph).
* :mod:`fprune.apply` - applying masks (``apply_masks``, ``masked_call``); :mod:`fprune.packed`,
  the opt-in bit-packed mask format (``pack_masks``, ``unpack_masks``).
* :mod:`fprune.unstructured`, :mod:`fprune.structured`, :mod:`fprune.stats` - the pure core
  (``stats``: ``sparsity`` and the per-layer ``report``): each mask function is a score
  function over the selection layer.
* :mod:`fprune.select` - the selection layer: scores in (any pytree, signed), masks out, with
  the scope as a parameter (``EACH`` leaf, ``Global``, ``Channels``, ``Rows``, ``NM``);
  count-exact with the documented tie-break. Its docstring says how to add a method.
* private helpers: ``_select`` (the selection engine and its key builder), ``_tree``,
  ``_amount``, ``_random``, ``_inputs``; ``_torch``, the torch internals fprune uses (each with
  an always-correct fallback).

Example:
    >>> import torch, fprune
    >>> model = torch.nn.Linear(4, 2)
    >>> params = dict(model.named_parameters())
    >>> masks = fprune.global_unstructured(params, 0.5, where=lambda name, p: name == "weight")
    >>> float(fprune.sparsity(masks).per_leaf["weight"])
    0.5
    >>> fprune.masked_call(model, params, masks, (torch.ones(1, 4),)).shape
    torch.Size([1, 2])
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from fprune._types import Grads, Masks, Params, Scores
from fprune.apply import apply_masks, masked_call
from fprune.packed import PackedMask, pack_masks, unpack_masks
from fprune.stats import Sparsity, sparsity
from fprune.structured import ln_structured, random_structured
from fprune.unstructured import global_unstructured, identity, l1_unstructured, random_unstructured

# The selection layer (fprune.select) and the methods built on it since.
from fprune import select
from fprune.unstructured import n_m, rowwise_unstructured

# traps: the torch.optim bridge (fprune.training) and the sparsity report.
from fprune import training
from fprune.stats import LayerRow, SparsityReport, report

# Sparse training (pruners as (init, update) pairs, schedules of the step).
from fprune import schedules
from fprune.pruners import (
    Pruner,
    PrunerState,
    dynamic_sparse,
    gradual_magnitude,
    rigl,
    set_,
    sparse_evolutionary,
    zero_regrown,
)

# Research toolkit (issue 10): sparsity distributions, saliency scores, calibration, iterative.
from fprune import calibration, distributions, scores
from fprune._iterative import iterative
# Sharded models: the distributed backend of the selection layer.
from fprune import distributed

# Sparse execution of pruned weights (fprune.sparse).
from fprune import sparse

# Dependency groups and physical shrinking (fprune.structure).
from fprune import structure
from fprune.structure import compact, compact_graph, compact_params, group_structured

# Post-training pruning: layer reconstruction (SparseGPT, least squares) and the one-shot pipeline.
from fprune import oneshot, reconstruct

try:
    __version__ = _version("fprune")
except _PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "Params",
    "Masks",
    "Scores",
    "Grads",
    "identity",
    "l1_unstructured",
    "random_unstructured",
    "ln_structured",
    "random_structured",
    "global_unstructured",
    "apply_masks",
    "masked_call",
    "sparsity",
    "Sparsity",
    "PackedMask",
    "pack_masks",
    "unpack_masks",
    # The selection layer and the methods built on it since.
    "select",
    "rowwise_unstructured",
    "n_m",
    # traps
    "training",
    "report",
    "SparsityReport",
    "LayerRow",
    # research toolkit
    "distributions",
    "scores",
    "calibration",
    "iterative",
    # sparse training
    "schedules",
    "Pruner",
    "PrunerState",
    "gradual_magnitude",
    "dynamic_sparse",
    "sparse_evolutionary",
    "rigl",
    "set_",
    "zero_regrown",
    # fprune.structure
    "structure",
    "group_structured",
    "compact_params",
    "compact",
    "compact_graph",
    # Sharded models.
    "distributed",
    # post-training pruning
    "reconstruct",
    "oneshot",
    # Sparse execution.
    "sparse",
]
