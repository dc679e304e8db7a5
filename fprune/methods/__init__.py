"""Mask functions: each is a score function over the selection layer (:mod:`fprune.select`).

Pure functions of a pytree of tensors that return a pytree of the same structure holding
``torch.bool`` keep-masks (``True`` = kept), and change nothing:

* unstructured (any single entry): ``l1_unstructured``, ``random_unstructured``,
  ``global_unstructured`` (one ranking over every leaf), ``rowwise_unstructured`` (a count per
  row, Wanda's choice), ``n_m`` (n of every m entries), ``identity``;
* structured (whole channels of each leaf): ``ln_structured``, ``random_structured``; whole
  tiles of each matrix: ``block_structured``;
* iterative: ``iterative`` (global pruning over rounds, re-scoring before each).

Every name here is also exported by ``fprune`` itself, where users import it from.
"""

from fprune.methods._iterative import iterative
from fprune.methods._structured import block_structured, ln_structured, random_structured
from fprune.methods._unstructured import (
    global_unstructured,
    identity,
    l1_unstructured,
    n_m,
    random_unstructured,
    rowwise_unstructured,
)

__all__ = [
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
]
