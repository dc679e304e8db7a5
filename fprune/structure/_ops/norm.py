"""Normalization layers: a per-channel affine (and running statistics); statistics over
channels (LayerNorm, RMSNorm) make them inexact. GroupNorm and InstanceNorm are not supported
(no rule maps their channels: GroupNorm normalizes each group of channels together), so the
groups through them are unprunable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fprune.structure._labels import ParamRef
from fprune.structure._ops._base import Op, Rewriter, register, unsupported

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation


def _affine(
    a: Propagation, node: torch.fx.Node, op: str, x: torch.Tensor, channel: int, params: list
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


def batch_norm(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    return _affine(a, node, op, x, 1 if x.dim() > 1 else 0, list(args[1:5]))


def batch_norm_no_training(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, "batch_norm")
    out = _affine(a, node, "batch_norm", x, 1, list(args[1:5]))
    return (out,) + tuple(a.empty_like_val(v) for v in a.val(node)[1:])


def resize_batch_norm(m: Any, name: str) -> None:
    # BatchNorm1d/2d/3d, SyncBatchNorm, InstanceNorm: num_features from the affine weight or
    # the running statistics (whichever it has).
    source = m.weight if m.weight is not None else m.running_mean
    if source is not None:
        m.num_features = int(source.shape[0])


BATCH_NORM = register(
    Op(("batch_norm",), batch_norm, layers={nn.modules.batchnorm._NormBase: resize_batch_norm})
)
BATCH_NORM_EVAL = register(Op(("_native_batch_norm_legit_no_training",), batch_norm_no_training))


def layer_norm(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    if len(args[1]) != 1:
        return a.unknown(node, op, args, kwargs, f"layer_norm over several dims (node {node.name})")
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    b = args[3] if len(args) > 3 else kwargs.get("bias")
    a.mark_inexact_along(x, x.dim() - 1, f"LayerNorm statistics (node {node.name})")
    return _affine(a, node, op, x, x.dim() - 1, [w, b])


def rms_norm(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    x = a.label(args[0], node.name, op)
    if len(args[1]) != 1:
        return a.unknown(node, op, args, kwargs)
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    a.mark_inexact_along(x, x.dim() - 1, f"RMSNorm statistics (node {node.name})")
    return _affine(a, node, op, x, x.dim() - 1, [w])


def rewrite_norm(rw: Rewriter, node: Any, op: str, out: Any) -> None:
    """The normalized shape: the trailing dims of the new output shape."""
    if not isinstance(out, torch.Tensor):
        return
    shape = rw.new_shape(out, node)
    new = shape[len(shape) - len(node.args[1]) :]
    if list(node.args[1]) != new:
        node.args = (node.args[0], new) + tuple(node.args[2:])


def resize_layer_norm(m: Any, name: str) -> None:
    if m.weight is not None:
        m.normalized_shape = tuple(int(s) for s in m.weight.shape)


LAYER_NORM = register(Op(("layer_norm",), layer_norm, rewrite_norm, {nn.LayerNorm: resize_layer_norm}))
RMS_NORM = register(Op(("rms_norm",), rms_norm, rewrite_norm, {nn.RMSNorm: resize_layer_norm}))
GROUP_NORM = register(Op(("group_norm",), unsupported("GroupNorm is not supported yet")))
INSTANCE_NORM = register(Op(("instance_norm",), unsupported("InstanceNorm is not supported yet")))
