"""The op rules: how each ATen op moves and couples channel atoms.

:data:`RULES` maps an ATen op's name (its overload packet, ``"linear"`` for ``aten.linear.default``)
to a rule ``rule(a, node, op, args, kwargs) -> label``: ``a`` is the running
:class:`~fprune.structure._trace.Analysis`, ``args``/``kwargs`` the node's arguments with every
input replaced by its label (an int64 tensor of atom ids, -1 for none), a
:class:`~fprune.structure._labels.ParamRef` for a parameter not yet used as a tensor, or the
plain value for scalars. A rule returns the output's label (or a tuple of labels) and records
what it learns with ``a.union`` (these atoms are one channel), ``a.pin`` (these cannot be pruned,
with the reason) and ``a.mark_inexact`` (removing them changes other values).

A new op is one entry: ``RULES["my_op"] = rule``, or one more name in a ``@rule(...)`` line.
An in-place op (``relu_``, ``hardswish_``, ``mul_``) needs no entry of its own when its
out-of-place twin's rule is in :data:`IN_PLACE_TWINS` (element-wise and broadcasting binary ops:
their output is their first operand's shape and its channels, merged with the others'); see
:func:`rule_of`. An op with no rule makes every channel that flows into it unprunable, with its
name as the reason (``Analysis.unknown``); nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from fprune.structure._labels import ParamRef, compress, varies

if TYPE_CHECKING:
    from fprune.structure._trace import Analysis

__all__ = ["RULES", "IN_PLACE_TWINS", "PASS_PARAMETER", "Rule", "pass_parameter", "rule_of"]

Rule = Callable[["Analysis", torch.fx.Node, str, list, dict], Any]

#: op name -> rule.
RULES: dict[str, Rule] = {}


def rule(*ops: str) -> Callable[[Rule], Rule]:
    """Register the decorated function as the rule of every op in ``ops``."""

    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# Parameters passed through: these ops on a parameter keep it a ParamRef (with its axes
# permuted), so that a layer reading ``w.t()`` still sees which of its dims is which.

PASS_PARAMETER = frozenset(
    {
        "alias",
        "detach",
        "clone",
        "contiguous",
        "to",
        "_to_copy",
        "lift_fresh_copy",
        "transpose",
        "t",
        "permute",
        "type_as",
    }
)


def pass_parameter(ref: ParamRef, op: str, args: list) -> ParamRef:
    """The :class:`ParamRef` an op in :data:`PASS_PARAMETER` makes of ``ref``."""
    perm = list(ref.perm)
    if op in ("transpose", "swapaxes"):
        d0, d1 = args[1] % len(perm), args[2] % len(perm)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    elif op == "t" and len(perm) == 2:
        perm.reverse()
    elif op == "permute":
        order = [d % len(perm) for d in args[1]]
        perm = [perm[d] for d in order]
    shape = [ref.shape[ref.perm.index(p)] for p in perm]
    return ParamRef(ref.name, tuple(perm), tuple(shape))


# ---------------------------------------------------------------------------------------------
# Ops that carry no channel (assertions, metadata).


@rule(
    "_assert_tensor_metadata",
    "_assert_scalar",
    "sym_size",
    "sym_numel",
    "sym_stride",
    "sym_constrain_range_for_size",
    "_assert_async",
)
def silent(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return None


# ---------------------------------------------------------------------------------------------
# Shape ops: they run on the labels as they run on values, so reshapes into heads,
# concatenation offsets, splits and flattens need no special case.


@rule(
    "view",
    "reshape",
    "_unsafe_view",
    "permute",
    "transpose",
    "t",
    "unsqueeze",
    "squeeze",
    "flatten",
    "expand",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "clone",
    "alias",
    "contiguous",
    "cat",
    "stack",
    "unflatten",
    "movedim",
    "narrow",
    "view_as",
    "reshape_as",
    "expand_as",
    "detach",
    "lift_fresh_copy",
    "repeat",
    "repeat_interleave",
    "squeeze_",
    "unsqueeze_",
    "swapaxes",
    "transpose_",
    "numpy_T",
)
def shape_op(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    args = [a.label(x, node.name, op) for x in args]
    args = [[a.label(x) for x in arg] if isinstance(arg, list) else arg for arg in args]
    if op in ("view", "_unsafe_view") and isinstance(args[0], torch.Tensor):
        # A label may be expanded or transposed where the value is contiguous: same entries.
        return args[0].reshape(*args[1:], **kwargs)
    return cast(Callable[..., Any], node.target)(*args, **kwargs)  # a call_function node's target


# ---------------------------------------------------------------------------------------------
# New tensors: their entries carry no channel (their sizes are literals; a tensor of channel
# size that meets channels is caught where it meets them, see ``binary``).


@rule(
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "zeros",
    "ones",
    "full",
    "empty",
    "arange",
    "scalar_tensor",
    "eye",
    "linspace",
)
def created(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return a.empty_like_val(a.val(node))


# ---------------------------------------------------------------------------------------------
# Element-wise ops of one tensor: each output entry keeps its input's channel.


@rule(
    "to",
    "_to_copy",
    "type_as",
    "dropout",
    "native_dropout",
    "feature_dropout",
    "alpha_dropout",
    "relu",
    "gelu",
    "tanh",
    "sigmoid",
    "silu",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "mish",
    "softplus",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "pow",
    "erf",
    "sin",
    "cos",
    "reciprocal",
    "clamp",
    "clamp_min",
    "clamp_max",
    "square",
    "sign",
    "log1p",
    "expm1",
    "logit",
    "fill",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "rand_like",
    "randn_like",
)
def elementwise(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return a.like_output(a.label(args[0], node.name, op), a.val(node))


@rule(
    "add",
    "sub",
    "mul",
    "div",
    "where",
    "maximum",
    "minimum",
    "masked_fill",
    "rsub",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "__and__",
    "__or__",
    "bitwise_and",
    "bitwise_or",
    "floor_divide",
    "remainder",
    "fmod",
    "atan2",
    "copysign",
)
def binary(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """Operands broadcast together: entries that meet are one channel."""
    val = a.val(node)
    shape = tuple(val.shape)
    operands = [a.label(x, node.name, op) for x in args if isinstance(x, (ParamRef, torch.Tensor))]
    if not operands:
        return a.empty_like_val(val)
    full = [torch.broadcast_to(o, shape) if o.dim() <= len(shape) else o for o in operands]
    # An operand broadcast along a dim on which another operand's channels vary would tie
    # all those channels to one of its own: not a channel coupling, so its atoms are pinned.
    for i, o in enumerate(operands):
        pad = len(shape) - o.dim()
        for d in range(len(shape)):
            if (
                shape[d] > 1
                and (d < pad or o.shape[d - pad] == 1)
                and any(j != i and varies(full[j], d) for j in range(len(full)))
            ):
                a.pin(o, f"broadcast across channels by aten.{op} (node {node.name})")
                full[i] = torch.full(shape, -1, dtype=torch.int64)
                break
    # Entries that carry no channel (a constant, a tensor made from literal sizes) meeting the
    # channels of another operand along a dim they fill: compact cannot remove those entries
    # with the channels, so the channels stay.
    for i, o in enumerate(operands):
        if not bool((o < 0).any()):
            continue
        pad = len(shape) - o.dim()
        filled = [d for d in range(len(shape)) if d >= pad and o.shape[d - pad] > 1]
        for j in range(len(full)):
            if j != i and any(varies(full[j], d) for d in filled):
                a.pin(
                    torch.where(full[i] < 0, full[j], -1),
                    f"channels meet entries that carry none in aten.{op} (node {node.name})",
                )
    for f in full[1:]:
        a.union(full[0], f)
    # The merged operands are one channel entry by entry; the output takes the labels of the
    # one with the fewest distinct atoms (a residual stream's channels rather than a position
    # embedding's atom per entry), filled in from the others where it carries none.
    full.sort(key=_distinct)
    out = full[0]
    for f in full[1:]:
        out = torch.where(out >= 0, out, f)
    return out


def _distinct(x: torch.Tensor) -> int:
    """The number of distinct atoms in ``x`` (-1 included)."""
    return int(torch.unique(compress(x)).numel())


#: Rules that also serve the in-place twin of their op (``hardswish_`` for ``hardswish``): the
#: output is the first operand's shape, each entry keeping its channel (merged with the other
#: operands' where they meet), and no atom is made. An in-place op changes values, never which
#: channel an entry belongs to, and a merge of atoms holds for every view of the mutated tensor.
IN_PLACE_TWINS = frozenset({elementwise, binary})


def rule_of(op: str) -> Rule | None:
    """The rule of ``op``: its entry in :data:`RULES`, or its out-of-place twin's for an
    in-place op (``op_``) whose twin's rule is in :data:`IN_PLACE_TWINS`; None when neither."""
    found = RULES.get(op)
    if found is None and op.endswith("_") and not op.startswith("_"):
        twin = RULES.get(op[:-1])
        if twin in IN_PLACE_TWINS:
            return twin
    return found


# ---------------------------------------------------------------------------------------------
# Ops that move entries along dims that carry no channel (windows shifted and padded in space,
# a table of positions gathered by an index): each entry keeps its channel.


def _carrying(x: torch.Tensor, dims: Any) -> list[int]:
    return [d for d in dims if varies(x, d)]


@rule("roll", "flip")
def roll(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """A permutation of positions along dims without channels changes no entry's channel."""
    x = a.label(args[0], node.name, op)
    if op == "roll":
        dims = args[2] if len(args) > 2 else kwargs.get("dims", [])
    else:
        dims = args[1] if len(args) > 1 else kwargs.get("dims")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    along = [d % x.dim() for d in dims] if dims else list(range(x.dim()))  # no dims: flattened
    if _carrying(x, along):
        return a.unknown(
            node, op, args, kwargs, f"aten.{op} along a dim that carries channels (node {node.name})"
        )
    return a.like_output(x, a.val(node))


@rule("pad", "constant_pad_nd")
def pad(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """Padding along dims without channels: the new entries are per channel like their neighbours."""
    x = a.label(args[0], node.name, op)
    widths = list(args[1] if len(args) > 1 else kwargs["pad"])
    padded = [x.dim() - 1 - i // 2 for i in range(len(widths)) if widths[i] != 0]
    if _carrying(x, sorted(set(padded))):
        # New channels (a constant) next to computed ones: compact would have to rewrite the
        # padding and drop the columns that read it; not done, so these channels stay.
        return a.unknown(
            node, op, args, kwargs, f"aten.{op} along a dim that carries channels (node {node.name})"
        )
    for d in set(padded):
        x = x.narrow(d, 0, 1) if x.shape[d] else x
    return a.like_output(x, a.val(node))


@rule("index")
def index(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """``x[i0, i1, ...]`` gathering along dims without channels (Swin's relative-position table
    indexed by position pairs): the other dims, heads included, keep their channels."""
    indices = list(args[1])
    arg_nodes = list(cast(Sequence[Any], node.args[1]))
    indexed = [d for d, i in enumerate(indices) if i is not None]
    for d in indexed:
        i, source = indices[d], arg_nodes[d]
        value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(i, torch.Tensor) or value is None or value.dtype == torch.bool:
            # A boolean mask's output size depends on its values, which the analysis lacks.
            return a.unknown(
                node, op, args, kwargs, f"aten.{op} with a boolean or computed mask (node {node.name})"
            )
        if bool((i >= 0).any()):
            a.pin(i, f"indices computed from channels (aten.{op}, node {node.name})")
    x = args[0]
    if isinstance(x, ParamRef):
        x = a.label(x, node.name, op, axes={d for d in range(len(x.shape)) if d not in indexed})
    else:
        x = a.label(x, node.name, op)
    if _carrying(x, indexed):
        return a.unknown(
            node, op, args, kwargs, f"aten.{op} along a dim that carries channels (node {node.name})"
        )
    # Constant along every indexed dim: any index gives the same labels, so index with zeros.
    zeros = [torch.zeros(tuple(i.shape), dtype=torch.int64) if i is not None else None for i in indices]
    return a.like_output(torch.ops.aten.index.Tensor(x, zeros), a.val(node))


# ---------------------------------------------------------------------------------------------
# Reductions, softmax, pooling.


@rule("mean", "sum", "amax", "amin", "var", "std", "logsumexp", "prod", "norm", "linalg_vector_norm")
def reduce(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    val = a.val(node)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(x.dim()))
    if isinstance(dims, int):
        dims = [dims]
    if not all(isinstance(d, int) for d in dims):
        return a.unknown(node, op, args, kwargs)
    dims = [d % max(x.dim(), 1) for d in dims]
    if len(args) > 2 and isinstance(args[2], bool):
        keepdim = bool(args[2])
    else:
        keepdim = bool(kwargs.get("keepdim", False))
    reason = f"aten.{op} over channels (node {node.name})"
    if any(varies(x, d) for d in dims):
        # A statistic over channels (RMSNorm's mean of squares, a mean over features):
        # removing a channel changes it, so those channels are inexact; the statistic itself
        # belongs to no channel (merging them all would make the channels one).
        a.mark_inexact(x, reason)
        hi = x.amax(dim=dims, keepdim=keepdim)
        lo = torch.where(x >= 0, x, x.amax(dim=dims, keepdim=True)).amin(dim=dims, keepdim=keepdim)
        out = torch.where(hi == lo, hi, torch.full_like(hi, -1))
    else:
        out = x.amax(dim=dims, keepdim=keepdim) if dims and x.dim() else x
    return a.like_output(out, val)


@rule("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax")
def softmax(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    dim = args[1] % x.dim()
    if varies(x, dim):  # over channels: each output keeps its channel, none is exact
        a.mark_inexact(x, f"aten.{op} over channels (node {node.name})")
    return x


_SPATIAL = {
    "max_pool1d": 1,
    "max_pool2d": 2,
    "avg_pool1d": 1,
    "avg_pool2d": 2,
    "adaptive_avg_pool1d": 1,
    "adaptive_avg_pool2d": 2,
    "adaptive_max_pool1d": 1,
    "adaptive_max_pool2d": 2,
    "max_pool2d_with_indices": 2,
    "upsample_nearest2d": 2,
    "upsample_bilinear2d": 2,
    "_adaptive_avg_pool2d": 2,
    "reflection_pad2d": 2,
    "replication_pad2d": 2,
    "upsample_nearest1d": 1,
    "lp_pool2d": 2,
}


@rule(*_SPATIAL)
def pool(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """Ops over the last ``spatial`` dims: every channel stays itself."""
    x = a.label(args[0], node.name, op)
    val = a.val(node)
    channel = x.dim() - _SPATIAL[op] - 1
    if channel < 0:
        return a.unknown(node, op, args, {})
    per_channel = a.per_channel(x, channel)
    out_val = val[0] if isinstance(val, (list, tuple)) else val
    view = [1] * out_val.dim()
    view[channel] = per_channel.shape[0]
    out = per_channel.view(view).expand(tuple(out_val.shape))
    if isinstance(val, (list, tuple)):
        return type(val)([out] + [a.empty_like_val(v) for v in val[1:]])
    return out


# ---------------------------------------------------------------------------------------------
# Dense layers and matrix products.


def _pin_constant_inputs(
    a: Analysis, node: torch.fx.Node, op: str, x_ch: torch.Tensor, reads: torch.Tensor
) -> None:
    """Pin ``reads[j]`` (weight slices) where input channel ``x_ch[j]`` carries no channel: a
    constant or a tensor made from literal sizes, which compact cannot shrink with them."""
    free = x_ch < 0
    if bool(free.any()):
        a.pin(reads[free], f"aten.{op} reads input channels that carry none (node {node.name})")


def _dense(
    a: Analysis, node: torch.fx.Node, op: str, x: Any, w: Any, b: Any, in_axis: int, out_axis: int
) -> Any:
    val = a.val(node)
    if not isinstance(w, ParamRef) or len(w.shape) != 2:
        return a.unknown(node, op, [x, w, b], {}, f"aten.{op} with a computed weight (node {node.name})")
    x = a.label(x, node.name, op)
    w_in = a.atoms_of(w.name, w.perm[in_axis])
    w_out = a.atoms_of(w.name, w.perm[out_axis])
    if (
        isinstance(x, torch.Tensor)
        and x.dim() > 1
        and not varies(x, x.dim() - 1)
        and any(varies(x, d) for d in range(x.dim() - 1))
    ):
        # Channels along a dim the layer does not contract, and none along the one it does
        # (MLP-Mixer's token mixing: a linear layer over a transposed activation). Each
        # output entry would belong to two channels, which one atom per entry cannot say;
        # merging every channel of x with every input of the layer would be wrong. Neither
        # side can be pruned; the layer's output channels still can.
        reason = (
            f"aten.{op} contracts a dim that carries no channels while its input's channels "
            f"run along another dim (a token-mixing layer; node {node.name})"
        )
        a.pin(x, reason)
        a.pin(w_in, reason)
    else:
        a.union(x, w_in)  # x[..., j] with the weight's input channel j
        if isinstance(x, torch.Tensor) and x.dim():
            _pin_constant_inputs(a, node, op, x.movedim(-1, 0).reshape(x.shape[-1], -1).amax(dim=1), w_in)
    if b is not None:
        b_label = a.label(b, node.name, op)
        a.union(b_label.expand(val.shape) if b_label.dim() else b_label, w_out)
    return w_out.expand(tuple(val.shape))


@rule("linear")
def linear(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    return _dense(a, node, op, args[0], args[1], b, in_axis=1, out_axis=0)


@rule("addmm")
def addmm(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return _dense(a, node, op, args[1], args[2], args[0], in_axis=0, out_axis=1)


@rule("mm")
def mm(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return _dense(a, node, op, args[0], args[1], None, in_axis=0, out_axis=1)


@rule("matmul", "bmm")
def matmul(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """A weight (``x @ W``) is a dense layer; activation @ activation is eager attention."""
    if op == "matmul" and isinstance(args[1], ParamRef) and len(args[1].shape) == 2:
        return _dense(a, node, op, args[0], args[1], None, in_axis=0, out_axis=1)
    # q @ k^T and probabilities @ v.
    x, y = (a.label(t, node.name, op) for t in args[:2])
    val = a.val(node)
    if x.dim() < 2 or y.dim() < 2:
        return a.unknown(node, op, args, {})
    batch = tuple(val.shape[:-2])
    x = x.expand(batch + tuple(x.shape[-2:]))
    y = y.expand(batch + tuple(y.shape[-2:]))
    x_const_n, x_const_k = not varies(x, x.dim() - 2), not varies(x, x.dim() - 1)
    y_const_k, y_const_m = not varies(y, y.dim() - 2), not varies(y, y.dim() - 1)
    x_k, y_k = x[..., 0, :], y[..., :, 0]

    def has(t: torch.Tensor) -> bool:
        return bool((t >= 0).any())

    if has(x) and has(y) and not x_const_k and not y_const_k:
        # A contraction over channels: q[h, i] pairs with k[h, i]. Heads stay whole.
        if not (x_const_n and y_const_m):
            return a.unknown(node, op, args, {})
        a.union(x_k, y_k)
        # One head atom per head, not per batch entry: along batch dims on which neither side's
        # channels vary (the batch, Swin's windows) the head is the same.
        head = a.new(
            tuple(s if (varies(x_k, d) or varies(y_k, d)) else 1 for d, s in enumerate(batch))
        ).expand(batch)
        a.union(x_k, head[..., None])
        a.union(y_k, head[..., None])
        a.heads.append(head.reshape(-1))
        return head[..., None, None].expand(tuple(val.shape))
    if (not x_const_k and has(x)) or (not y_const_k and has(y)):
        return a.unknown(node, op, args, {})
    x_n, y_m = x[..., :, 0], y[..., 0, :]
    if has(x_n) and has(y_m):
        if x_const_n:
            a.union(y_m, x_n[..., :1])
            return y_m[..., None, :].expand(tuple(val.shape))
        if y_const_m:
            a.union(x_n, y_m[..., :1])
            return x_n[..., :, None].expand(tuple(val.shape))
        return a.unknown(node, op, args, {})
    if has(y_m):
        return y_m[..., None, :].expand(tuple(val.shape))
    return x_n[..., :, None].expand(tuple(val.shape))


@rule("scaled_dot_product_attention")
def attention(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """Whole heads: the atoms of head h in q, k and v are one channel."""
    q, k, v = (a.label(x, node.name, op) for x in args[:3])
    val = a.val(node)
    if q.dim() != 4 or k.shape[-3] != q.shape[-3] or kwargs.get("enable_gqa"):
        return a.unknown(
            node, op, args, kwargs, f"grouped-query attention is not supported yet (node {node.name})"
        )
    for t in (q, k, v):
        if varies(t, 2):  # channels along the sequence: not attention as we know it
            return a.unknown(node, op, args, kwargs)
    qh, kh, vh = q[0, :, 0, :], k[0, :, 0, :], v[0, :, 0, :]
    a.union(q, qh[None, :, None, :])
    a.union(k, kh[None, :, None, :])
    a.union(v, vh[None, :, None, :])
    a.union(qh, kh)
    head = a.new((q.shape[1],))
    for t in (qh, kh, vh):
        a.union(t, head[:, None])
    a.heads.append(head)
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    if isinstance(mask, torch.Tensor) and bool((mask >= 0).any()):
        a.pin(mask, f"attention mask with channels (node {node.name})")
    return vh[None, :, None, :].expand(tuple(val.shape))


@rule("embedding")
def embedding(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    w, ids = args[0], args[1]
    val = a.val(node)
    if not isinstance(w, ParamRef) or len(w.shape) != 2:
        return a.unknown(node, op, args, kwargs)
    a.pin(a.atoms_of(w.name, w.perm[0]), f"embedding rows are indexed by input ids (node {node.name})")
    ids = a.label(ids)
    if isinstance(ids, torch.Tensor) and bool((ids >= 0).any()):
        a.pin(ids, f"embedding indices with channels (node {node.name})")
    return a.atoms_of(w.name, w.perm[1]).expand(tuple(val.shape))


# ---------------------------------------------------------------------------------------------
# Normalization layers: a per-channel affine (and running statistics).


def _affine(
    a: Analysis, node: torch.fx.Node, op: str, x: torch.Tensor, channel: int, params: list
) -> torch.Tensor:
    per_channel = a.per_channel(x, channel)
    for p in params:
        if p is None:
            continue
        if isinstance(p, ParamRef) and len(p.shape) == 1:
            a.union(a.atoms_of(p.name, p.perm[0]), per_channel)
        else:
            a.union(a.label(p, node.name, op).reshape(-1), per_channel)
    return x


@rule("batch_norm")
def batch_norm(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    return _affine(a, node, op, x, 1 if x.dim() > 1 else 0, list(args[1:5]))


@rule("_native_batch_norm_legit_no_training")
def batch_norm_no_training(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, "batch_norm")
    out = _affine(a, node, "batch_norm", x, 1, list(args[1:5]))
    return (out,) + tuple(a.empty_like_val(v) for v in a.val(node)[1:])


@rule("layer_norm")
def layer_norm(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    if len(args[1]) != 1:
        return a.unknown(node, op, args, kwargs, f"layer_norm over several dims (node {node.name})")
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    b = args[3] if len(args) > 3 else kwargs.get("bias")
    a.mark_inexact_along(x, x.dim() - 1, f"LayerNorm statistics (node {node.name})")
    return _affine(a, node, op, x, x.dim() - 1, [w, b])


@rule("rms_norm")
def rms_norm(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    if len(args[1]) != 1:
        return a.unknown(node, op, args, kwargs)
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    a.mark_inexact_along(x, x.dim() - 1, f"RMSNorm statistics (node {node.name})")
    return _affine(a, node, op, x, x.dim() - 1, [w])


# ---------------------------------------------------------------------------------------------
# Convolutions.


def _conv(
    a: Analysis, node: torch.fx.Node, op: str, x: Any, w: Any, b: Any, groups: int, spatial: int
) -> Any:
    val = a.val(node)
    if not isinstance(w, ParamRef) or w.perm != tuple(range(len(w.shape))):
        return a.unknown(node, op, [x, w, b], {}, f"aten.{op} with a computed weight (node {node.name})")
    x = a.label(x, node.name, op)
    channel = x.dim() - spatial - 1
    c_out, c_in_g = w.shape[0], w.shape[1]
    x_ch = a.per_channel(x, channel)  # [C_in]
    out = a.atoms_of(w.name, 0)
    if groups == 1:
        a.union(a.atoms_of(w.name, 1), x_ch)
        _pin_constant_inputs(a, node, op, x_ch, a.atoms_of(w.name, 1))
    elif c_in_g == 1:
        # Depthwise (with a channel multiplier m): output channels g*m .. g*m+m-1 come
        # from input channel g alone, so they are one channel with it.
        m = c_out // groups
        a.union(out.view(groups, m), x_ch[:, None])
        _pin_constant_inputs(a, node, op, x_ch, out.view(groups, m))
    else:
        # Grouped: weight input channel j reads input channel g*c_in_g + j in every group g,
        # and output channel j of every group is one channel (as Torch-Pruning does).
        a.union(x_ch.view(groups, c_in_g), a.atoms_of(w.name, 1)[None, :])
        a.union(out.view(groups, c_out // groups), out.view(groups, -1)[:1])
        _pin_constant_inputs(a, node, op, x_ch.view(groups, c_in_g).amin(dim=0), a.atoms_of(w.name, 1))
    if b is not None:
        if isinstance(b, ParamRef):
            a.union(a.atoms_of(b.name, b.perm[0]), out)
        else:
            a.union(a.label(b).reshape(-1), out)
    view = [1] * val.dim()
    view[channel] = c_out
    return out.view(view).expand(tuple(val.shape))


@rule("conv1d", "conv2d")
def conv(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
    return _conv(a, node, op, args[0], args[1], b, groups, spatial=1 if op == "conv1d" else 2)


@rule("convolution")
def convolution(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    transposed = args[6] if len(args) > 6 else False
    w = args[1]
    spatial = len(w.shape) - 2 if isinstance(w, ParamRef) else 0
    if transposed or spatial not in (1, 2):
        return a.unknown(
            node,
            op,
            args,
            kwargs,
            f"transposed and 3-d convolutions are not supported yet (node {node.name})",
        )
    groups = args[8] if len(args) > 8 else 1
    return _conv(a, node, op, args[0], args[1], args[2], groups, spatial)


# ---------------------------------------------------------------------------------------------
# Ops left for later: their channels are unprunable with this reason.


def _later(reason: str) -> Rule:
    def unsupported(a: Analysis, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
        return a.unknown(node, op, args, kwargs, f"{reason} (aten.{op}, node {node.name})")

    return unsupported


for _op in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
    RULES[_op] = _later("transposed convolutions are not supported yet")
RULES["conv3d"] = _later("3-d convolutions are not supported yet")
for _op in ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell"):
    RULES[_op] = _later("recurrent layers are not supported yet")
RULES["group_norm"] = _later("GroupNorm is not supported yet")
RULES["instance_norm"] = _later("InstanceNorm is not supported yet")
