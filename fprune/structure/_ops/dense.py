"""Dense layers: linear (and addmm / mm, transformers' ``Conv1D``), embeddings; recurrent
layers are not supported (their weights hold the gates of several channels in one tensor, which
no rule splits), so the groups through them are unprunable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fprune.structure._labels import ParamRef, varies
from fprune.structure._ops._base import Op, register, unsupported

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation


__all__ = ["dense", "pin_constant_inputs"]


def pin_constant_inputs(
    a: Propagation, node: torch.fx.Node, op: str, x_ch: torch.Tensor, reads: torch.Tensor
) -> None:
    """Pin ``reads[j]`` (weight slices) where input channel ``x_ch[j]`` carries no channel: a
    constant or a tensor made from literal sizes, which compact cannot shrink with them."""
    free = x_ch < 0
    if bool(free.any()):
        a.pin(reads[free], f"aten.{op} reads input channels that carry none (node {node.name})")


def dense(
    a: Propagation, node: torch.fx.Node, op: str, x: Any, w: Any, b: Any, in_axis: int, out_axis: int
) -> Any:
    """``x`` (channels along its last dim) times a 2-d weight ``w``: ``w``'s ``in_axis`` reads
    ``x``'s channels, its ``out_axis`` (and the bias ``b``) are the output's."""
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
            pin_constant_inputs(a, node, op, x.movedim(-1, 0).reshape(x.shape[-1], -1).amax(dim=1), w_in)
    if b is not None:
        b_label = a.label(b, node.name, op)
        a.union(b_label.expand(val.shape) if b_label.dim() else b_label, w_out)
    return w_out.expand(tuple(val.shape))


def linear(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    return dense(a, node, op, args[0], args[1], b, in_axis=1, out_axis=0)


def resize_linear(m: Any, name: str) -> None:
    m.out_features, m.in_features = (int(s) for s in m.weight.shape)


def resize_gpt2_mlp(m: Any, name: str) -> dict[str, Any]:
    return {"n_inner": int(m.c_fc.weight.shape[1])}


def resize_bert_intermediate(m: Any, name: str) -> dict[str, Any]:
    return {"intermediate_size": int(m.dense.weight.shape[0])}


def resize_llama_mlp(m: Any, name: str) -> dict[str, Any]:
    m.hidden_size, m.intermediate_size = int(m.gate_proj.weight.shape[1]), int(m.gate_proj.weight.shape[0])
    return {"intermediate_size": m.intermediate_size}


#: ``nn.Linear``, and the MLP blocks of transformers whose width a config field describes.
LINEAR = register(
    Op(
        ("linear",),
        linear,
        layers={
            nn.Linear: resize_linear,
            "transformers.models.gpt2.modeling_gpt2.GPT2MLP": resize_gpt2_mlp,
            "transformers.models.bert.modeling_bert.BertIntermediate": resize_bert_intermediate,
            "transformers.models.llama.modeling_llama.LlamaMLP": resize_llama_mlp,
        },
    )
)


def addmm(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return dense(a, node, op, args[1], args[2], args[0], in_axis=0, out_axis=1)


def resize_hf_conv1d(m: Any, name: str) -> None:
    m.nx, m.nf = (int(s) for s in m.weight.shape)  # Conv1D's weight is (in, out)


ADDMM = register(Op(("addmm",), addmm, layers={"transformers.pytorch_utils.Conv1D": resize_hf_conv1d}))


def mm(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return dense(a, node, op, args[0], args[1], None, in_axis=0, out_axis=1)


MM = register(Op(("mm",), mm))


def embedding(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    w, ids = args[0], args[1]
    val = a.val(node)
    if not isinstance(w, ParamRef) or len(w.shape) != 2:
        return a.unknown(node, op, args, kwargs)
    a.pin(a.atoms_of(w.name, w.perm[0]), f"embedding rows are indexed by input ids (node {node.name})")
    ids = a.label(ids)
    if isinstance(ids, torch.Tensor) and bool((ids >= 0).any()):
        a.pin(ids, f"embedding indices with channels (node {node.name})")
    return a.atoms_of(w.name, w.perm[1]).expand(tuple(val.shape))


def resize_embedding(m: Any, name: str) -> None:
    m.num_embeddings, m.embedding_dim = (int(s) for s in m.weight.shape)


EMBEDDING = register(Op(("embedding",), embedding, layers={nn.Embedding: resize_embedding}))


RECURRENT = register(
    Op(
        ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell"),
        unsupported("recurrent layers are not supported yet"),
    )
)
