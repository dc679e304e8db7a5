"""What a structural op is (:class:`Op`), the registry the three passes read, and the helpers
an op's parts share.

An op is one object with up to three parts, each used by one pass:

* ``rule`` (:func:`fprune.structure.groups`): how the ATen op moves and couples channel atoms;
* ``rewrite`` (:func:`fprune.structure.compact_graph`): how the node's literal sizes change
  when channels go;
* ``layers`` (:func:`fprune.structure.compact`): the ``nn.Module`` classes built on the op,
  each with the resizer that updates its size attributes.

:func:`register` files an op under each of its ATen names and layer classes.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from fprune.structure._types import CompactError

if TYPE_CHECKING:
    from fprune.structure._propagate import Propagation

__all__ = [
    "Op",
    "Rule",
    "Rewrite",
    "Resizer",
    "Rewriter",
    "RULES",
    "REWRITES",
    "RESIZERS",
    "OPS",
    "register",
    "names",
    "rule_of",
    "find_resizer",
    "unsupported",
    "kept_along",
    "new_shape",
    "GRAPH_ROUTE",
    "where",
    "whole_heads",
]

#: ``rule(a, node, op, args, kwargs) -> label``: ``a`` is the running analysis, ``op`` the ATen
#: name, ``args``/``kwargs`` the node's arguments with every input replaced by its label (an
#: int64 tensor of atom ids, -1 for none), a :class:`~fprune.structure._labels.ParamRef` for a
#: parameter not yet used as a tensor, or the plain value for scalars. It returns the output's
#: label (or a tuple of labels) and records what it learns with ``a.union`` (these atoms are one
#: channel), ``a.pin`` (these cannot be pruned, with the reason) and ``a.mark_inexact``
#: (removing them changes other values).
Rule = Callable[["Propagation", torch.fx.Node, str, list, dict], Any]

#: ``rewrite(rw, node, op, label)``: change ``node``'s arguments (sizes the graph holds as
#: literals) so that it runs on the kept channels; ``label`` is the node's output label. The node
#: is a ``torch.fx.Node`` whose arguments follow the op's schema (typed Any: fx types them loosely).
Rewrite = Callable[["Rewriter", Any, str, Any], None]

#: ``resize(module, name) -> config fields``: set the size attributes of ``module`` (whose
#: parameters already have their new shapes; its attributes still hold the old sizes) and return
#: the config fields its new widths imply (``{"intermediate_size": 96}``) or None. ``name`` is
#: for error messages.
Resizer = Callable[[torch.nn.Module, str], "dict[str, Any] | None"]


@dataclasses.dataclass(frozen=True)
class Op:
    """One structural op: its analysis rule, its graph rewrite and its module resizers.

    Attributes:
        aten: the ATen op names it covers (overload packets: ``"linear"`` for
            ``aten.linear.default``).
        rule: the analysis rule (see :data:`Rule`).
        rewrite: the graph rewrite of :func:`~fprune.structure.compact_graph` (see
            :data:`Rewrite`); None when the node holds no channel size.
        layers: module class (or ``"module.QualName"``, so that transformers needs no import)
            -> resizer, for :func:`~fprune.structure.compact`; subclasses use their nearest
            base's entry. Empty when no layer holds a size of this op.
        in_place: the in-place twins (``relu_`` of ``relu``) follow the same rule: element-wise
            ops, whose output is the first operand's shape, each entry keeping its channel.
    """

    aten: tuple[str, ...]
    rule: Rule
    rewrite: Rewrite | None = None
    layers: Mapping[type | str, Resizer] = dataclasses.field(default_factory=dict)
    in_place: bool = False


#: Every registered op, in registration order.
OPS: list[Op] = []
#: ATen name -> rule; ATen name -> rewrite; layer class -> resizer (read by the passes).
RULES: dict[str, Rule] = {}
REWRITES: dict[str, Rewrite] = {}
RESIZERS: dict[type | str, Resizer] = {}
_IN_PLACE: set[str] = set()


def names(text: str) -> tuple[str, ...]:
    """ATen names written as one whitespace-separated string (long lists stay short)."""
    return tuple(text.split())


def register(op: Op) -> Op:
    """File ``op`` under each of its ATen names and layer classes; returns it."""
    taken = [name for name in op.aten if name in RULES] + [cls for cls in op.layers if cls in RESIZERS]
    if taken:
        raise ValueError(f"Expected a new op, but {taken[0]!r} already has one.")
    OPS.append(op)
    for name in op.aten:
        RULES[name] = op.rule
        if op.rewrite is not None:
            REWRITES[name] = op.rewrite
        if op.in_place:
            _IN_PLACE.add(name)
    RESIZERS.update(op.layers)
    return op


def rule_of(name: str) -> Rule | None:
    """The rule of ATen op ``name``, or its out-of-place twin's for an in-place op (``op_``)
    whose twin is an ``in_place`` op; None when neither (the analysis then pins its channels)."""
    found = RULES.get(name)
    if found is None and name.endswith("_") and not name.startswith("_") and name[:-1] in _IN_PLACE:
        return RULES[name[:-1]]
    return found


def find_resizer(cls: type) -> Resizer | None:
    """The resizer of ``cls``'s nearest class (itself first, then its bases) with one."""
    for base in cls.__mro__:
        fn = RESIZERS.get(base) or RESIZERS.get(f"{base.__module__}.{base.__qualname__}")
        if fn is not None:
            return fn
    return None


def unsupported(reason: str) -> Rule:
    """The rule of an op no rule maps channels through: its channels are unprunable, with ``reason``."""

    def rule(a: Propagation, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
        return a.unknown(node, op, args, kwargs, f"{reason} (aten.{op}, node {node.name})")

    return rule


# ---------------------------------------------------------------------------------------------
# For rewrites: which entries of a value survive.


def kept_along(label: torch.Tensor, atom_keep: torch.Tensor, node: str) -> list[torch.Tensor]:
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


def new_shape(label: Any, atom_keep: torch.Tensor, node: str) -> Any:
    """The shape of a node's value once the pruned channels are gone (a list per tensor)."""
    if isinstance(label, torch.Tensor):
        return [int(a.sum()) for a in kept_along(label, atom_keep, node)]
    if isinstance(label, (list, tuple)):
        return [new_shape(x, atom_keep, node) for x in label]
    return None


@dataclasses.dataclass
class Rewriter:
    """What a rewrite reads: the graph, the analysis' labels, parameter shapes and aliases, and
    whether each atom survives."""

    graph: torch.fx.Graph
    labels: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    aliases: dict[str, str]
    atom_keep: torch.Tensor

    def new_shape(self, label: Any, node: torch.fx.Node) -> Any:
        """:func:`new_shape` of ``label`` (errors name ``node``)."""
        return new_shape(label, self.atom_keep, node.name)

    def kept_along(self, label: torch.Tensor, node: torch.fx.Node) -> list[torch.Tensor]:
        """:func:`kept_along` of ``label`` (errors name ``node``)."""
        return kept_along(label, self.atom_keep, node.name)

    def size(self, before: torch.fx.Node, size: Any, old: int, new: int) -> Any:
        """A size argument of a shape op whose dim goes from ``old`` to ``new`` entries.

        A literal becomes ``new``; a symbolic size (a node, with dynamic shapes: batch * heads,
        say) becomes ``size * new // old``, exact when the channels are a factor of it.
        """
        if not isinstance(size, torch.fx.Node):
            return size if not isinstance(size, int) or size == -1 else new
        if old == new:
            return size
        with self.graph.inserting_before(before):
            scaled = self.graph.call_function(operator.mul, (size, new))
            return self.graph.call_function(operator.floordiv, (scaled, old))


# ---------------------------------------------------------------------------------------------
# For resizers.

GRAPH_ROUTE = (
    "fprune.compact_graph(module, params, masks, structure, args, kwargs) removes the same "
    "channels by rewriting the sizes in the exported graph (no Python class, runs at any batch "
    "and sequence size)"
)


def where(name: str) -> str:
    """A submodule's name for a message."""
    return repr(name) if name else "the top module"


def whole_heads(width: int, head_dim: int, what: str, name: str) -> int:
    """The number of ``head_dim``-wide heads in ``width``; CompactError when not whole."""
    if width % head_dim:
        raise CompactError(
            f"{what} {where(name)} keeps a width of {width}, not a whole number of its "
            f"{head_dim}-wide heads. {GRAPH_ROUTE}."
        )
    return width // head_dim
