"""Attention: eager ``matmul`` attention (activation @ activation) and
``scaled_dot_product_attention``; a head is one channel. The attention layers of torch and
transformers resize here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fprune.structure._labels import ParamRef, varies
from fprune.structure._ops._base import GRAPH_ROUTE, Op, register, where, whole_heads
from fprune.structure._ops.dense import dense
from fprune.structure._types import CompactError

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation


def matmul(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """A weight (``x @ W``) is a dense layer; activation @ activation is eager attention."""
    if op == "matmul" and isinstance(args[1], ParamRef) and len(args[1].shape) == 2:
        return dense(a, node, op, args[0], args[1], None, in_axis=0, out_axis=1)
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


MATMUL = register(Op(("matmul", "bmm"), matmul))


def attention(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """Whole heads: the atoms of head h in q, k and v are one channel. With ``enable_gqa``
    (grouped-query attention) query head h reads key/value head ``h // groups``: a channel is a
    whole key/value group."""
    q, k, v = (a.label(x, node.name, op) for x in args[:3])
    val = a.val(node)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return a.unknown(node, op, args, kwargs)
    groups = q.shape[1] // k.shape[1] if kwargs.get("enable_gqa") and q.shape[1] % k.shape[1] == 0 else 1
    if k.shape[1] * groups != q.shape[1]:
        return a.unknown(
            node,
            op,
            args,
            kwargs,
            f"attention with {k.shape[1]} key/value heads for {q.shape[1]} query heads (node {node.name})",
        )
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
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


def resize_multihead_attention(m: Any, name: str) -> None:
    if m.in_proj_weight is not None:
        inner, embed = int(m.in_proj_weight.shape[0]) // 3, int(m.in_proj_weight.shape[1])
        kdim = vdim = embed
    else:
        inner, embed = (int(s) for s in m.q_proj_weight.shape)
        kdim, vdim = int(m.k_proj_weight.shape[1]), int(m.v_proj_weight.shape[1])
    if inner % m.head_dim:
        raise CompactError(
            f"nn.MultiheadAttention {where(name)} keeps an inner width of {inner}, not a whole "
            f"number of its {m.head_dim}-wide heads. {GRAPH_ROUTE}."
        )
    heads = inner // m.head_dim
    if inner != embed:
        raise CompactError(
            f"nn.MultiheadAttention {where(name)} would keep {heads} of its {m.num_heads} heads, "
            f"but its forward (torch.nn.functional.multi_head_attention_forward) computes the "
            f"head size as embed_dim // num_heads and reshapes the heads' output to embed_dim "
            f"({embed}), so it cannot run with fewer heads than embed_dim / head_dim. Keep its "
            f"heads (group_structured(..., where=lambda name, g: g.kind != 'head')), or use "
            f"the graph route: {GRAPH_ROUTE}."
        )
    m.embed_dim, m.kdim, m.vdim, m.num_heads, m.head_dim = embed, kdim, vdim, heads, inner // heads


def resize_gpt2_attention(m: Any, name: str) -> None:
    # GPT-2 splits c_attn's output by split_size (q, k, v) and reshapes by head_dim; the
    # head size stays, so heads are removed by narrowing split_size. Its config cannot say
    # so (GPT2Config derives the head size from n_embd // n_head).
    qkv = int(m.c_attn.weight.shape[1])
    m.split_size = qkv // (2 if m.is_cross_attention else 3)
    m.num_heads = whole_heads(m.split_size, m.head_dim, "GPT2Attention", name)
    m.embed_dim = int(m.c_proj.weight.shape[1])


def resize_bert_attention(m: Any, name: str) -> None:
    # BertConfig derives the head size from hidden_size / num_attention_heads: fewer heads
    # cannot be described by it.
    m.all_head_size = int(m.query.weight.shape[0])
    m.num_attention_heads = whole_heads(m.all_head_size, m.attention_head_size, type(m).__name__, name)


def resize_llama_attention(m: Any, name: str) -> dict[str, Any]:
    heads = whole_heads(int(m.q_proj.weight.shape[0]), m.head_dim, "LlamaAttention", name)
    kv_heads = whole_heads(int(m.k_proj.weight.shape[0]), m.head_dim, "LlamaAttention", name)
    if heads != kv_heads * m.num_key_value_groups:
        raise CompactError(
            f"LlamaAttention {where(name)} keeps {heads} query heads and {kv_heads} key/value "
            f"heads, which its num_key_value_groups ({m.num_key_value_groups}) does not match. "
            f"{GRAPH_ROUTE}."
        )
    # LlamaConfig takes head_dim explicitly, so fewer heads of the same size round-trip.
    return {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": m.head_dim}


#: The layers that hold a head count: torch's ``nn.MultiheadAttention`` and transformers'
#: attention blocks (eager ones run ``matmul``; their resizers live here all the same).
ATTENTION = register(
    Op(
        ("scaled_dot_product_attention",),
        attention,
        layers={
            nn.MultiheadAttention: resize_multihead_attention,
            "transformers.models.gpt2.modeling_gpt2.GPT2Attention": resize_gpt2_attention,
            "transformers.models.bert.modeling_bert.BertSelfAttention": resize_bert_attention,
            "transformers.models.bert.modeling_bert.BertCrossAttention": resize_bert_attention,
            "transformers.models.llama.modeling_llama.LlamaAttention": resize_llama_attention,
        },
    )
)
