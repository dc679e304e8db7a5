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

Supported (first scope): conv nets (conv1d/conv2d with groups, depthwise, BatchNorm with its
running statistics, residual adds, concatenation, pooling, flatten, linear), MLPs, and
transformers such as Hugging Face GPT-2 and BERT (linear and ``Conv1D`` layers, LayerNorm,
embeddings and tied weights, whole attention heads through ``scaled_dot_product_attention`` or
eager ``matmul`` attention). Left for later, unprunable with a reason: grouped-query attention,
per-dim head pruning (RoPE), RNNs, transposed and 3-D convs, GroupNorm.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from fprune import _amount, _select, _tree
from fprune.apply import apply_masks
from fprune.select import Global, LayerCollapseWarning, select

__all__ = ["Member", "Group", "Structure", "groups", "group_structured", "compact_params", "compact"]


@dataclasses.dataclass(frozen=True, eq=False)
class Member:
    """One parameter dim of a group: channel ``c`` is the slices ``index[c]`` along ``dim``.

    ``index`` is a ``LongTensor`` of shape ``(group.size, k)``: ``k`` positions per channel (1 for
    a plain channel; more for a whole attention head, or a channel that a grouped conv repeats in
    every group).
    """

    param: str
    dim: int
    index: torch.Tensor

    @property
    def per_channel(self) -> int:
        return int(self.index.shape[1])

    def key(self) -> tuple:
        return (self.param, self.dim, tuple(self.index.reshape(-1).tolist()), self.per_channel)


@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    """Channels that are pruned together: every member's slices of channel ``c`` go at once.

    Attributes:
        name: ``"param:dim"`` of its first member, unique within a :class:`Structure`.
        size: the number of channels.
        members: the parameter (and buffer) dims it covers, in the model's parameter order.
        prunable: False when a channel reaches a model input or output, or an op with no rule.
        reason: why it is not prunable (None when it is).
        exact: True when removing channels (:func:`fprune.compact`) gives the same outputs as
            masking them (:func:`fprune.masked_call`). False, say, for a residual stream that a
            LayerNorm normalizes: its statistics change.
        inexact_reason: why it is not exact (None when it is).
        kind: ``"channel"``, or ``"head"`` when a channel is a whole attention head.
    """

    name: str
    size: int
    members: Tuple[Member, ...]
    prunable: bool
    reason: Optional[str]
    exact: bool
    inexact_reason: Optional[str]
    kind: str

    def key(self) -> tuple:
        return (self.name, self.size, self.prunable, self.exact, self.kind,
                tuple(m.key() for m in self.members))


@dataclasses.dataclass(frozen=True, eq=False)
class Structure:
    """The dependency groups of a model, from :func:`groups`. Frozen, picklable, no module inside.

    Attributes:
        groups: every group, in the model's parameter order.
        aliases: ``(alias, name)`` pairs for tied parameters: ``alias`` is the same tensor as
            ``name`` (the name ``dict(module.named_parameters())`` keeps). Members use ``name``.
        shapes: ``(name, shape)`` of every parameter and buffer the analysis saw.
    """

    groups: Tuple[Group, ...]
    aliases: Tuple[Tuple[str, str], ...]
    shapes: Tuple[Tuple[str, Tuple[int, ...]], ...]

    def canonical(self, name: str) -> str:
        """The member name of parameter ``name`` (``name`` itself unless it is a tied alias)."""
        return dict(self.aliases).get(name, name)

    def group(self, name: str) -> Group:
        """The group called ``name``."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"No group named {name!r}; groups are {[g.name for g in self.groups]}.")

    def key(self) -> tuple:
        return (tuple(g.key() for g in self.groups), self.aliases, self.shapes)

    def explain(self) -> str:
        """A readable listing: one paragraph per group, its members and flags.

        Example:
            >>> import torch, fprune
            >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
            >>> print(fprune.structure.groups(net, (torch.randn(2, 3),)).explain())  # doctest: +NORMALIZE_WHITESPACE
            group 0.weight:0: 4 channels, prunable, exact
                0.weight dim 0 (1 per channel)
                0.bias dim 0 (1 per channel)
                2.weight dim 1 (1 per channel)
            group 0.weight:1: 3 channels, not prunable (model input 'input'), exact
                0.weight dim 1 (1 per channel)
            group 2.weight:0: 2 channels, not prunable (model output), exact
                2.weight dim 0 (1 per channel)
                2.bias dim 0 (1 per channel)
        """
        lines = []
        for g in self.groups:
            flags = ["prunable" if g.prunable else f"not prunable ({g.reason})"]
            flags.append("exact" if g.exact else f"inexact ({g.inexact_reason})")
            unit = "heads" if g.kind == "head" else "channels"
            lines.append(f"group {g.name}: {g.size} {unit}, " + ", ".join(flags))
            for m in g.members:
                lines.append(f"    {m.param} dim {m.dim} ({m.per_channel} per channel)")
        if self.aliases:
            lines.append("tied: " + ", ".join(f"{a} = {n}" for a, n in self.aliases))
        return "\n".join(lines)

    def __repr__(self) -> str:
        free = sum(g.prunable for g in self.groups)
        return f"Structure({len(self.groups)} groups, {free} prunable)"


def groups(
    module: torch.nn.Module,
    args: Any = (),
    kwargs: Optional[dict] = None,
    *,
    dynamic_shapes: Any = None,
) -> Structure:
    """Trace ``module`` once with ``torch.export`` and return its dependency groups.

    The module is exported in eval mode (its training flag is restored afterwards) on the example
    inputs ``args`` / ``kwargs``; use small inputs with batch (and sequence) sizes of at least 2.
    Hugging Face models need ``use_cache=False`` (their cache object is not an exportable output).

    Args:
        module: the model.
        args: a tuple of example positional inputs.
        kwargs: example keyword inputs.
        dynamic_shapes: passed to ``torch.export.export``.

    Returns:
        A :class:`Structure`.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``, ``args`` not a tuple.
        RuntimeError: ``torch.export`` failed on the model (its error is chained).

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
        ...                           torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
        >>> s = fprune.structure.groups(net, (torch.randn(2, 3, 8, 8),))
        >>> g = s.groups[0]
        >>> g.name, g.size, g.prunable, [(m.param, m.dim) for m in g.members]
        ('0.weight:0', 8, True, [('0.weight', 0), ('0.bias', 0), ('1.weight', 0), ('1.bias', 0), ('3.weight', 1), ('1.running_mean', 0), ('1.running_var', 0)])
    """
    return _analyse(module, args, kwargs, dynamic_shapes)[0]


# ----------------------------------------------------------------------------------------------
# Export and analysis


def _check_call(module: Any, args: Any, kwargs: Any) -> Tuple[tuple, dict]:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(args, tuple):
        raise TypeError(
            f"Expected args to be a tuple of example inputs, got {type(args).__name__}; "
            f"wrap a single input as (x,)."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"Expected kwargs to be None or a dict, got {type(kwargs).__name__}.")
    return args, dict(kwargs or {})


def _export(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any):
    was_training = module.training
    module.eval()
    try:
        return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # export errors come in many types; say where they come from
        raise RuntimeError(
            f"torch.export could not trace {type(module).__name__}: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}. fprune.structure needs an "
            f"exportable model (Hugging Face models: pass use_cache=False)."
        ) from error
    finally:
        module.train(was_training)


def _aliases(module: torch.nn.Module) -> Dict[str, str]:
    """Every parameter/buffer name -> the first name of the same tensor (what dedup keeps)."""
    first: Dict[int, str] = {}
    names: Dict[str, str] = {}
    for named in (module.named_parameters(remove_duplicate=False),
                  module.named_buffers(remove_duplicate=False)):
        for name, t in named:
            names[name] = first.setdefault(id(t), name)
    return names


def _analyse(module, args, kwargs, dynamic_shapes):
    args, kwargs = _check_call(module, args, kwargs)
    ep = _export(module, args, kwargs, dynamic_shapes)
    analysis = _Analysis(ep, _aliases(module))
    analysis.run()
    return analysis.structure(), analysis, ep


_PAIR = 1 << 31  # atom ids stay below this (encoding pairs of atoms in one int64)


class _ParamRef:
    """A parameter (or buffer) seen through ``perm``: axis ``i`` of this value is dim ``perm[i]``."""

    __slots__ = ("name", "perm", "shape")

    def __init__(self, name: str, perm: Tuple[int, ...], shape: Tuple[int, ...]):
        self.name, self.perm, self.shape = name, perm, shape


# Ops that run on the label tensors as they run on values.
_SHAPE_OPS = {
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "unsqueeze", "squeeze",
    "flatten", "expand", "slice", "select", "split", "split_with_sizes", "chunk", "unbind",
    "clone", "alias", "contiguous", "cat", "stack", "unflatten", "movedim", "narrow",
    "view_as", "reshape_as", "expand_as", "detach", "lift_fresh_copy", "repeat",
    "repeat_interleave", "squeeze_", "unsqueeze_", "swapaxes", "transpose_", "numpy_T",
}
# Ops that pass a ParamRef through (with its axes permuted).
_REF_OPS = {"alias", "detach", "clone", "contiguous", "to", "_to_copy", "lift_fresh_copy",
            "transpose", "t", "permute", "type_as"}
_IDENTITY_OPS = {
    "to", "_to_copy", "type_as", "dropout", "native_dropout", "feature_dropout", "alpha_dropout",
    "relu", "relu_", "gelu", "gelu_", "tanh", "sigmoid", "silu", "silu_", "hardtanh", "hardtanh_",
    "hardswish", "hardsigmoid", "relu6", "leaky_relu", "elu", "selu", "celu", "mish", "softplus",
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "pow", "erf", "sin", "cos", "reciprocal", "clamp",
    "clamp_min", "clamp_max", "square", "sign", "log1p", "expm1", "logit", "fill",
    "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
}
_BINARY_OPS = {
    "add", "sub", "mul", "div", "where", "maximum", "minimum", "masked_fill", "rsub",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "__and__", "__or__",
    "bitwise_and", "bitwise_or", "floor_divide", "remainder", "fmod", "atan2", "copysign",
    "add_", "mul_", "sub_", "div_",
}
_REDUCE_OPS = {"mean", "sum", "amax", "amin", "var", "std", "logsumexp", "prod", "norm",
               "linalg_vector_norm"}
_SOFTMAX_OPS = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_POOL_OPS = {
    "max_pool1d": 1, "max_pool2d": 2, "avg_pool1d": 1, "avg_pool2d": 2,
    "adaptive_avg_pool1d": 1, "adaptive_avg_pool2d": 2, "adaptive_max_pool1d": 1,
    "adaptive_max_pool2d": 2, "max_pool2d_with_indices": 2, "upsample_nearest2d": 2,
    "upsample_bilinear2d": 2, "_adaptive_avg_pool2d": 2, "reflection_pad2d": 2,
    "replication_pad2d": 2, "upsample_nearest1d": 1, "lp_pool2d": 2,
}
# Ops left for later: their channels are unprunable with this reason.
_LATER = {
    **{f"conv_transpose{d}": "transposed convolutions are not supported yet" for d in ("1d", "2d", "3d")},
    "conv3d": "3-d convolutions are not supported yet",
    **{op: "recurrent layers are not supported yet" for op in ("lstm", "gru", "rnn_tanh", "rnn_relu",
                                                                 "lstm_cell", "gru_cell")},
    "group_norm": "GroupNorm is not supported yet",
    "instance_norm": "InstanceNorm is not supported yet",
}
# Ops whose output carries no channel (assertions, metadata, factories).
_SILENT_OPS = {"_assert_tensor_metadata", "_assert_scalar", "sym_size", "sym_numel",
               "sym_stride", "sym_constrain_range_for_size", "_assert_async"}


class _Analysis:
    """Channel-atom propagation over an ExportedProgram (see the module docstring)."""

    def __init__(self, ep, aliases: Dict[str, str]):
        self.ep = ep
        self.aliases = aliases
        sig = ep.graph_signature
        self.names: Dict[str, str] = {}
        for placeholder, fqn in {**sig.inputs_to_parameters, **sig.inputs_to_buffers}.items():
            self.names[placeholder] = aliases.get(fqn, fqn)
        self.user_inputs = set(sig.user_inputs)
        self.count = 0  # atoms made so far
        self.edges: List[torch.Tensor] = []  # (2, n) pairs of atoms to merge
        self.pins: List[Tuple[torch.Tensor, str]] = []
        self.inexact: List[Tuple[torch.Tensor, str]] = []
        self.heads: List[torch.Tensor] = []
        self.param_atoms: Dict[Tuple[str, int], torch.Tensor] = {}
        self.shapes: Dict[str, Tuple[int, ...]] = {}
        self.order: List[str] = []  # parameter / buffer names in graph order
        self.labels: Dict[str, Any] = {}  # node name -> label value
        self.roots: Optional[torch.Tensor] = None
        self.vals: Dict[str, Any] = {}

    # -- atoms ------------------------------------------------------------------------------
    def new(self, shape) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= int(s)
        atoms = torch.arange(self.count, self.count + n, dtype=torch.int64).reshape(tuple(shape))
        self.count += n
        return atoms

    def atoms_of(self, name: str, dim: int) -> torch.Tensor:
        key = (name, dim)
        if key not in self.param_atoms:
            self.param_atoms[key] = self.new((self.shapes[name][dim],))
        return self.param_atoms[key]

    def union(self, a: torch.Tensor, b: torch.Tensor) -> None:
        a, b = torch.broadcast_tensors(a, b)
        a, b = a.reshape(-1), b.reshape(-1)
        keep = (a >= 0) & (b >= 0) & (a != b)
        if bool(keep.any()):
            a, b = a[keep], b[keep]
            if a.numel() > 64:  # shapes repeat atoms along batch and space: keep each pair once
                pairs = torch.unique(torch.minimum(a, b) * _PAIR + torch.maximum(a, b))
                a, b = pairs // _PAIR, pairs % _PAIR
            self.edges.append(torch.stack([a, b]))

    def union_all(self, atoms: torch.Tensor) -> None:
        """Merge every atom in ``atoms``."""
        flat = atoms.reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel() > 1:
            flat = torch.unique(flat)
            self.union(flat[:1].expand(flat.numel() - 1), flat[1:])

    def pin(self, atoms: torch.Tensor, reason: str) -> None:
        flat = atoms.reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel():
            self.pins.append((torch.unique(flat), reason))

    def mark_inexact(self, atoms: torch.Tensor, reason: str) -> None:
        flat = atoms.reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel():
            self.inexact.append((torch.unique(flat), reason))

    # -- values -----------------------------------------------------------------------------
    def val(self, node) -> Any:
        """The node's example value with concrete sizes (symbolic ones at their example value)."""
        if node.name not in self.vals:
            self.vals[node.name] = _concrete(node.meta.get("val"))
        return self.vals[node.name]

    def label(self, value: Any, node_name: str = "", op: str = "") -> Any:
        """A label tensor for a ParamRef used as a plain tensor, otherwise the value itself."""
        if not isinstance(value, _ParamRef):
            return value
        shape = value.shape
        big = [i for i, s in enumerate(shape) if s > 1]
        if len(big) <= 1:
            if not big:
                return torch.full(shape, -1, dtype=torch.int64)
            axis = big[0]
            atoms = self.atoms_of(value.name, value.perm[axis])
            view = [1] * len(shape)
            view[axis] = shape[axis]
            return atoms.view(view).expand(shape)
        # A parameter with several channel dims used as a whole tensor: no rule maps its
        # elements to channels, so they are fresh atoms, and nothing they touch is prunable.
        atoms = self.new(shape)
        reason = f"parameter {value.name} used whole by {op} (node {node_name})"
        self.pin(atoms, reason)
        for dim in range(len(shape)):
            self.pin(self.atoms_of(value.name, dim), reason)
        return atoms

    def pin_value(self, value: Any, reason: str) -> None:
        if isinstance(value, _ParamRef):
            for dim in value.perm:
                if value.shape[value.perm.index(dim)] > 1:
                    self.pin(self.atoms_of(value.name, dim), reason)
        elif isinstance(value, torch.Tensor):
            self.pin(value, reason)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.pin_value(v, reason)

    # -- the pass ---------------------------------------------------------------------------
    def run(self) -> None:
        graph = self.ep.graph
        for node in graph.nodes:
            if node.op == "placeholder":
                self.labels[node.name] = self.placeholder(node)
            elif node.op == "call_function":
                self.labels[node.name] = self.call(node)
            elif node.op == "output":
                outs = node.args[0]
                for out in (outs if isinstance(outs, (list, tuple)) else [outs]):
                    if isinstance(out, torch.fx.Node):
                        self.pin_value(self.labels.get(out.name), "model output")
            elif node.op == "get_attr":
                self.labels[node.name] = None
        self.roots = self.components()

    def placeholder(self, node) -> Any:
        val = self.val(node)
        if node.name in self.names:
            name = self.names[node.name]
            if name not in self.shapes:
                self.shapes[name] = tuple(int(s) for s in val.shape)
                self.order.append(name)
            if not (val.is_floating_point() or val.is_complex()):
                # Integer and bool buffers hold indices or flags (BERT's position_ids), not channels.
                return torch.full(tuple(val.shape), -1, dtype=torch.int64)
            return _ParamRef(name, tuple(range(val.dim())), tuple(int(s) for s in val.shape))
        if isinstance(val, torch.Tensor):
            if val.is_floating_point() or val.is_complex():
                atoms = self.new(tuple(int(s) for s in val.shape))
                self.pin(atoms, f"model input {node.name!r}")
                return atoms
            return torch.full(tuple(int(s) for s in val.shape), -1, dtype=torch.int64)
        return val

    def arg(self, a: Any) -> Any:
        """A node argument with nodes replaced by their labels (tensors) or values (scalars)."""
        if isinstance(a, torch.fx.Node):
            if a.name in self.labels and self.labels[a.name] is not None:
                return self.labels[a.name]
            val = self.val(a)
            if isinstance(val, torch.Tensor):
                return torch.full(tuple(val.shape), -1, dtype=torch.int64)
            return val
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        return a

    def call(self, node) -> Any:
        target = node.target
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        if target is operator.getitem:
            return args[0][args[1]]
        op = getattr(getattr(target, "overloadpacket", None), "__name__", None)
        if op is None:
            op = getattr(target, "__name__", str(target))
        val = self.val(node)
        rule = getattr(self, "op_" + op, None)
        if op in _SILENT_OPS:
            return None
        if rule is not None:
            return rule(node, args, kwargs)
        if op in _REF_OPS and isinstance(args[0], _ParamRef):
            return self.ref_op(node, op, args)
        if op in _SHAPE_OPS:
            args = [self.label(a, node.name, op) for a in args]
            args = [[self.label(x) for x in a] if isinstance(a, list) else a for a in args]
            return target(*args, **kwargs)
        if op in _IDENTITY_OPS:
            return self.like_output(self.label(args[0], node.name, op), val)
        if op in _BINARY_OPS:
            return self.binary(node, op, args, kwargs)
        if op in _REDUCE_OPS:
            return self.reduce(node, op, args, kwargs)
        if op in _SOFTMAX_OPS:
            return self.softmax(node, op, args)
        if op in _POOL_OPS:
            return self.pool(node, op, args, _POOL_OPS[op])
        reason = _LATER.get(op)
        return self.unknown(node, op, args, kwargs, reason and f"{reason} (aten.{op}, node {node.name})")

    # -- rules ------------------------------------------------------------------------------
    def like_output(self, label: Any, val: Any) -> Any:
        if isinstance(val, torch.Tensor) and isinstance(label, torch.Tensor):
            if tuple(label.shape) != tuple(val.shape):
                return label.expand(tuple(val.shape)) if label.dim() == val.dim() else \
                    torch.full(tuple(val.shape), -1, dtype=torch.int64)
        return label

    def empty_like_val(self, val: Any) -> Any:
        if isinstance(val, torch.Tensor):
            return torch.full(tuple(val.shape), -1, dtype=torch.int64)
        if isinstance(val, (list, tuple)):
            return type(val)(self.empty_like_val(v) for v in val)
        return val

    def fresh_like_val(self, val: Any, reason: str) -> Any:
        if isinstance(val, torch.Tensor):
            atoms = self.new(tuple(val.shape))
            self.pin(atoms, reason)
            return atoms
        if isinstance(val, (list, tuple)):
            return type(val)(self.fresh_like_val(v, reason) for v in val)
        return val

    def unknown(self, node, op: str, args, kwargs, reason: Optional[str] = None) -> Any:
        reason = reason or f"no rule for aten.{op} (node {node.name})"
        carried = False
        for a in list(args) + list(kwargs.values()):
            for leaf in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(leaf, _ParamRef):
                    carried = True
                elif isinstance(leaf, torch.Tensor) and bool((leaf >= 0).any()):
                    carried = True
                self.pin_value(leaf, reason)
        val = self.val(node)
        return self.fresh_like_val(val, reason) if carried else self.empty_like_val(val)

    def ref_op(self, node, op: str, args) -> Any:
        ref = args[0]
        perm = list(ref.perm)
        shape = list(ref.shape)
        if op in ("transpose", "swapaxes"):
            d0, d1 = args[1] % len(perm), args[2] % len(perm)
            perm[d0], perm[d1] = perm[d1], perm[d0]
        elif op == "t" and len(perm) == 2:
            perm.reverse()
        elif op == "permute":
            order = [d % len(perm) for d in args[1]]
            perm = [perm[d] for d in order]
        shape = [ref.shape[ref.perm.index(p)] for p in perm]
        return _ParamRef(ref.name, tuple(perm), tuple(shape))

    def binary(self, node, op: str, args, kwargs) -> Any:
        val = self.val(node)
        shape = tuple(val.shape)
        operands = []
        for a in args:
            if isinstance(a, (_ParamRef, torch.Tensor)):
                operands.append(self.label(a, node.name, op))
        if not operands:
            return self.empty_like_val(val)
        full = [torch.broadcast_to(o, shape) if o.dim() <= len(shape) else o for o in operands]
        # An operand broadcast along a dim on which another operand's channels vary would tie
        # all those channels to one of its own: not a channel coupling, so its atoms are pinned.
        for i, o in enumerate(operands):
            pad = len(shape) - o.dim()
            for d in range(len(shape)):
                if shape[d] > 1 and (d < pad or o.shape[d - pad] == 1):
                    if any(j != i and _varies(full[j], d) for j in range(len(full))):
                        self.pin(o, f"broadcast across channels by aten.{op} (node {node.name})")
                        full[i] = torch.full(shape, -1, dtype=torch.int64)
                        break
        out = full[0]
        for f in full[1:]:
            self.union(out, f)
            out = torch.maximum(out, f)
        return out

    def reduce(self, node, op: str, args, kwargs) -> Any:
        x = self.label(args[0], node.name, op)
        val = self.val(node)
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(x.dim()))
        if isinstance(dims, int):
            dims = [dims]
        if not all(isinstance(d, int) for d in dims):
            return self.unknown(node, op, args, kwargs)
        dims = [d % max(x.dim(), 1) for d in dims]
        keepdim = bool(args[2]) if len(args) > 2 and isinstance(args[2], bool) else \
            bool(kwargs.get("keepdim", False))
        reason = f"aten.{op} over channels (node {node.name})"
        varying = [d for d in dims if _varies(x, d)]
        if varying:
            # A statistic over channels (RMSNorm's mean of squares, a mean over features):
            # removing a channel changes it, so those channels are inexact; the statistic itself
            # belongs to no channel (merging them all would make the channels one).
            self.mark_inexact(x, reason)
            hi = x.amax(dim=dims, keepdim=keepdim)
            lo = torch.where(x >= 0, x, x.amax(dim=dims, keepdim=True)).amin(dim=dims, keepdim=keepdim)
            out = torch.where(hi == lo, hi, torch.full_like(hi, -1))
        else:
            out = x.amax(dim=dims, keepdim=keepdim) if dims and x.dim() else x
        return self.like_output(out, val)

    def softmax(self, node, op: str, args) -> Any:
        x = self.label(args[0], node.name, op)
        dim = args[1] % x.dim()
        if _varies(x, dim):  # over channels: each output keeps its channel, none is exact
            self.mark_inexact(x, f"aten.{op} over channels (node {node.name})")
        return x

    def pool(self, node, op: str, args, spatial: int) -> Any:
        x = self.label(args[0], node.name, op)
        val = self.val(node)
        channel = x.dim() - spatial - 1
        if channel < 0:
            return self.unknown(node, op, args, {})
        per_channel = self.per_channel(x, channel)
        out_val = val[0] if isinstance(val, (list, tuple)) else val
        view = [1] * out_val.dim()
        view[channel] = per_channel.shape[0]
        out = per_channel.view(view).expand(tuple(out_val.shape))
        if isinstance(val, (list, tuple)):
            return type(val)([out] + [self.empty_like_val(v) for v in val[1:]])
        return out

    def per_channel(self, x: torch.Tensor, channel: int) -> torch.Tensor:
        """One atom per index along ``channel``: the atoms of each slice, merged."""
        cols = x.movedim(channel, 0).reshape(x.shape[channel], -1)
        rep = cols.amax(dim=1)
        self.union(cols, rep[:, None])
        return rep

    def op_linear(self, node, args, kwargs) -> Any:
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        return self.dense(node, "linear", x, w, b, in_axis=1, out_axis=0)

    def op_addmm(self, node, args, kwargs) -> Any:
        b, x, w = args[0], args[1], args[2]
        return self.dense(node, "addmm", x, w, b, in_axis=0, out_axis=1)

    def op_mm(self, node, args, kwargs) -> Any:
        return self.dense(node, "mm", args[0], args[1], None, in_axis=0, out_axis=1)

    def op_matmul(self, node, args, kwargs) -> Any:
        if isinstance(args[1], _ParamRef) and len(args[1].shape) == 2:
            return self.dense(node, "matmul", args[0], args[1], None, in_axis=0, out_axis=1)
        return self.act_matmul(node, "matmul", args)

    def op_bmm(self, node, args, kwargs) -> Any:
        return self.act_matmul(node, "bmm", args)

    def dense(self, node, op, x, w, b, in_axis: int, out_axis: int) -> Any:
        val = self.val(node)
        if not isinstance(w, _ParamRef) or len(w.shape) != 2:
            return self.unknown(node, op, [x, w, b], {},
                                f"aten.{op} with a computed weight (node {node.name})")
        x = self.label(x, node.name, op)
        w_in = self.atoms_of(w.name, w.perm[in_axis])
        w_out = self.atoms_of(w.name, w.perm[out_axis])
        if (
            isinstance(x, torch.Tensor) and x.dim() > 1 and not _varies(x, x.dim() - 1)
            and any(_varies(x, d) for d in range(x.dim() - 1))
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
            self.pin(x, reason)
            self.pin(w_in, reason)
        else:
            self.union(x, w_in)  # x[..., j] with the weight's input channel j
        if b is not None:
            b_label = self.label(b, node.name, op)
            self.union(b_label.expand(val.shape) if b_label.dim() else b_label, w_out)
        return w_out.expand(tuple(val.shape))

    def act_matmul(self, node, op, args) -> Any:
        """Activation @ activation (eager attention): q @ k^T and probabilities @ v."""
        a, b = (self.label(x, node.name, op) for x in args[:2])
        val = self.val(node)
        if a.dim() < 2 or b.dim() < 2:
            return self.unknown(node, op, args, {})
        batch = tuple(val.shape[:-2])
        a = a.expand(batch + tuple(a.shape[-2:]))
        b = b.expand(batch + tuple(b.shape[-2:]))
        a_const_n, a_const_k = not _varies(a, a.dim() - 2), not _varies(a, a.dim() - 1)
        b_const_k, b_const_m = not _varies(b, b.dim() - 2), not _varies(b, b.dim() - 1)
        a_k, b_k = a[..., 0, :], b[..., :, 0]
        has = lambda t: bool((t >= 0).any())
        if has(a) and has(b) and not a_const_k and not b_const_k:
            # A contraction over channels: q[h, i] pairs with k[h, i]. Heads stay whole.
            if not (a_const_n and b_const_m):
                return self.unknown(node, op, args, {})
            self.union(a_k, b_k)
            head = self.new(batch)
            self.union(a_k, head[..., None])
            self.union(b_k, head[..., None])
            self.heads.append(head.reshape(-1))
            return head[..., None, None].expand(tuple(val.shape))
        if (not a_const_k and has(a)) or (not b_const_k and has(b)):
            return self.unknown(node, op, args, {})
        a_n, b_m = a[..., :, 0], b[..., 0, :]
        if has(a_n) and has(b_m):
            if a_const_n:
                self.union(b_m, a_n[..., :1])
                return b_m[..., None, :].expand(tuple(val.shape))
            if b_const_m:
                self.union(a_n, b_m[..., :1])
                return a_n[..., :, None].expand(tuple(val.shape))
            return self.unknown(node, op, args, {})
        if has(b_m):
            return b_m[..., None, :].expand(tuple(val.shape))
        return a_n[..., :, None].expand(tuple(val.shape))

    def op_scaled_dot_product_attention(self, node, args, kwargs) -> Any:
        q, k, v = (self.label(x, node.name, "scaled_dot_product_attention") for x in args[:3])
        val = self.val(node)
        if q.dim() != 4 or k.shape[-3] != q.shape[-3] or kwargs.get("enable_gqa"):
            return self.unknown(node, "scaled_dot_product_attention", args, kwargs,
                                f"grouped-query attention is not supported yet (node {node.name})")
        # Whole heads: the atoms of head h in q, k and v are one channel.
        for t in (q, k, v):
            if _varies(t, 2):  # channels along the sequence: not attention as we know it
                return self.unknown(node, "scaled_dot_product_attention", args, kwargs)
        qh, kh, vh = q[0, :, 0, :], k[0, :, 0, :], v[0, :, 0, :]
        self.union(q, qh[None, :, None, :])
        self.union(k, kh[None, :, None, :])
        self.union(v, vh[None, :, None, :])
        self.union(qh, kh)
        head = self.new((q.shape[1],))
        for t in (qh, kh, vh):
            self.union(t, head[:, None])
        self.heads.append(head)
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        if isinstance(mask, torch.Tensor) and bool((mask >= 0).any()):
            self.pin(mask, f"attention mask with channels (node {node.name})")
        return vh[None, :, None, :].expand(tuple(val.shape))

    def op_embedding(self, node, args, kwargs) -> Any:
        w, ids = args[0], args[1]
        val = self.val(node)
        if not isinstance(w, _ParamRef) or len(w.shape) != 2:
            return self.unknown(node, "embedding", args, kwargs)
        self.pin(self.atoms_of(w.name, w.perm[0]),
                 f"embedding rows are indexed by input ids (node {node.name})")
        ids = self.label(ids)
        if isinstance(ids, torch.Tensor) and bool((ids >= 0).any()):
            self.pin(ids, f"embedding indices with channels (node {node.name})")
        return self.atoms_of(w.name, w.perm[1]).expand(tuple(val.shape))

    def affine(self, node, op, x: torch.Tensor, channel: int, params: Sequence[Any]) -> torch.Tensor:
        per_channel = self.per_channel(x, channel)
        for p in params:
            if p is None:
                continue
            if isinstance(p, _ParamRef) and len(p.shape) == 1:
                self.union(self.atoms_of(p.name, p.perm[0]), per_channel)
            else:
                self.union(self.label(p, node.name, op).reshape(-1), per_channel)
        return x

    def op_batch_norm(self, node, args, kwargs) -> Any:
        x = self.label(args[0], node.name, "batch_norm")
        return self.affine(node, "batch_norm", x, 1 if x.dim() > 1 else 0, args[1:5])

    def op__native_batch_norm_legit_no_training(self, node, args, kwargs) -> Any:
        x = self.label(args[0], node.name, "batch_norm")
        out = self.affine(node, "batch_norm", x, 1, args[1:5])
        val = self.val(node)
        return (out,) + tuple(self.empty_like_val(v) for v in val[1:])

    def op_layer_norm(self, node, args, kwargs) -> Any:
        x = self.label(args[0], node.name, "layer_norm")
        shape = args[1]
        if len(shape) != 1:
            return self.unknown(node, "layer_norm", args, kwargs,
                                f"layer_norm over several dims (node {node.name})")
        w = args[2] if len(args) > 2 else kwargs.get("weight")
        b = args[3] if len(args) > 3 else kwargs.get("bias")
        self.mark_inexact_along(x, x.dim() - 1, f"LayerNorm statistics (node {node.name})")
        return self.affine(node, "layer_norm", x, x.dim() - 1, [w, b])

    def op_rms_norm(self, node, args, kwargs) -> Any:
        x = self.label(args[0], node.name, "rms_norm")
        if len(args[1]) != 1:
            return self.unknown(node, "rms_norm", args, kwargs)
        w = args[2] if len(args) > 2 else kwargs.get("weight")
        self.mark_inexact_along(x, x.dim() - 1, f"RMSNorm statistics (node {node.name})")
        return self.affine(node, "rms_norm", x, x.dim() - 1, [w])

    def mark_inexact_along(self, x: torch.Tensor, dim: int, reason: str) -> None:
        if _varies(x, dim):
            self.mark_inexact(x, reason)

    def op_conv1d(self, node, args, kwargs) -> Any:
        return self.conv(node, "conv1d", args, kwargs, spatial=1)

    def op_conv2d(self, node, args, kwargs) -> Any:
        return self.conv(node, "conv2d", args, kwargs, spatial=2)

    def op_convolution(self, node, args, kwargs) -> Any:
        transposed = args[6] if len(args) > 6 else False
        w = args[1]
        spatial = len(w.shape) - 2 if isinstance(w, _ParamRef) else 0
        if transposed or spatial not in (1, 2):
            return self.unknown(node, "convolution", args, kwargs,
                                f"transposed and 3-d convolutions are not supported yet (node {node.name})")
        groups = args[8] if len(args) > 8 else 1
        return self.conv(node, "convolution", [args[0], args[1], args[2], None, None, None, groups],
                         {}, spatial=spatial)

    def conv(self, node, op, args, kwargs, spatial: int) -> Any:
        x, w = args[0], args[1]
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
        val = self.val(node)
        if not isinstance(w, _ParamRef) or w.perm != tuple(range(len(w.shape))):
            return self.unknown(node, op, args, kwargs, f"aten.{op} with a computed weight (node {node.name})")
        x = self.label(x, node.name, op)
        channel = x.dim() - spatial - 1
        c_out, c_in_g = w.shape[0], w.shape[1]
        x_ch = self.per_channel(x, channel)  # [C_in]
        out = self.atoms_of(w.name, 0)
        if groups == 1:
            self.union(self.atoms_of(w.name, 1), x_ch)
        elif c_in_g == 1:
            # Depthwise (with a channel multiplier m): output channels g*m .. g*m+m-1 come
            # from input channel g alone, so they are one channel with it.
            m = c_out // groups
            self.union(out.view(groups, m), x_ch[:, None])
        else:
            # Grouped: weight input channel j reads input channel g*c_in_g + j in every group g,
            # and output channel j of every group is one channel (as Torch-Pruning does).
            self.union(x_ch.view(groups, c_in_g), self.atoms_of(w.name, 1)[None, :])
            self.union(out.view(groups, c_out // groups), out.view(groups, -1)[:1])
        if b is not None:
            if isinstance(b, _ParamRef):
                self.union(self.atoms_of(b.name, b.perm[0]), out)
            else:
                self.union(self.label(b).reshape(-1), out)
        view = [1] * val.dim()
        view[channel] = c_out
        return out.view(view).expand(tuple(val.shape))

    # -- results ----------------------------------------------------------------------------
    def components(self) -> torch.Tensor:
        """The root atom of every atom (union-find by label propagation with pointer jumping)."""
        parent = torch.arange(self.count, dtype=torch.int64)
        if not self.edges:
            return parent
        edges = torch.cat(self.edges, dim=1)
        a, b = edges[0], edges[1]
        while True:
            pa, pb = parent[a], parent[b]
            if torch.equal(pa, pb):
                return parent
            low = torch.minimum(pa, pb)
            parent.scatter_reduce_(0, pa, low, reduce="amin")
            parent.scatter_reduce_(0, pb, low, reduce="amin")
            while True:
                nxt = parent[parent]
                if torch.equal(nxt, parent):
                    break
                parent = nxt

    def root_flags(self, events) -> Dict[int, str]:
        flags: Dict[int, str] = {}
        for atoms, reason in events:
            for r in torch.unique(self.roots[atoms]).tolist():
                flags.setdefault(r, reason)
        return flags

    def structure(self) -> Structure:
        roots = self.roots
        pinned = self.root_flags(self.pins)
        inexact = self.root_flags(self.inexact)
        head_roots = set(torch.unique(roots[torch.cat(self.heads)]).tolist()) if self.heads else set()
        rank = {name: i for i, name in enumerate(self.order)}
        members = sorted(self.param_atoms, key=lambda key: (rank[key[0]], key[1]))
        if not members:
            return Structure((), tuple(sorted((a, n) for a, n in self.aliases.items() if a != n)),
                             tuple((name, self.shapes[name]) for name in self.order))
        # Every (root, member, position), sorted: each root's positions in each member.
        r = torch.cat([roots[self.param_atoms[key]] for key in members])
        j = torch.cat([torch.full((len(self.param_atoms[key]),), i, dtype=torch.int64)
                       for i, key in enumerate(members)])
        p = torch.cat([torch.arange(len(self.param_atoms[key])) for key in members])
        width = len(members)
        order = torch.argsort(r * width + j, stable=True)  # positions already ascending
        r, j, p = r[order], j[order], p[order]
        pair_keys, counts = torch.unique_consecutive(r * width + j, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        pair_root = (pair_keys // width).tolist()
        pair_member = (pair_keys % width).tolist()
        counts_list = counts.tolist()
        starts_list = starts.tolist()
        first_p = p[starts].tolist()
        per_root: Dict[int, List[int]] = {}  # root -> its pair numbers
        for n, root in enumerate(pair_root):
            per_root.setdefault(root, []).append(n)
        buckets: Dict[tuple, List[int]] = {}
        for root, pairs in per_root.items():
            sig = (tuple((pair_member[n], counts_list[n]) for n in pairs), root in pinned,
                   root in inexact, root in head_roots)
            buckets.setdefault(sig, []).append(root)
        built = []
        for sig, rs in buckets.items():
            first_pair = {root: per_root[root][0] for root in rs}
            rs.sort(key=lambda root: (pair_member[first_pair[root]], first_p[first_pair[root]]))
            group_members = []
            for slot, (jj, k) in enumerate(sig[0]):
                pair_starts = torch.tensor([starts_list[per_root[root][slot]] for root in rs])
                index = p[pair_starts[:, None] + torch.arange(k)[None, :]]
                param, dim = members[jj]
                group_members.append(Member(param, dim, index))
            head = rs[0]
            first = group_members[0]
            reason = pinned.get(head)
            built.append(((sig[0][0][0], first_p[first_pair[head]]), Group(
                name=f"{first.param}:{first.dim}",
                size=len(rs),
                members=tuple(group_members),
                prunable=reason is None,
                reason=reason,
                exact=head not in inexact,
                inexact_reason=inexact.get(head),
                kind="head" if sig[3] else "channel",
            )))
        built.sort(key=lambda item: item[0])
        seen: Dict[str, int] = {}
        result = []
        for _, g in built:
            if g.name in seen:
                seen[g.name] += 1
                g = dataclasses.replace(g, name=f"{g.name}#{seen[g.name]}")
            else:
                seen[g.name] = 0
            result.append(g)
        aliases = tuple(sorted((a, n) for a, n in self.aliases.items() if a != n))
        shapes = tuple((name, self.shapes[name]) for name in self.order)
        return Structure(tuple(result), aliases, shapes)


def _hint(x: Any) -> Any:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = x.node.hint
        if hint is None:
            raise ValueError(
                f"fprune.structure cannot analyse data-dependent sizes ({x} has no example "
                f"value); channel groups need every channel count known."
            )
        return hint
    return x


def _concrete(val: Any) -> Any:
    """Example values with symbolic sizes replaced by their example sizes (meta tensors)."""
    if isinstance(val, torch.Tensor):
        return torch.empty(tuple(int(_hint(s)) for s in val.shape), dtype=val.dtype, device="meta")
    if isinstance(val, (list, tuple)):
        return type(val)(_concrete(v) for v in val)
    return _hint(val)


def _varies(x: torch.Tensor, dim: int) -> bool:
    """True when the atoms of ``x`` are not all the same along ``dim`` (ignoring no-atom -1s)."""
    if x.dim() == 0 or x.shape[dim] <= 1:
        return False
    hi = x.amax(dim=dim, keepdim=True)
    lo = torch.where(x >= 0, x, hi).amin(dim=dim, keepdim=True)
    return bool(((hi != lo) & (hi >= 0)).any())


# ----------------------------------------------------------------------------------------------
# Masks by group


def _check_structure(structure: Any) -> None:
    if not isinstance(structure, Structure):
        raise TypeError(
            f"Expected structure to be a fprune.structure.Structure (from "
            f"fprune.structure.groups(module, args)), got {type(structure).__name__}."
        )


class _Leaves:
    """The leaves of ``params`` by member name (tied aliases resolved), checked against shapes."""

    def __init__(self, params: Any, structure: Structure):
        self.flat = _tree.flatten(params, "params")
        self.names = [_tree.dotted(path) for path in self.flat.paths]
        self.by_name: Dict[str, List[int]] = {}
        for i, name in enumerate(self.names):
            self.by_name.setdefault(structure.canonical(name), []).append(i)
        shapes = dict(structure.shapes)
        for name, indices in self.by_name.items():
            for i in indices:
                leaf = self.flat.leaves[i]
                if name in shapes and tuple(leaf.shape) != shapes[name]:
                    raise ValueError(
                        f"Expected {_tree.describe('params', self.flat.paths[i])} to have the "
                        f"shape the structure was made with, {shapes[name]}, got "
                        f"{tuple(leaf.shape)}; call fprune.structure.groups on this model again."
                    )

    def first(self, name: str) -> Optional[int]:
        indices = self.by_name.get(name)
        return indices[0] if indices else None


def _slices(t: torch.Tensor, member: Member) -> torch.Tensor:
    """``t``'s slices of every channel of ``member``: shape ``(size, k * rest)``."""
    moved = t.movedim(member.dim, 0)
    picked = moved[member.index.to(t.device)]
    return picked.reshape(member.index.shape[0], -1)


def _positions(member: Member, length: int, device) -> torch.Tensor:
    """For each position along the member's dim, its channel (or -1 outside the group)."""
    size, k = member.index.shape
    pos = torch.full((length,), -1, dtype=torch.int64)
    pos[member.index.reshape(-1)] = torch.arange(size).repeat_interleave(k)
    return pos.to(device)


_SCOPES = ("local", "global")


def _group_where(where: Any) -> Optional[Callable[[Group], bool]]:
    """``group_structured``'s ``where`` as a ``group -> bool``: ``where(name, group)`` (fprune's
    form) when the callable takes two positional arguments, else the older ``where(group)``."""
    if where is None:
        return None
    try:
        inspect.signature(where).bind(None, None)
    except (TypeError, ValueError):  # cannot take two arguments, or no signature to read
        return lambda g: bool(where(g))
    return lambda g: bool(where(g.name, g))


@torch.no_grad()
def group_structured(
    params: Any,
    amount: _amount.Amount,
    structure: Structure,
    *,
    n: float = 2,
    importance_scores: Any = None,
    masks: Any = None,
    where: Any = None,
    scope: str = "local",
    round_to: Optional[int] = None,
    min_keep: Union[int, float, None] = None,
) -> Any:
    """Prune whole channels of dependency groups: every member of a group at the same channels.

    A channel's score is the sum over the group's members (those in ``params``) of ``|s|**n``
    summed over the channel's slices, ``s`` being ``importance_scores`` or the parameters
    (entries that prior masks pruned count as zero). ``scope="local"`` prunes ``amount`` of each
    group's remaining channels on its own; ``scope="global"`` ranks the channels of all chosen
    groups together (ties across groups: groups in sorted-name order). Counts follow fprune's
    rule, ``round(amount * remaining)``, and ties go to the lower channel index, both as in
    :func:`fprune.select.select`, which does the selection (channel scores are never negative). Torch-Pruning instead *floors the
    kept count* (it prunes ``C - int(C * (1 - amount))``): for ``C=10, amount=0.25`` fprune prunes
    2 channels, Torch-Pruning 3. Pass an int ``amount`` for a count per group.

    Args:
        params: parameters keyed like ``dict(module.named_parameters())`` (a flat dict, or a
            pytree whose dotted paths are those names; tied aliases may appear under either name).
        amount: a fraction of remaining channels, or a count.
        structure: from :func:`groups`.
        n: the exponent of the per-entry score (2: squared L2 per channel, Torch-Pruning's
            ``GroupMagnitudeImportance(p=2)`` summed instead of averaged over members).
        importance_scores: a pytree like ``params`` of scores (from any fprune score function).
        masks: prior masks; a channel stays alive while any member keeps an entry of it.
            Nothing pruned comes back.
        where: ``where(name, group) -> bool`` picks the groups to prune, ``name`` being the
            group's name (``"param:dim"``), as every other ``where`` in fprune takes
            ``(name, tensor)``. The older one-argument form ``where(group) -> bool`` keeps
            working: a callable that cannot take two positional arguments gets the group
            alone. Groups that are not prunable are always skipped; by default (``None``) the
            prunable groups that are exact.
        scope: ``"local"`` or ``"global"``.
        round_to: keep a multiple of this many channels in each group (the kept count is
            rounded down, so more is pruned, as Torch-Pruning's ``round_to``); local scope only.
        min_keep: global scope only: every group keeps at least this many channels (an int) or
            this fraction of them (a float), as ``fprune.select.Global(min_keep=)``. Without it
            a global ranking can remove a whole group (warned with a
            ``fprune.select.LayerCollapseWarning``), which :func:`compact` cannot build.

    Returns:
        Masks (``torch.bool``) for every leaf of ``params``, consistent across every group.

    Raises:
        TypeError: a wrong kind of ``structure``, ``where`` or ``n``.
        ValueError: a bad ``amount``, ``scope`` or ``round_to``, or params whose shapes are not
            those the structure was made with.

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> s = fprune.structure.groups(net, (torch.randn(2, 3),))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> m = fprune.group_structured(params, 0.5, s)
        >>> int(m["0.weight"].all(dim=1).sum()), torch.equal(m["0.weight"].all(1), m["2.weight"].all(0))
        (2, True)
    """
    _check_structure(structure)
    _amount.check_amount(amount)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0:
        raise (TypeError if not isinstance(n, (int, float)) or isinstance(n, bool) else ValueError)(
            f"Expected n to be a positive number, got {n!r}."
        )
    if scope not in _SCOPES:
        raise ValueError(f"Expected scope to be 'local' or 'global', got {scope!r}.")
    if round_to is not None:
        if isinstance(round_to, bool) or not isinstance(round_to, int) or round_to < 1:
            raise ValueError(f"Expected round_to to be None or a positive int, got {round_to!r}.")
        if scope != "local":
            raise ValueError("round_to works with scope='local' only.")
    if min_keep is not None and scope != "global":
        raise ValueError(f"min_keep works with scope='global' only, got scope={scope!r}.")
    global_scope = Global(min_keep=min_keep) if scope == "global" else None  # checks min_keep
    if where is not None and not callable(where):
        raise TypeError(
            f"Expected where to be None or a callable (name, group) -> bool, got {where!r}."
        )
    leaves = _Leaves(params, structure)
    flat = leaves.flat
    scores = None if importance_scores is None else _tree.check_scores(flat, importance_scores)
    prior = [None] * len(flat.leaves) if masks is None else _tree.check_masks(flat, masks)
    picks = _group_where(where)
    chosen = [
        g for g in structure.groups
        if g.prunable and (g.exact if picks is None else picks(g))
    ]
    chosen = [g for g in chosen if any(leaves.first(m.param) is not None for m in g.members)]

    channel_scores, alive = {}, {}
    for g in chosen:
        total, keep = None, None
        for m in g.members:
            i = leaves.first(m.param)
            if i is None:
                continue
            p, before = flat.leaves[i], prior[i]
            values = p if scores is None else scores[i]
            if scores is None and before is not None:
                values = torch.where(before, values, torch.zeros((), dtype=values.dtype))
            s = _slices(values, m).abs().to(torch.float32 if values.element_size() < 8 else values.dtype)
            s = s.pow(n).sum(dim=1)
            total = s if total is None else total + s
            if before is not None:
                k = _slices(before, m).any(dim=1)
                keep = k if keep is None else keep | k
        channel_scores[g.name] = total
        alive[g.name] = keep if keep is not None else torch.ones_like(total, dtype=torch.bool)

    if not chosen:
        kept = {}
    elif scope == "global" and torch.compiler.is_compiling():
        kept = select(channel_scores, amount, scope=global_scope, masks=alive)  # never warns
    elif scope == "global":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LayerCollapseWarning)
            kept = select(channel_scores, amount, scope=global_scope, masks=alive)
        for w in caught:
            if not issubclass(w.category, LayerCollapseWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        emptied = [  # groups this call emptied (not those prior masks had emptied already)
            name for name in channel_scores
            if caught and bool(alive[name].any()) and not bool(kept[name].any())
        ]
        if emptied:
            warnings.warn(
                f"group_structured(scope='global') removed every channel of group(s) "
                f"{', '.join(emptied)}; compact cannot build a layer with no channel. Pass "
                f"min_keep= (channels kept per group: a count or a fraction) to prevent it.",
                LayerCollapseWarning,
                stacklevel=3,  # past torch.no_grad's wrapper, at the caller's line
            )
    elif round_to is None:
        kept = select(channel_scores, amount, masks=alive)
    else:
        kept = {}
        for g in chosen:
            remaining = alive[g.name].sum() if masks is not None else g.size
            if isinstance(remaining, torch.Tensor):
                if _select.is_traced([remaining]):
                    raise ValueError("round_to with prior masks needs eager mode (counts are data).")
                remaining = int(remaining)
            count = _amount.count(amount, remaining, "channels", f"group {g.name}")
            if isinstance(count, torch.Tensor):
                raise ValueError("round_to needs a Python-number amount.")
            keep_count = ((remaining - count) // round_to) * round_to
            kept.update(select({g.name: channel_scores[g.name]}, remaining - keep_count,
                               masks={g.name: alive[g.name]}))

    out = []
    for i, p in enumerate(flat.leaves):
        mask = prior[i] if prior[i] is not None else torch.ones_like(p, dtype=torch.bool)
        out.append(mask)
    for g in chosen:
        keep = kept[g.name]
        for m in g.members:
            for i in leaves.by_name.get(m.param, []):
                p = flat.leaves[i]
                pos = _positions(m, p.shape[m.dim], p.device)
                along = torch.where(pos >= 0, keep[..., pos.clamp(min=0)], torch.ones((), dtype=torch.bool, device=p.device))
                view = [1] * p.dim()
                view[m.dim] = p.shape[m.dim]
                out[i] = out[i] & along.reshape(view)
    return _tree.unflatten(flat, out)


# ----------------------------------------------------------------------------------------------
# Physical shrinking


def _kept_positions(
    leaves: _Leaves, masks: Any, structure: Structure, allow_inexact: bool,
    parameters: Optional[set] = None,
) -> Dict[Tuple[str, int], torch.Tensor]:
    """``(param, dim) -> keep`` (bool along that dim) for every member dim that loses channels.

    A channel is pruned where every member with a mask has all of its slices pruned; members
    without a mask (buffers, leaves a partial mask dict leaves out) follow the group. With
    ``parameters`` (the module's parameter names, for :func:`compact`), a parameter member
    without a mask raises instead: the masked model still uses its slices (a conv's bias
    feeds the next layer), so removing them would change the outputs.
    """
    matched = _tree.check_masks(leaves.flat, masks)
    keep: Dict[Tuple[str, int], torch.Tensor] = {}
    for g in structure.groups:
        pruned, first, emptied = None, None, None
        for m in g.members:
            i = leaves.first(m.param)
            if i is None or matched[i] is None:
                continue  # no mask: the member follows the group
            if not bool(matched[i].any()):
                # A leaf with nothing kept: this group or another one emptied it, so on its
                # own it says nothing about this group.
                emptied = emptied or m
                continue
            gone = ~_slices(matched[i], m).any(dim=1)
            if pruned is None:
                pruned, first = gone, m
            elif not torch.equal(gone, pruned):
                c = int(torch.nonzero(gone != pruned)[0])
                who, other = (m, first) if bool(gone[c]) else (first, m)
                raise ValueError(
                    f"masks are not consistent with group {g.name}: "
                    f"masks[{who.param!r}] prunes all of channel {c} along dim {who.dim} but "
                    f"masks[{other.param!r}] keeps part of it along dim {other.dim}; prune "
                    f"groups with fprune.group_structured, or mask every member alike."
                )
        if pruned is None and emptied is not None and g.prunable and (g.exact or allow_inexact):
            # Every member with a mask is empty (a global scope or amount=1.0 removed the whole
            # group): all its slices are zeros, so removing every channel equals masking.
            pruned = torch.ones(g.size, dtype=torch.bool, device=matched[leaves.first(emptied.param)].device)
            first = emptied
        if pruned is None or not bool(pruned.any()):
            continue
        if not g.prunable:
            raise ValueError(
                f"masks prune channels of group {g.name} (member {first.param} dim {first.dim}), "
                f"which cannot be removed: {g.reason}."
            )
        if not g.exact and not allow_inexact:
            raise ValueError(
                f"masks prune channels of group {g.name} (member {first.param} dim {first.dim}), "
                f"which is not exact ({g.inexact_reason}): the compact model would differ from "
                f"the masked one. Pass allow_inexact=True to remove them anyway."
            )
        for m in g.members if parameters is not None else ():
            i = leaves.first(m.param)
            if m.param in parameters and (i is None or matched[i] is None):
                raise ValueError(
                    f"masks prune channels of group {g.name} but have no mask for its member "
                    f"{m.param!r} (dim {m.dim}){'' if i is not None else ', which params leaves out'}: "
                    f"the masked model still uses those slices, so removing them would change the "
                    f"outputs. Mask every parameter of the group (fprune.group_structured does)."
                )
        for m in g.members:
            length = dict(structure.shapes)[m.param][m.dim]
            pos = _positions(m, length, pruned.device)
            cut = (pos >= 0) & pruned[pos.clamp(min=0)]
            key = (m.param, m.dim)
            keep[key] = ~cut if key not in keep else keep[key] & ~cut
    return keep


def _shrink(t: torch.Tensor, name: str, keep: Dict[Tuple[str, int], torch.Tensor]) -> torch.Tensor:
    for (param, dim), along in keep.items():
        if param == name:
            t = t.index_select(dim, torch.nonzero(along.to(t.device)).reshape(-1))
    return t


def compact_params(params: Any, masks: Any, structure: Structure, *, allow_inexact: bool = False) -> Any:
    """The kept slices: every leaf with its pruned channels removed (the others masked).

    Pure: returns a new pytree like ``params`` in which each member dim has lost the channels
    that ``masks`` prune in every member of its group, and the values are those of
    :func:`fprune.apply_masks` (entries masked inside kept channels stay zeros). Shapes depend
    on the masks, so this runs in eager code.

    Args:
        params: parameters keyed like ``dict(module.named_parameters())`` (buffers may be added).
        masks: masks like those of :func:`group_structured`; a dict may leave keys out.
        structure: from :func:`groups`.
        allow_inexact: remove channels of inexact groups too.

    Returns:
        A pytree like ``params`` with smaller tensors.

    Raises:
        ValueError: masks that are not consistent across a group's members (the member is
            named), that prune an unprunable group, or an inexact one without ``allow_inexact``.

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> s = fprune.structure.groups(net, (torch.randn(2, 3),))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> small = fprune.compact_params(params, fprune.group_structured(params, 0.5, s), s)
        >>> {k: tuple(v.shape) for k, v in small.items()}
        {'0.weight': (2, 3), '0.bias': (2,), '2.weight': (2, 2), '2.bias': (2,)}
    """
    _check_structure(structure)
    leaves = _Leaves(params, structure)
    keep = _kept_positions(leaves, masks, structure, allow_inexact)
    masked = _tree.flatten(apply_masks(params, masks), "params").leaves
    out = [
        _shrink(t, structure.canonical(name), keep) for t, name in zip(masked, leaves.names)
    ]
    return _tree.unflatten(leaves.flat, out)


def compact(
    module: torch.nn.Module,
    params: Any,
    masks: Any,
    structure: Structure,
    args: Any = (),
    kwargs: Optional[dict] = None,
    *,
    allow_inexact: bool = False,
    dynamic_shapes: Any = None,
) -> Tuple[torch.fx.GraphModule, Dict[str, torch.Tensor]]:
    """A smaller model: the exported graph of ``module`` with pruned channels removed.

    Exports ``module`` again (in eval mode, on the example inputs), checks that its structure is
    ``structure``, slices every parameter and buffer (BatchNorm running statistics included) and
    rewrites the channel sizes that the graph holds as literals (``view``/``reshape``/``unflatten`` sizes,
    ``split`` sizes, ``layer_norm`` shapes, depthwise ``groups``, ``slice`` bounds). For exact
    groups its outputs equal ``fprune.masked_call(module, params, masks, args, kwargs)``.
    The result is a ``torch.fx.GraphModule`` (no Python class of the original: no HF
    ``generate``); its ``state_dict`` keeps the original names with smaller shapes, and
    ``torch.export.export(small, args, kwargs)`` gives a program that ``torch.export.save``
    writes. Like any export, literal batch and sequence sizes are baked in unless
    ``dynamic_shapes`` says otherwise.

    Args:
        module: the dense model.
        params: its parameters (as given to :func:`group_structured`); values not in ``params``
            come from the module.
        masks: the masks.
        structure: from :func:`groups` on this module.
        args: example positional inputs (a tuple), as given to :func:`groups`.
        kwargs: example keyword inputs.
        allow_inexact: remove channels of inexact groups too (outputs then differ).
        dynamic_shapes: passed to ``torch.export.export``.

    Returns:
        ``(small_module, small_params)``: the GraphModule (holding the small parameters) and
        :func:`compact_params` of ``params``.

    Raises:
        ValueError: inconsistent masks (the member is named), masks on unprunable or inexact
            groups, masks that prune a group's channels but leave one of its parameters
            without a mask (a partial mask dict, or params that leave it out: the masked model
            still uses it), a structure of another model, or a graph the rewrite cannot handle.

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
        ...                           torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).eval()
        >>> x = torch.randn(2, 3, 8, 8)
        >>> s = fprune.structure.groups(net, (x,))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> masks = fprune.group_structured(params, 0.5, s)
        >>> small, small_params = fprune.compact(net, params, masks, s, (x,))
        >>> small_params["3.weight"].shape
        torch.Size([4, 4, 3, 3])
        >>> torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-6)
        True
    """
    _check_structure(structure)
    fresh, analysis, ep = _analyse(module, args, kwargs, dynamic_shapes)
    if fresh.key() != structure.key():
        raise ValueError(
            "structure does not match this module and these inputs (its groups differ from "
            "fprune.structure.groups(module, args, kwargs)); make it from the same model."
        )
    leaves = _Leaves(params, structure)
    parameters = {structure.canonical(n) for n, _ in module.named_parameters(remove_duplicate=False)}
    keep = _kept_positions(leaves, masks, structure, allow_inexact, parameters)
    small_params = compact_params(params, masks, structure, allow_inexact=allow_inexact)
    small_flat = dict(zip(leaves.names, _tree.flatten(small_params, "params").leaves))
    by_canonical = {structure.canonical(k): v for k, v in small_flat.items()}

    gm = ep.module()
    # New tensors: one per original tensor (tied names share it).
    replaced: Dict[int, torch.Tensor] = {}
    for kind, named in (("param", gm.named_parameters(remove_duplicate=False)),
                        ("buffer", gm.named_buffers(remove_duplicate=False))):
        for name, t in list(named):
            canonical = structure.canonical(name)
            if id(t) not in replaced:
                new = by_canonical.get(canonical)
                if new is None:
                    new = _shrink(t.detach(), canonical, keep)
                new = new.detach().clone()
                if kind == "param":
                    new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                replaced[id(t)] = new
            _set_tensor(gm, name, replaced[id(t)], kind)

    atom_keep = _atom_keep(analysis, keep)
    _rewrite(gm, analysis, atom_keep)
    gm.recompile()
    try:
        _check_run(gm, analysis, atom_keep, args, dict(kwargs or {}))
    except ValueError as error:
        emptied = sorted({f"{p} dim {d}" for (p, d), along in keep.items() if not bool(along.any())})
        if not emptied:
            raise
        raise ValueError(
            f"The masks remove every channel along {', '.join(emptied[:4])}, and torch cannot "
            f"run some layers with no channel at all (a conv, for one): keep at least one channel "
            f"in every group (group_structured(scope='global') can empty a whole group: pass min_keep=). {error}"
        ) from error
    return gm, small_flat if isinstance(params, dict) else small_params


def _set_tensor(gm: torch.nn.Module, name: str, value: torch.Tensor, kind: str) -> None:
    prefix, _, leaf = name.rpartition(".")
    owner = gm.get_submodule(prefix) if prefix else gm
    if kind == "param":
        owner._parameters[leaf] = value
    else:
        owner._buffers[leaf] = value


def _atom_keep(analysis: _Analysis, keep: Dict[Tuple[str, int], torch.Tensor]) -> torch.Tensor:
    """Whether each atom survives: its root is not a pruned channel."""
    roots = analysis.roots
    root_keep = torch.ones(analysis.count, dtype=torch.bool)
    for key, along in keep.items():
        atoms = analysis.param_atoms.get(key)
        if atoms is not None:
            root_keep[roots[atoms[~along]]] = False
    return root_keep[roots]


def _kept_along(label: torch.Tensor, atom_keep: torch.Tensor, node: str) -> List[torch.Tensor]:
    """Per dim of a node's value, which indices survive; checks the survivors form a box."""
    element = (label < 0) | atom_keep[label.clamp(min=0)]
    if label.dim() == 0:
        return []
    along = []
    for d in range(label.dim()):
        others = [x for x in range(label.dim()) if x != d]
        along.append(element.any(dim=others) if others else element)
    box = along[0]
    for d in range(1, label.dim()):
        box = box.unsqueeze(-1) & along[d].reshape((1,) * d + (-1,))
    if not torch.equal(box, element):
        raise ValueError(
            f"compact cannot remove these channels: in node {node} the kept entries do not form "
            f"a box (per-head dims pruned unevenly, say)."
        )
    return along


def _new_shape(label: Any, atom_keep: torch.Tensor, node: str) -> Any:
    if isinstance(label, torch.Tensor):
        return [int(a.sum()) for a in _kept_along(label, atom_keep, node)]
    if isinstance(label, (list, tuple)):
        return [_new_shape(x, atom_keep, node) for x in label]
    return None


def _rewrite(gm: torch.fx.GraphModule, analysis: _Analysis, atom_keep: torch.Tensor) -> None:
    """Rewrite the channel sizes that the graph holds as literals."""
    aten = torch.ops.aten
    labels = analysis.labels
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.name not in labels:
            continue
        op = getattr(getattr(node.target, "overloadpacket", None), "__name__", None)
        out = labels[node.name]
        if op in ("view", "reshape", "_unsafe_view", "expand") and isinstance(out, torch.Tensor):
            shape = _new_shape(out, atom_keep, node.name)
            sizes = list(node.args[1])
            new = [s if (not isinstance(s, int) or s == -1) else shape[i] for i, s in enumerate(sizes)]
            if new != sizes:
                node.args = (node.args[0], new) + tuple(node.args[2:])
        elif op == "unflatten" and isinstance(out, torch.Tensor):
            # unflatten(x, dim, sizes): nn.MultiheadAttention's packed q/k/v, (..., 3 * E) -> (..., 3, E)
            shape = _new_shape(out, atom_keep, node.name)
            sizes = list(node.args[2])
            d = node.args[1] % (len(shape) - len(sizes) + 1)
            new = [s if (not isinstance(s, int) or s == -1) else shape[d + i] for i, s in enumerate(sizes)]
            if new != sizes:
                node.args = (node.args[0], node.args[1], new) + tuple(node.args[3:])
        elif op in ("split", "split_with_sizes", "chunk") and isinstance(out, (list, tuple)):
            dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
            pieces = [_new_shape(x, atom_keep, node.name) for x in out]
            dim = dim % len(pieces[0])
            sizes = [p[dim] for p in pieces]
            old = [int(x.shape[dim]) for x in out]
            if sizes != old:
                node.target = aten.split_with_sizes.default
                node.args = (node.args[0], sizes, dim)
                node.kwargs = {}
        elif op in ("layer_norm", "rms_norm") and isinstance(out, torch.Tensor):
            shape = _new_shape(out, atom_keep, node.name)
            width = len(node.args[1])
            new = shape[len(shape) - width:]
            if list(node.args[1]) != new:
                node.args = (node.args[0], new) + tuple(node.args[2:])
        elif op in ("conv1d", "conv2d", "convolution"):
            groups_at = 8 if op == "convolution" else 6
            groups = node.args[groups_at] if len(node.args) > groups_at else node.kwargs.get("groups", 1)
            w = node.args[1]
            w_shape = None
            if isinstance(w, torch.fx.Node) and w.op == "get_attr":
                w_shape = analysis.shapes.get(analysis.aliases.get(w.target, w.target))
            if groups != 1 and w_shape is not None and w_shape[1] == 1:
                x = labels[node.args[0].name]
                spatial = len(w_shape) - 2
                new_groups = _new_shape(x, atom_keep, node.name)[x.dim() - spatial - 1]
                args = list(node.args)
                defaults = [None, None, None, [1] * spatial, [0] * spatial, [1] * spatial]
                while len(args) <= groups_at:
                    args.append(defaults[len(args)] if len(args) < len(defaults) else None)
                args[groups_at] = new_groups
                node.args = tuple(args)
                node.kwargs = {k: v for k, v in node.kwargs.items() if k != "groups"}
        elif op in ("slice", "narrow", "select") and isinstance(node.args[0], torch.fx.Node):
            x = labels.get(node.args[0].name)
            if not isinstance(x, torch.Tensor):
                continue
            dim = node.args[1] % x.dim() if len(node.args) > 1 else 0
            along = _kept_along(x, atom_keep, node.name)[dim]
            if bool(along.all()):
                continue
            before = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(along.long(), 0)])
            size = x.shape[dim]
            clip = lambda v: before[max(0, min(size, v if v >= 0 else v + size))].item()
            args = list(node.args)
            if op == "select":
                args[2] = int(clip(args[2]))
            elif op == "narrow":
                start = args[2]
                args[2], args[3] = int(clip(start)), int(clip(start + args[3]) - clip(start))
            else:
                while len(args) < 4:
                    args.append(None)
                start = 0 if args[2] is None else args[2]
                end = size if args[3] is None else args[3]
                args[2], args[3] = int(clip(start)), int(clip(end))
                if len(args) > 4 and args[4] not in (None, 1):
                    raise ValueError(f"compact cannot rewrite a strided slice over channels (node {node.name}).")
            node.args = tuple(args)


def _check_run(gm, analysis: _Analysis, atom_keep: torch.Tensor, args: tuple, kwargs: dict) -> None:
    """Run the rewritten graph once and check every value's shape; name the first that differs."""
    labels = analysis.labels

    class Checker(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            label = labels.get(n.name)
            if n.op == "call_function" and isinstance(result, torch.Tensor) and isinstance(label, torch.Tensor):
                want = _new_shape(label, atom_keep, n.name)
                if list(result.shape) != want:
                    raise ValueError(
                        f"compact could not rewrite node {n.name} ({n.target}): it gives shape "
                        f"{list(result.shape)}, expected {want}."
                    )
            return result

    flat_inputs = torch.utils._pytree.tree_flatten((args, kwargs))[0]
    with torch.no_grad():
        try:
            Checker(gm).run(*flat_inputs)
        except ValueError:
            raise
        except Exception as error:
            raise ValueError(
                f"compact could not run the rewritten graph: {type(error).__name__}: {error}"
            ) from error
