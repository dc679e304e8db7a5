"""The propagation: walk the exported ATen graph in order and give every node a *label* (an int64
tensor shaped like its value, holding the atom of each entry, -1 for none), asking the op rules
(:mod:`fprune.structure._ops`) for each node's."""

from __future__ import annotations

import operator
from typing import Any

import torch

from fprune.structure._atoms import Atoms
from fprune.structure._labels import ParamRef, concrete

__all__ = ["Propagation"]


class Propagation(Atoms):
    """Labels of every node of an ExportedProgram (see the module docstring).

    Besides :class:`~fprune.structure._atoms.Atoms`' vocabulary, the op rules use these
    methods: turning values into labels (``label``, ``like_output``, ``empty_like_val``),
    pinning a value (``pin_value``), the example value of a node (``val``) and giving up on an
    op (``unknown``).
    """

    def __init__(self, ep: Any, aliases: dict[str, str]):
        super().__init__()
        self.ep = ep
        self.aliases = aliases
        sig = ep.graph_signature
        self.names: dict[str, str] = {}
        for placeholder, fqn in {**sig.inputs_to_parameters, **sig.inputs_to_buffers}.items():
            self.names[placeholder] = aliases.get(fqn, fqn)
        self.user_inputs = set(sig.user_inputs)
        self.entries: dict[str, tuple[torch.Tensor, str]] = {}  # parameter -> (atom per entry, first use)
        self.order: list[str] = []  # parameter / buffer names in graph order
        self.labels: dict[str, Any] = {}  # node name -> label value
        self.vals: dict[str, Any] = {}

    def val(self, node: torch.fx.Node) -> Any:
        """The node's example value with concrete sizes (symbolic ones at their example value)."""
        if node.name not in self.vals:
            self.vals[node.name] = concrete(node.meta.get("val"))
        return self.vals[node.name]

    def label(self, value: Any, node_name: str = "", op: str = "", axes: set[int] | None = None) -> Any:
        """A label tensor for a ParamRef used as a plain tensor, otherwise the value itself.

        ``axes``: the axes of ``value`` that may carry channels (None: all); along the others
        the parameter's entries belong to the channel of their position on the one that does.
        """
        if not isinstance(value, ParamRef):
            return value
        shape = value.shape
        big = [i for i, s in enumerate(shape) if s > 1 and (axes is None or i in axes)]
        if len(big) <= 1:
            if not big:
                return torch.full(shape, -1, dtype=torch.int64)
            axis = big[0]
            atoms = self.atoms_of(value.name, value.perm[axis])
            view = [1] * len(shape)
            view[axis] = shape[axis]
            return atoms.view(view).expand(shape)
        # A parameter with several long dims used as a plain tensor (ViT's position embedding,
        # tokens x channels): one atom per entry; once atoms are merged, ``_boxes``
        # finds the one dim its channels run along, or pins them all.
        if value.name not in self.entries:
            self.entries[value.name] = (self.new(self.shapes[value.name]), f"{op} (node {node_name})")
        return self.entries[value.name][0].permute(value.perm)

    def pin_value(self, value: Any, reason: str) -> None:
        if isinstance(value, ParamRef):
            for dim in value.perm:
                if value.shape[value.perm.index(dim)] > 1:
                    self.pin(self.atoms_of(value.name, dim), reason)
        elif isinstance(value, torch.Tensor):
            self.pin(value, reason)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.pin_value(v, reason)

    def like_output(self, label: Any, val: Any) -> Any:
        if (
            isinstance(val, torch.Tensor)
            and isinstance(label, torch.Tensor)
            and tuple(label.shape) != tuple(val.shape)
        ):
            if label.dim() == val.dim():
                return label.expand(tuple(val.shape))
            return torch.full(tuple(val.shape), -1, dtype=torch.int64)
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

    def unknown(
        self, node: torch.fx.Node, op: str, args: Any, kwargs: dict, reason: str | None = None
    ) -> Any:
        """No rule applies: pin every channel flowing in; the output carries fresh pinned atoms."""
        reason = reason or f"no rule for aten.{op} (node {node.name})"
        carried = False
        for a in list(args) + list(kwargs.values()):
            for leaf in a if isinstance(a, (list, tuple)) else [a]:
                if isinstance(leaf, ParamRef) or (isinstance(leaf, torch.Tensor) and bool((leaf >= 0).any())):
                    carried = True
                self.pin_value(leaf, reason)
        val = self.val(node)
        return self.fresh_like_val(val, reason) if carried else self.empty_like_val(val)

    def propagate(self) -> None:
        """Label every node, in graph order; channels reaching a model output are pinned."""
        graph = self.ep.graph
        for node in graph.nodes:
            if node.op == "placeholder":
                self.labels[node.name] = self.placeholder(node)
            elif node.op == "call_function":
                self.labels[node.name] = self.call(node)
            elif node.op == "output":
                outs = node.args[0]
                for out in outs if isinstance(outs, (list, tuple)) else [outs]:
                    if isinstance(out, torch.fx.Node):
                        self.pin_value(self.labels.get(out.name), "model output")
            elif node.op == "get_attr":
                self.labels[node.name] = None

    def placeholder(self, node: torch.fx.Node) -> Any:
        val = self.val(node)
        if node.name in self.names:
            name = self.names[node.name]
            if name not in self.shapes:
                self.shapes[name] = tuple(int(s) for s in val.shape)
                self.order.append(name)
            if not (val.is_floating_point() or val.is_complex()):
                # Integer and bool buffers hold indices or flags (BERT's position_ids), not channels.
                return torch.full(tuple(val.shape), -1, dtype=torch.int64)
            return ParamRef(name, tuple(range(val.dim())), tuple(int(s) for s in val.shape))
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

    def call(self, node: torch.fx.Node) -> Any:
        target = node.target
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        if target is operator.getitem:
            return args[0][args[1]]
        if getattr(target, "__module__", None) == "_operator":
            return self.val(node)  # arithmetic on symbolic sizes (dynamic shapes): no channel
        op: str | None = getattr(getattr(target, "overloadpacket", None), "__name__", None)
        if op is None:
            val = self.val(node)
            if not isinstance(val, torch.Tensor):
                # Python arithmetic on sizes (``operator.mul`` of a symbolic batch size, with
                # dynamic shapes): a number, no channel.
                return val
            op = str(getattr(target, "__name__", str(target)))
        return self.apply_rule(node, op, args, kwargs)

    def apply_rule(self, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
        """The labels of ``op``'s outputs by its rule (:mod:`fprune.structure._ops`, which the
        analysis that runs the propagation brings: the rules import this module for their
        types, so this one cannot import them); here, with no rules, every op is unknown."""
        return self.unknown(node, op, args, kwargs)
