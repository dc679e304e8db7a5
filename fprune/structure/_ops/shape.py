"""Shape ops: they run on the labels as they run on values, so reshapes into heads,
concatenation offsets, splits and flattens need no special case; ops that make new tensors, move
entries along dims without channels (roll, pad, index), or carry no channel at all.

A parameter read through an op of :data:`PASS_PARAMETER` stays a
:class:`~fprune.structure._labels.ParamRef` (with its axes permuted), so that a layer reading
``w.t()`` still sees which of its dims is which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from fprune.structure._labels import ParamRef, varies
from fprune.structure._ops._base import Op, Rewriter, names, register

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation

__all__ = ["PASS_PARAMETER", "pass_parameter"]


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


def silent(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    """Assertions and metadata: no value, no channel."""
    return None


SILENT = register(
    Op(
        names(
            """
            _assert_tensor_metadata _assert_scalar sym_size sym_numel sym_stride
            sym_constrain_range_for_size _assert_async
            """
        ),
        silent,
    )
)


# ---------------------------------------------------------------------------------------------
# Shape ops, and the rewrites of those holding channel sizes as literals.


def shape_op(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    args = [a.label(x, node.name, op) for x in args]
    args = [[a.label(x) for x in arg] if isinstance(arg, list) else arg for arg in args]
    if op in ("view", "_unsafe_view") and isinstance(args[0], torch.Tensor):
        # A label may be expanded or transposed where the value is contiguous: same entries.
        return args[0].reshape(*args[1:], **kwargs)
    return cast(Callable[..., Any], node.target)(*args, **kwargs)  # a call_function node's target


def _rewrite_view(rw: Rewriter, node: Any, op: str, out: Any) -> None:
    if not isinstance(out, torch.Tensor):
        return
    shape = rw.new_shape(out, node)
    sizes = list(node.args[1])
    new = [rw.size(node, s, out.shape[i], shape[i]) for i, s in enumerate(sizes)]
    if new != sizes:
        node.args = (node.args[0], new) + tuple(node.args[2:])


def _rewrite_unflatten(rw: Rewriter, node: Any, op: str, out: Any) -> None:
    # unflatten(x, dim, sizes): nn.MultiheadAttention's packed q/k/v, (..., 3 * E) -> (..., 3, E)
    if not isinstance(out, torch.Tensor):
        return
    shape = rw.new_shape(out, node)
    sizes = list(node.args[2])
    d = node.args[1] % (len(shape) - len(sizes) + 1)
    new = [rw.size(node, s, out.shape[d + i], shape[d + i]) for i, s in enumerate(sizes)]
    if new != sizes:
        node.args = (node.args[0], node.args[1], new) + tuple(node.args[3:])


def _rewrite_split(rw: Rewriter, node: Any, op: str, out: Any) -> None:
    if not isinstance(out, (list, tuple)):
        return
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    pieces = [rw.new_shape(x, node) for x in out]
    dim = dim % len(pieces[0])
    sizes = [p[dim] for p in pieces]
    old = [int(x.shape[dim]) for x in out]
    if sizes != old:
        node.target = torch.ops.aten.split_with_sizes.default
        node.args = (node.args[0], sizes, dim)
        node.kwargs = {}


def _rewrite_slice(rw: Rewriter, node: Any, op: str, out: Any) -> None:
    """Bounds over a dim that loses entries move to the kept positions."""
    if not isinstance(node.args[0], torch.fx.Node):
        return
    x = rw.labels.get(node.args[0].name)
    if not isinstance(x, torch.Tensor):
        return
    dim = node.args[1] % x.dim() if len(node.args) > 1 else 0
    along = rw.kept_along(x, node)[dim]
    if bool(along.all()):
        return
    before = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(along.long(), 0)])
    size = x.shape[dim]

    def clip(v: int) -> int:
        return int(before[max(0, min(size, v if v >= 0 else v + size))])

    args = list(node.args)
    if op == "select":
        args[2] = clip(args[2])
    elif op == "narrow":
        start = args[2]
        args[2], args[3] = clip(start), clip(start + args[3]) - clip(start)
    else:
        while len(args) < 4:
            args.append(None)
        start = 0 if args[2] is None else args[2]
        end = size if args[3] is None else args[3]
        args[2], args[3] = clip(start), clip(end)
        if len(args) > 4 and args[4] not in (None, 1):
            raise ValueError(f"compact cannot rewrite a strided slice over channels (node {node.name}).")
    node.args = tuple(args)


VIEW = register(Op(("view", "reshape", "_unsafe_view", "expand"), shape_op, _rewrite_view))
UNFLATTEN = register(Op(("unflatten",), shape_op, _rewrite_unflatten))
SPLIT = register(Op(("split", "split_with_sizes", "chunk"), shape_op, _rewrite_split))
SLICE = register(Op(("slice", "narrow", "select"), shape_op, _rewrite_slice))
SHAPE = register(
    Op(
        names(
            """
            permute transpose t unsqueeze squeeze flatten unbind clone alias contiguous cat
            stack movedim view_as reshape_as expand_as detach lift_fresh_copy repeat
            repeat_interleave squeeze_ unsqueeze_ swapaxes transpose_ numpy_T
            """
        ),
        shape_op,
    )
)


# ---------------------------------------------------------------------------------------------
# New tensors: their entries carry no channel (their sizes are literals; a tensor of channel
# size that meets channels is caught where it meets them, see ``binary``).


def created(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
    return a.empty_like_val(a.val(node))


CREATED = register(
    Op(
        names(
            """
            new_zeros new_ones new_full new_empty zeros ones full empty arange scalar_tensor eye
            linspace
            """
        ),
        created,
    )
)


# ---------------------------------------------------------------------------------------------
# Ops that move entries along dims that carry no channel (windows shifted and padded in space,
# a table of positions gathered by an index): each entry keeps its channel.


def _carrying(x: torch.Tensor, dims: Any) -> list[int]:
    return [d for d in dims if varies(x, d)]


def roll(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


def pad(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


def index(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
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


ROLL = register(Op(("roll", "flip"), roll))
PAD = register(Op(("pad", "constant_pad_nd"), pad))
INDEX = register(Op(("index",), index))
