"""fprune: pruning masks as pure functions of parameter pytrees, for torch.func.

Masks are computed from a pytree of tensors (first of all ``dict(model.named_parameters())``)
and come back as a pytree of the same structure of ``torch.bool`` tensors (``True`` = kept).
Nothing is mutated. Masks are applied with :func:`apply_masks` or, to run a module,
:func:`masked_call` (``torch.func.functional_call``), so pruning composes with ``vmap``,
``grad`` and ``torch.compile``.

Layers (dependencies point one way, up this list; nothing imports a layer above its own):

* private helpers: ``_tree`` (pytrees and the input rules), ``_amount``, ``_random``,
  ``_inputs``, ``_observe``, ``_warn``, ``_select`` (the selection engine); ``_torch``, the torch
  internals fprune uses (each with an always-correct fallback); :mod:`fprune.packed`.
* :mod:`fprune.select` - the selection layer: scores in (any pytree, signed), masks out, with
  the scope as a parameter (``EACH`` leaf, ``Global``, ``Channels``, ``Rows``, ``NM``,
  ``Blocks``); count-exact with the documented tie-break. Its docstring says how to add a method.
  :mod:`fprune.distributed` is its backend for sharded (DTensor) inputs.
* methods: :mod:`fprune.methods` (the mask functions), :mod:`fprune.scores`,
  :mod:`fprune.calibration`, :mod:`fprune.distributions`, :mod:`fprune.schedules`,
  :mod:`fprune.pruners`, :mod:`fprune.reconstruct`, :mod:`fprune.stats`, and the analysis half of
  :mod:`fprune.structure` (dependency groups, masks by group).
* application: :mod:`fprune.apply` (``apply_masks``, ``masked_call``), :mod:`fprune.training`
  (the bridge to ``torch.optim``: the only core-side code that changes a module, on request),
  :mod:`fprune.oneshot` (post-training pruning of a model's blocks), :mod:`fprune.sparse`
  (sparse kernels for pruned weights), the shrinking half of :mod:`fprune.structure`
  (``compact``, ``compact_graph``, ``compact_params``), :mod:`fprune.load` (``load_into``: pruned
  params written into a module).
* ``fprune.compat`` - a drop-in ``torch.nn.utils.prune`` (hooks, ``_orig``/``_mask``), every
  mask computed by the functions above; not imported by ``import fprune``.

``tests/package/test_package_layers.py`` checks these layers on every import, lazy ones included.

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

# Modules are imported in the layers' order (see above): the selection layer first, compat never.

# Types of the pytrees the functions take and return.
from fprune._types import Amount, Grads, Masks, Params, Scores, Where

# The selection layer: scores and a scope in, count-exact masks out.
from fprune import select

# Mask functions (fprune.methods): one score function over the selection layer each.
from fprune import methods
from fprune.methods import (
    block_structured,
    global_unstructured,
    identity,
    iterative,
    l1_unstructured,
    ln_structured,
    n_m,
    random_structured,
    random_unstructured,
    rowwise_unstructured,
)

# Scores from params, gradients and activations; per-leaf sparsity distributions.
from fprune import calibration, distributions, scores

# Applying masks, measuring them, storing them packed.
from fprune.apply import apply_masks, masked_call
from fprune.packed import PackedMask, pack_masks, unpack_masks
from fprune.stats import LayerRow, Sparsity, SparsityReport, batched_report, report, sparsity

# Pruning during training: pruners as (init, update) pairs, schedules, the torch.optim bridge.
from fprune import schedules, training
from fprune.pruners import (
    DynamicSparseState,
    GradualState,
    MovementState,
    Pruner,
    PrunerState,
    dynamic_sparse,
    gradual_magnitude,
    movement,
    rigl,
    sparse_evolutionary,
    zero_regrown,
)

# Post-training pruning: layer-by-layer reconstruction (SparseGPT, OWL).
from fprune import oneshot, reconstruct
from fprune.load import load_into

# Structural pruning: dependency groups from torch.export, and physical shrinking.
from fprune import structure
from fprune.structure import compact, compact_graph, compact_params, group_structured

# Running pruned weights with sparse kernels.
from fprune import sparse

# Sharded parameters (DTensor, FSDP2): the distributed backend of the selection layer.
from fprune import distributed

try:
    __version__ = _version("fprune")
except _PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    # types
    "Params",
    "Masks",
    "Scores",
    "Grads",
    "Amount",
    "Where",
    # selection
    "select",
    # mask functions
    "methods",
    "identity",
    "l1_unstructured",
    "random_unstructured",
    "global_unstructured",
    "rowwise_unstructured",
    "n_m",
    "ln_structured",
    "random_structured",
    "block_structured",
    "iterative",
    # scores
    "scores",
    "calibration",
    "distributions",
    # applying, measuring, storing masks
    "apply_masks",
    "masked_call",
    "sparsity",
    "Sparsity",
    "report",
    "batched_report",
    "SparsityReport",
    "LayerRow",
    "PackedMask",
    "pack_masks",
    "unpack_masks",
    # pruning during training
    "schedules",
    "training",
    "Pruner",
    "PrunerState",
    "GradualState",
    "DynamicSparseState",
    "MovementState",
    "gradual_magnitude",
    "dynamic_sparse",
    "sparse_evolutionary",
    "rigl",
    "movement",
    "zero_regrown",
    # post-training pruning
    "oneshot",
    "reconstruct",
    "load_into",
    # structural pruning
    "structure",
    "group_structured",
    "compact",
    "compact_graph",
    "compact_params",
    # sparse execution
    "sparse",
    # sharded parameters
    "distributed",
]
