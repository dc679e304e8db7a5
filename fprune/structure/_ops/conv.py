"""Convolutions (plain, grouped, depthwise; 1-d and 2-d) and pooling over space. Transposed
convolutions (whose weights hold input channels first) and 3-d convolutions are not supported (no
rule maps their channels), so the groups through them are unprunable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from fprune.structure._labels import ParamRef
from fprune.structure._ops._base import GRAPH_ROUTE, Op, Rewriter, register, unsupported, where
from fprune.structure._ops.dense import pin_constant_inputs
from fprune.structure._types import CompactError

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation


def _conv(
    a: Propagation, node: torch.fx.Node, op: str, x: Any, w: Any, b: Any, groups: int, spatial: int
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
        pin_constant_inputs(a, node, op, x_ch, a.atoms_of(w.name, 1))
    elif c_in_g == 1:
        # Depthwise (with a channel multiplier m): output channels g*m .. g*m+m-1 come
        # from input channel g alone, so they are one channel with it.
        m = c_out // groups
        a.union(out.view(groups, m), x_ch[:, None])
        pin_constant_inputs(a, node, op, x_ch, out.view(groups, m))
    else:
        # Grouped: weight input channel j reads input channel g*c_in_g + j in every group g,
        # and output channel j of every group is one channel (as Torch-Pruning does).
        a.union(x_ch.view(groups, c_in_g), a.atoms_of(w.name, 1)[None, :])
        a.union(out.view(groups, c_out // groups), out.view(groups, -1)[:1])
        pin_constant_inputs(a, node, op, x_ch.view(groups, c_in_g).amin(dim=0), a.atoms_of(w.name, 1))
    if b is not None:
        if isinstance(b, ParamRef):
            a.union(a.atoms_of(b.name, b.perm[0]), out)
        else:
            a.union(a.label(b).reshape(-1), out)
    view = [1] * val.dim()
    view[channel] = c_out
    return out.view(view).expand(tuple(val.shape))


def conv(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
    return _conv(a, node, op, args[0], args[1], b, groups, spatial=1 if op == "conv1d" else 2)


def convolution(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


def rewrite_conv(rw: Rewriter, node: Any, op: str, out: Any) -> None:
    """A depthwise conv's ``groups`` follows its channels."""
    groups_at = 8 if op == "convolution" else 6
    groups = node.args[groups_at] if len(node.args) > groups_at else node.kwargs.get("groups", 1)
    w = node.args[1]
    w_shape = None
    if isinstance(w, torch.fx.Node) and w.op == "get_attr":
        target = cast(str, w.target)  # a get_attr node's target is the attribute's name
        w_shape = rw.shapes.get(rw.aliases.get(target, target))
    if groups == 1 or w_shape is None or w_shape[1] != 1:
        return
    x = rw.labels[node.args[0].name]
    spatial = len(w_shape) - 2
    new_groups = rw.new_shape(x, node)[x.dim() - spatial - 1]
    args = list(node.args)
    defaults = [None, None, None, [1] * spatial, [0] * spatial, [1] * spatial]
    while len(args) <= groups_at:
        args.append(defaults[len(args)] if len(args) < len(defaults) else None)
    args[groups_at] = new_groups
    node.args = tuple(args)
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "groups"}


def resize_conv(m: Any, name: str) -> None:
    out, per_group = (int(s) for s in m.weight.shape[:2])
    if m.groups > 1 and m.in_channels == m.groups:
        # Depthwise (one input channel per group, a channel multiplier of out / in): the
        # groups follow the channels, the multiplier stays.
        multiplier = m.out_channels // m.groups
        if out % multiplier:
            raise CompactError(
                f"The depthwise conv {where(name)} keeps {out} output channels, not a multiple "
                f"of its channel multiplier {multiplier}. {GRAPH_ROUTE}."
            )
        m.groups = out // multiplier
        m.in_channels = m.groups
    else:
        # Grouped (or plain): the same channels go in every group, so the groups stay.
        if out % m.groups:
            raise CompactError(
                f"The grouped conv {where(name)} keeps {out} output channels, not a multiple of "
                f"its {m.groups} groups. {GRAPH_ROUTE}."
            )
        m.in_channels = per_group * m.groups
    m.out_channels = out


CONV = register(
    Op(
        ("conv1d", "conv2d"),
        conv,
        rewrite_conv,
        {nn.Conv1d: resize_conv, nn.Conv2d: resize_conv, nn.Conv3d: resize_conv},
    )
)
CONVOLUTION = register(Op(("convolution",), convolution, rewrite_conv))
TRANSPOSED = register(
    Op(
        ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
        unsupported("transposed convolutions are not supported yet"),
    )
)
CONV3D = register(Op(("conv3d",), unsupported("3-d convolutions are not supported yet")))


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


def pool(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


POOL = register(Op(tuple(_SPATIAL), pool))
