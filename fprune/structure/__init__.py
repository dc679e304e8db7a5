"""Which channels must be pruned together: dependency groups found by tracing a model once.

:func:`groups` runs ``torch.export`` on a module once and propagates *channel atoms* through the
exported ATen graph: every channel of every parameter dim, and every element of every activation
that comes from one, carries the id of an atom; shape ops run on those id tensors as they run on
values (so reshapes into heads, concatenation offsets, splits and flattens need no special case),
and ops that couple channels (a conv reading its input, an element-wise add of two streams, a
BatchNorm's affine and running statistics) merge atoms (union-find). At the end, every set of
merged atoms is one channel, and the (parameter, dim, indices) it covers are the slices to prune
together. The result, a :class:`Structure`, is a frozen and picklable description with no
reference to the module, so everything after it is a pure function of tensors.

What it will not do is guess: an op it has no rule for makes every channel that flows into it
unprunable, with the op's name as the reason; channels that reach a model input or output are
unprunable too; channels whose removal changes other values (LayerNorm statistics over the
residual stream, a softmax or mean over channels) are marked *inexact*: they can be masked, but
removing them is not equivalent to masking them.

Every group reported prunable can be compacted: ``groups`` checks that any pruning of the
prunable groups leaves every value of the graph a box (the kept entries the product of kept
indices per dim, which is what compaction can rebuild), and couples the channels that a view
interleaves (ShuffleNet's channel shuffle) or pins them, with the node as the reason.

Supported: conv nets (conv1d/conv2d with groups, depthwise, BatchNorm with its running
statistics, residual adds, concatenation, channel shuffles, squeeze-excitation gates, pooling,
flatten, linear), MLPs, and transformers such as Hugging Face GPT-2 and BERT, torchvision's ViT
and Swin (linear and ``Conv1D`` layers, LayerNorm, embeddings and tied weights, position
embeddings, whole attention heads through ``scaled_dot_product_attention`` or eager ``matmul``
attention, relative-position bias tables, windows padded and rolled in space). In-place ops
follow their out-of-place twins' rules. All 18 torchvision classifiers of the zoo benchmark
(``python -m benchmarks.zoo``) prune and compact exactly. Grouped-query attention prunes whole
key/value groups. Not supported (no rule maps their channels, so their groups are unprunable and
say so): per-dim head pruning (RoPE), RNNs, transposed and 3-D convs, GroupNorm.

The package, one concern a file:

* ``_types``: the public, frozen results (:class:`Member`, :class:`Group`, :class:`Structure`)
  and :class:`CompactError`;
* ``_ops``: the structural ops, one ``Op`` object each, holding the op's analysis rule, its
  graph rewrite and the resizers of the layers built on it (a new op is one ``register(Op(...))``
  in its family's file: ``shape``, ``pointwise``, ``dense``, ``attention``, ``norm``, ``conv``);
* ``_exports``: each module's last export, reused while the module is unchanged (:func:`forget`);
* ``_trace``: export and :func:`groups`; its ``Analysis`` is the three jobs below in order:
* ``_atoms`` (atom ids, merges as a union-find, pins, inexact marks), ``_propagate`` (the walk
  over the graph that asks each op's rule for its node's label), ``_boxes`` (channels coupled or
  pinned until every value stays a box) and ``_build`` (the :class:`Structure`);
* ``_labels``: the values the propagation carries (labels, parameter references);
* ``_masks``: masks by group, :func:`group_structured`;
* ``_compact``: physical shrinking, :func:`compact_params`, and the graph route
  :func:`compact_graph` (a rewritten exported graph: each node's op's rewrite);
* ``_module``: the module route :func:`compact` (a smaller copy of the user's module: each
  layer's resizer).
"""

from fprune.structure._compact import compact_graph, compact_params
from fprune.structure._exports import forget
from fprune.structure._masks import group_structured
from fprune.structure._module import CompactError, compact
from fprune.structure._trace import groups
from fprune.structure._types import Group, Member, Structure

__all__ = [
    "Member",
    "Group",
    "Structure",
    "groups",
    "forget",
    "group_structured",
    "compact_params",
    "compact",
    "compact_graph",
    "CompactError",
]
