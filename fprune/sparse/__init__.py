"""Sparse execution of pruned weights: real speed from unstructured masks on the CPU, 2:4 for GPUs.

:func:`to_sparse` turns pruned weights of linear layers (``nn.Linear``, transformers'
``Conv1D``) into sparse tensors that ``torch.func.functional_call`` runs with sparse kernels;
:func:`load_into` (``fprune.load_into``, the same function) puts them into the module itself, so
that its own forward (and ``generate``) runs them; :func:`to_state` / :func:`from_state` are their
checkpoint form. See docs/sparse.md.
"""

from fprune.sparse._auto import clear_measurements, crossover
from fprune.sparse._convert import LAYOUTS, from_state, layouts, to_sparse, to_state
from fprune.sparse._module import load_into, sparse_weights
from fprune.sparse._weight import SparseWeight, sparse_matrix

__all__ = [
    "LAYOUTS",
    "SparseWeight",
    "clear_measurements",
    "crossover",
    "from_state",
    "layouts",
    "load_into",
    "sparse_matrix",
    "sparse_weights",
    "to_sparse",
    "to_state",
]
