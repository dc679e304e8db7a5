"""The structural ops, one :class:`~fprune.structure._ops._base.Op` each: the analysis rule,
the graph rewrite and the module resizers of an ATen op, in one place. A family a file:

* ``shape``: views, reshapes, splits, slices, concatenation, new tensors, roll / pad / index;
* ``pointwise``: element-wise ops (and their in-place twins), reductions, softmax;
* ``dense``: linear / addmm / mm, embeddings (``nn.Linear``, ``Conv1D``, transformers' MLPs);
* ``attention``: eager ``matmul`` attention and ``scaled_dot_product_attention``
  (``nn.MultiheadAttention``, transformers' attention blocks);
* ``norm``: BatchNorm, LayerNorm, RMSNorm;
* ``conv``: convolutions and pooling.

A new op is one ``register(Op(...))`` in its family's file. An op with no rule makes every
channel that flows into it unprunable, with its name as the reason; nothing is guessed.
"""

from fprune.structure._ops import attention, conv, dense, norm, pointwise, shape
from fprune.structure._ops._base import (
    OPS,
    RESIZERS,
    REWRITES,
    RULES,
    Op,
    Resizer,
    Rewrite,
    Rewriter,
    Rule,
    find_resizer,
    register,
    rule_of,
)
from fprune.structure._ops.shape import PASS_PARAMETER, pass_parameter

__all__ = [
    "Op",
    "Rule",
    "Rewrite",
    "Resizer",
    "Rewriter",
    "OPS",
    "RULES",
    "REWRITES",
    "RESIZERS",
    "PASS_PARAMETER",
    "register",
    "rule_of",
    "find_resizer",
    "pass_parameter",
    "attention",
    "conv",
    "dense",
    "norm",
    "pointwise",
    "shape",
]
