"""The tracing core: export a module once, propagate channel atoms, build the :class:`Structure`.

Every channel of every parameter dim, and every element of every activation that comes from one,
carries the id of an *atom*. :class:`Analysis` walks the exported ATen graph in order, asks the op
rules (:mod:`fprune.structure._rules`) for each node's output label, and collects what they learn:
atoms to merge (union-find), atoms pinned as unprunable, atoms marked inexact, attention heads.
At the end every set of merged atoms is one channel; :meth:`Analysis.structure` groups them by the
(parameter, dim, positions) they cover.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch

from fprune.structure._labels import ParamRef, compress, concrete, varies
from fprune.structure._rules import PASS_PARAMETER, pass_parameter, rule_of
from fprune.structure._types import Group, Member, Structure

__all__ = ["Analysis", "analyse", "groups", "check_call"]

_PAIR = 1 << 31  # atom ids stay below this (encoding pairs of atoms in one int64)


def groups(
    module: torch.nn.Module,
    args: Any = (),
    kwargs: dict | None = None,
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
        >>> members = [(m.param, m.dim) for m in g.members]
        >>> g.name, g.size, g.prunable, members  # doctest: +NORMALIZE_WHITESPACE
        ('0.weight:0', 8, True, [('0.weight', 0), ('0.bias', 0), ('1.weight', 0), ('1.bias', 0),
         ('3.weight', 1), ('1.running_mean', 0), ('1.running_var', 0)])
    """
    return analyse(module, args, kwargs, dynamic_shapes)[0]


def check_call(module: Any, args: Any, kwargs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` after checking the kinds of a module call's arguments."""
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


def _export(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any) -> Any:
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


def _aliases(module: torch.nn.Module) -> dict[str, str]:
    """Every parameter/buffer name -> the first name of the same tensor (what dedup keeps)."""
    first: dict[int, str] = {}
    names: dict[str, str] = {}
    for named in (
        module.named_parameters(remove_duplicate=False),
        module.named_buffers(remove_duplicate=False),
    ):
        for name, t in named:
            names[name] = first.setdefault(id(t), name)
    return names


def analyse(module: Any, args: Any, kwargs: Any, dynamic_shapes: Any) -> tuple[Structure, Analysis, Any]:
    """``(structure, analysis, exported_program)`` of one module call."""
    args, kwargs = check_call(module, args, kwargs)
    ep = _export(module, args, kwargs, dynamic_shapes)
    analysis = Analysis(ep, _aliases(module))
    analysis.run()
    return analysis.structure(), analysis, ep


class Analysis:
    """Channel-atom propagation over an ExportedProgram (see the module docstring).

    The methods below are the vocabulary of the op rules: making atoms (``new``, ``atoms_of``),
    merging them (``union``, ``union_all``, ``per_channel``), pinning and marking them (``pin``,
    ``pin_value``, ``mark_inexact``, ``mark_inexact_along``), turning values into labels
    (``label``, ``like_output``, ``empty_like_val``) and giving up on an op (``unknown``).
    """

    def __init__(self, ep: Any, aliases: dict[str, str]):
        self.ep = ep
        self.aliases = aliases
        sig = ep.graph_signature
        self.names: dict[str, str] = {}
        for placeholder, fqn in {**sig.inputs_to_parameters, **sig.inputs_to_buffers}.items():
            self.names[placeholder] = aliases.get(fqn, fqn)
        self.user_inputs = set(sig.user_inputs)
        self.count = 0  # atoms made so far
        self.edges: list[torch.Tensor] = []  # (2, n) pairs of atoms to merge
        self.pins: list[tuple[torch.Tensor, str]] = []
        self.inexact: list[tuple[torch.Tensor, str]] = []
        self.heads: list[torch.Tensor] = []
        self.param_atoms: dict[tuple[str, int], torch.Tensor] = {}
        self.entries: dict[str, tuple[torch.Tensor, str]] = {}  # parameter -> (atom per entry, first use)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.order: list[str] = []  # parameter / buffer names in graph order
        self.labels: dict[str, Any] = {}  # node name -> label value
        self.roots: torch.Tensor = torch.empty(0, dtype=torch.int64)
        self.vals: dict[str, Any] = {}

    # -- atoms ------------------------------------------------------------------------------
    def new(self, shape: Any) -> torch.Tensor:
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
        a, b = compress(*torch.broadcast_tensors(a, b))
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

    def per_channel(self, x: torch.Tensor, channel: int) -> torch.Tensor:
        """One atom per index along ``channel``: the atoms of each slice, merged."""
        cols = x.movedim(channel, 0).reshape(x.shape[channel], -1)
        rep = cols.amax(dim=1)
        self.union(cols, rep[:, None])
        return rep

    def pin(self, atoms: torch.Tensor, reason: str) -> None:
        flat = compress(atoms).reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel():
            self.pins.append((torch.unique(flat), reason))

    def mark_inexact(self, atoms: torch.Tensor, reason: str) -> None:
        flat = compress(atoms).reshape(-1)
        flat = flat[flat >= 0]
        if flat.numel():
            self.inexact.append((torch.unique(flat), reason))

    def mark_inexact_along(self, x: torch.Tensor, dim: int, reason: str) -> None:
        if varies(x, dim):
            self.mark_inexact(x, reason)

    # -- values -----------------------------------------------------------------------------
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
        # tokens x channels): one atom per entry; once atoms are merged, ``settle_entries``
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
                for out in outs if isinstance(outs, (list, tuple)) else [outs]:
                    if isinstance(out, torch.fx.Node):
                        self.pin_value(self.labels.get(out.name), "model output")
            elif node.op == "get_attr":
                self.labels[node.name] = None
        self.roots = self.rectangular()

    # -- every value stays a box ------------------------------------------------------------
    def boxed(self) -> list[tuple[str, torch.Tensor]]:
        """``(node, label)`` for every value whose atoms vary along 2 or more dims, each label
        cut to one index along the dims on which it is constant (the others need no check)."""
        found = []
        for name, label in self.labels.items():
            if not isinstance(label, torch.Tensor) or label.dim() < 2:
                continue
            x = compress(label)
            if sum(s > 1 for s in x.shape) >= 2:
                found.append((name, x))
        return found

    def rectangular(self) -> torch.Tensor:
        """The roots of every atom, after coupling (or pinning) channels so that any pruning of
        the prunable groups leaves every value a box.

        :func:`~fprune.structure.compact` keeps, along each dim of a value, the indices that
        hold a kept entry, so it can only rebuild values whose kept entries are the product of
        those per-dim sets. For every pruning of the groups that holds when each entry of a
        channel lies in a slice (along some dim) made of that channel's entries alone: pruning
        the channel then empties the slice. Where that fails (a channel shuffle's view splits
        the channels of two branches into ``(2, c/2)``), the channels that share slices along
        the dim needing the fewest merges become one channel (the shuffle pairs channel ``i``
        of each half); where no dim can do it (a slice mixing channels with entries that carry
        none), the channels are unprunable, with the node as the reason. Repeated until every
        value passes: merges and pins only ever make more slices pass.
        """
        boxes = self.boxed()
        settled: set[str] = set()
        while True:
            roots = self.components()
            merged = self.settle_entries(roots, settled)
            if not self.fix_boxes(boxes, roots) and not merged:
                return roots

    def settle_entries(self, roots: torch.Tensor, settled: set[str]) -> bool:
        """Parameters whose entries got an atom each (see :meth:`label`): where their channels
        now run along one dim only (each slice across it is one channel), that dim becomes a
        member; otherwise the parameter is used whole and every channel it touches is pinned.
        True when a member merged with atoms the dim already had (roots must be recomputed).
        """
        merged = False
        for name, (atoms, use) in self.entries.items():
            if name in settled:
                continue
            settled.add(name)
            r = roots[atoms]
            along = []
            for d in range(r.dim()):
                others = [k for k in range(r.dim()) if k != d]
                if r.shape[d] > 1 and bool((r.amax(dim=others) == r.amin(dim=others)).all()):
                    along.append(d)
            varying = [d for d in range(r.dim()) if r.shape[d] > 1 and varies(r, d)]
            if len(along) == 1 and varying == along:
                d = along[0]
                row = atoms.movedim(d, 0).reshape(atoms.shape[d], -1)[:, 0]
                if (name, d) in self.param_atoms:
                    self.union(self.param_atoms[(name, d)], row)
                    merged = True
                else:
                    self.param_atoms[(name, d)] = row
            else:  # channels along several dims, or one channel over the whole tensor
                reason = f"parameter {name} used whole by {use}: its channels run along no single dim"
                self.pin(atoms, reason)
                for d in varying:
                    if (name, d) in self.param_atoms:
                        self.pin(self.param_atoms[(name, d)], reason)
        return merged

    def fix_boxes(self, boxes: list[tuple[str, torch.Tensor]], roots: torch.Tensor) -> bool:
        """Couple or pin the channels of values in ``boxes`` that are not boxes; True if any."""
        pinned = torch.zeros(self.count, dtype=torch.bool)
        for atoms, _ in self.pins:
            pinned[roots[atoms]] = True
        changed = False
        for name, x in boxes:
            r = torch.where(x >= 0, roots[x.clamp(min=0)], -1)
            r = torch.where((r >= 0) & ~pinned[r.clamp(min=0)], r, -1)  # never pruned: as no channel
            if int(r.amax()) < 0:
                continue
            uniform = []  # per dim: which slices hold one prunable channel only
            ok = r < 0
            for d in range(r.dim()):
                others = [k for k in range(r.dim()) if k != d]
                hi, lo = r.amax(dim=others, keepdim=True), r.amin(dim=others, keepdim=True)
                uniform.append((hi == lo) & (lo >= 0))
                ok = ok | uniform[-1]
            bad = ~ok
            if not bool(bad.any()):
                continue
            changed = True
            best, best_cost = None, None
            for d in range(r.dim()):
                if r.shape[d] == 1:
                    continue
                others = [k for k in range(r.dim()) if k != d]
                hit = bad.any(dim=others)  # slices along d holding an entry to fix
                if bool((r.amin(dim=others)[hit] < 0).any()):
                    continue  # such a slice also holds entries that always stay
                cost = sum(
                    int(torch.unique(r.select(d, i)).numel()) - 1
                    for i in torch.nonzero(hit).reshape(-1).tolist()
                )
                if best_cost is None or cost < best_cost:
                    best, best_cost = d, cost
            if best is None:
                self.pin(
                    r[bad],
                    f"compact could not keep node {name} rectangular without them "
                    f"(its kept entries would not form a box)",
                )
                continue
            others = [k for k in range(r.dim()) if k != best]
            for i in torch.nonzero(bad.any(dim=others)).reshape(-1).tolist():
                piece = r.select(best, i)
                self.union(piece, piece.reshape(-1)[:1])
        return changed

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
        if op in PASS_PARAMETER and isinstance(args[0], ParamRef):
            return pass_parameter(args[0], op, args)
        rule = rule_of(op)
        if rule is None:
            return self.unknown(node, op, args, kwargs)
        return rule(self, node, op, args, kwargs)

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

    def root_flags(self, events: list[tuple[torch.Tensor, str]]) -> dict[int, str]:
        flags: dict[int, str] = {}
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
        aliases = tuple(sorted((a, n) for a, n in self.aliases.items() if a != n))
        shapes = tuple((name, self.shapes[name]) for name in self.order)
        if not members:
            return Structure((), aliases, shapes)
        # Every (root, member, position), sorted: each root's positions in each member.
        r = torch.cat([roots[self.param_atoms[key]] for key in members])
        j = torch.cat(
            [torch.full((len(self.param_atoms[key]),), i, dtype=torch.int64) for i, key in enumerate(members)]
        )
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
        per_root: dict[int, list[int]] = {}  # root -> its pair numbers
        for n, root in enumerate(pair_root):
            per_root.setdefault(root, []).append(n)
        buckets: dict[tuple, list[int]] = {}
        for root, pairs in per_root.items():
            sig = (
                tuple((pair_member[n], counts_list[n]) for n in pairs),
                root in pinned,
                root in inexact,
                root in head_roots,
            )
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
            built.append(
                (
                    (sig[0][0][0], first_p[first_pair[head]]),
                    Group(
                        name=f"{first.param}:{first.dim}",
                        size=len(rs),
                        members=tuple(group_members),
                        prunable=reason is None,
                        reason=reason,
                        exact=head not in inexact,
                        inexact_reason=inexact.get(head),
                        kind="head" if sig[3] else "channel",
                    ),
                )
            )
        built.sort(key=lambda item: item[0])
        seen: dict[str, int] = {}
        result = []
        for _, g in built:
            if g.name in seen:
                seen[g.name] += 1
                g = dataclasses.replace(g, name=f"{g.name}#{seen[g.name]}")
            else:
                seen[g.name] = 0
            result.append(g)
        return Structure(tuple(result), aliases, shapes)
