"""Element-wise ops (each output entry keeps its input's channel; operands that meet are one
channel), reductions and softmax (statistics over channels make them inexact)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fprune.structure._labels import ParamRef, compress, varies
from fprune.structure._ops._base import Op, names, register

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation


def elementwise(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return a.like_output(a.label(args[0], node.name, op), a.val(node))


ELEMENTWISE = register(
    Op(
        names(
            """
            to _to_copy type_as dropout native_dropout feature_dropout alpha_dropout relu gelu
            tanh sigmoid silu hardtanh hardswish hardsigmoid relu6 leaky_relu elu selu celu mish
            softplus neg abs exp log sqrt rsqrt pow erf sin cos reciprocal clamp clamp_min
            clamp_max square sign log1p expm1 logit fill zeros_like ones_like full_like
            empty_like rand_like randn_like
            softshrink hardshrink log_sigmoid threshold
            """
        ),
        elementwise,
        in_place=True,
    )
)


def binary(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


#: Its in-place twins (``mul_``) keep the first operand's shape, each entry its channel, merged
#: with the other operands' where they meet: a merge holds for every view of the mutated tensor.
BINARY = register(
    Op(
        names(
            """
            add sub mul div where maximum minimum masked_fill rsub eq ne lt le gt ge logical_and
            logical_or __and__ __or__ bitwise_and bitwise_or floor_divide remainder fmod atan2
            copysign
            """
        ),
        binary,
        in_place=True,
    )
)


def prelu(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """``prelu(x, weight)``: one slope per channel along dim 1 of ``x`` (or one for all)."""
    x, w = a.label(args[0], node.name, op), args[1]
    if not isinstance(w, ParamRef) or len(w.shape) != 1:
        return a.unknown(node, op, args, kwargs)
    if w.shape[0] > 1:
        if x.dim() < 2 or x.shape[1] != w.shape[0]:
            return a.unknown(node, op, args, kwargs)
        a.union(a.atoms_of(w.name, w.perm[0]), a.per_channel(x, 1))
    return x


def resize_prelu(m: Any, name: str) -> None:
    m.num_parameters = int(m.weight.shape[0])


PRELU = register(Op(("prelu",), prelu, layers={nn.PReLU: resize_prelu}))


# ---------------------------------------------------------------------------------------------
# Reductions and softmax.


def reduce(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


REDUCE = register(
    Op(
        names(
            """
            mean sum amax amin var std logsumexp prod norm linalg_vector_norm
            """
        ),
        reduce,
    )
)


def softmax(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    dim = args[1] % x.dim()
    if varies(x, dim):  # over channels: each output keeps its channel, none is exact
        a.mark_inexact(x, f"aten.{op} over channels (node {node.name})")
    return x


SOFTMAX = register(
    Op(
        names(
            """
            softmax _softmax log_softmax _log_softmax _safe_softmax
            """
        ),
        softmax,
    )
)
