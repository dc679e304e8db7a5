"""Physical shrinking: the kept slices of every tensor (:func:`compact_params`) and the graph
route, a smaller exported graph (:func:`compact_graph`). The module route, a smaller copy of the
user's module, is in :mod:`fprune.structure._module`.

Which positions survive along each member dim is computed once (:func:`kept_positions`) and used
both to slice the tensors and to rewrite the sizes the exported graph holds as literals.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from fprune import _tree
from fprune._types import Masks, Params
from fprune.apply import apply_masks
from fprune.structure._masks import Leaves, check_structure
from fprune.structure._ops import REWRITES, Rewriter
from fprune.structure._ops._base import new_shape
from fprune.structure._trace import Analysis, analyse, check_call
from fprune.structure._types import Member, Structure

__all__ = [
    "compact_graph",
    "compact_params",
    "kept_positions",
    "shrink",
    "auto_dynamic_shapes",
    "warn_if_nothing_removed",
]

Keep = dict[tuple[str, int], torch.Tensor]


def kept_positions(
    leaves: Leaves,
    masks: Any,
    structure: Structure,
    allow_inexact: bool,
    parameters: set[str] | None = None,
) -> Keep:
    """``(param, dim) -> keep`` (bool along that dim) for every member dim that loses channels.

    A channel is pruned where every member with a mask has all of its slices pruned; members
    without a mask (buffers, leaves a partial mask dict leaves out) follow the group. With
    ``parameters`` (the module's parameter names, for :func:`compact`), a parameter member
    without a mask raises instead: the masked model still uses its slices (a conv's bias
    feeds the next layer), so removing them would change the outputs.
    """
    matched: list[torch.Tensor | None] = _tree.check_masks(leaves.flat, masks)
    keep: Keep = {}
    for g in structure.groups:
        # (channels pruned, the member whose mask says so), and a member whose mask keeps nothing
        found: tuple[torch.Tensor, Member] | None = None
        emptied: tuple[torch.Tensor, Member] | None = None
        for m in g.members:
            i = leaves.first(m.param)
            mask = None if i is None else matched[i]
            if mask is None:
                continue  # no mask: the member follows the group
            if not bool(mask.any()):
                # A leaf with nothing kept: this group or another one emptied it, so on its
                # own it says nothing about this group.
                emptied = emptied or (mask, m)
                continue
            gone = ~m.slices(mask).any(dim=1)
            if found is None:
                found = (gone, m)
            elif not torch.equal(gone, found[0]):
                pruned, first = found
                c = int(torch.nonzero(gone != pruned)[0])
                who, other = (m, first) if bool(gone[c]) else (first, m)
                raise ValueError(
                    f"masks are not consistent with group {g.name}: "
                    f"masks[{who.param!r}] prunes all of channel {c} along dim {who.dim} but "
                    f"masks[{other.param!r}] keeps part of it along dim {other.dim}; prune "
                    f"groups with fprune.group_structured, or mask every member alike."
                )
        if found is None and emptied is not None and g.prunable and (g.exact or allow_inexact):
            # Every member with a mask is empty (a global scope or amount=1.0 removed the whole
            # group): all its slices are zeros, so removing every channel equals masking.
            found = (torch.ones(g.size, dtype=torch.bool, device=emptied[0].device), emptied[1])
        if found is None or not bool(found[0].any()):
            continue
        pruned, first = found
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
            if parameters is not None and m.param in parameters and (i is None or matched[i] is None):
                left_out = "" if i is not None else ", which params leaves out"
                raise ValueError(
                    f"masks prune channels of group {g.name} but have no mask for its member "
                    f"{m.param!r} (dim {m.dim}){left_out}: the masked model still uses those "
                    f"slices, so removing them would change the outputs. Mask every parameter "
                    f"of the group (fprune.group_structured does)."
                )
        for m in g.members:
            length = dict(structure.shapes)[m.param][m.dim]
            pos = m.positions(length, pruned.device)
            cut = (pos >= 0) & pruned[pos.clamp(min=0)]
            key = (m.param, m.dim)
            keep[key] = ~cut if key not in keep else keep[key] & ~cut
    return keep


def shrink(t: torch.Tensor, name: str, keep: Keep) -> torch.Tensor:
    for (param, dim), along in keep.items():
        if param == name:
            t = t.index_select(dim, torch.nonzero(along.to(t.device)).reshape(-1))
    return t


def compact_params(
    params: Params, masks: Masks, structure: Structure, *, allow_inexact: bool = False
) -> Params:
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
    check_structure(structure)
    leaves = Leaves(params, structure)
    keep = kept_positions(leaves, masks, structure, allow_inexact)
    return _tree.unflatten(leaves.flat, _shrunk(params, masks, structure, leaves, keep))


def _shrunk(params: Params, masks: Masks, structure: Structure, leaves: Leaves, keep: Keep) -> list:
    """The leaves of :func:`compact_params`, for positions ``keep`` already computed."""
    masked = _tree.flatten(apply_masks(params, masks), "params").leaves
    return [shrink(t, structure.canonical(name), keep) for t, name in zip(masked, leaves.names, strict=True)]


def auto_dynamic_shapes(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """``dynamic_shapes`` for ``torch.export`` making every dim of every tensor input dynamic
    (``Dim.AUTO``: export keeps a dim static where the model needs it so), except dims of size 0
    or 1 in the example, which export would specialize anyway. None when there is no tensor
    input, or (with a warning) when a tensor goes in through ``**kwargs``: torch 2.13's export
    takes no dynamic shapes for those, so the whole graph keeps the example's shapes."""
    auto = torch.export.Dim.AUTO

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):  # sizes 0 and 1 would be specialized anyway (warned)
            return {d: auto for d in range(value.dim()) if value.shape[d] > 1}
        if isinstance(value, (list, tuple)):
            items = [spec(v) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(value, dict):
            return {k: spec(v) for k, v in value.items()}
        return None

    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    kinds = {name: param.kind for name, param in bound.signature.parameters.items()}
    through = [
        f"{name}[{key!r}]"
        for name, value in bound.arguments.items()
        if kinds[name] is inspect.Parameter.VAR_KEYWORD
        for key, v in value.items()
        if _has_tensor(v)
    ]
    if through:
        warnings.warn(
            f"compact_graph: the tensor input {through[0]} goes through **{through[0].split('[')[0]} "
            f"of {type(module).__name__}.forward, where torch.export takes no dynamic shapes; the "
            f"graph runs at the example's shapes only. fprune.compact (the module route) runs at "
            f"any size.",
            UserWarning,
            stacklevel=3,
        )
        return None
    specs = {name: spec(value) for name, value in bound.arguments.items()}
    return specs if _has_tensor(list(bound.arguments.values())) else None


def _copied(value: Any) -> Any:
    """``value`` with every tensor in it (in lists, tuples and dicts) cloned."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        items = [_copied(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    return False


def compact_graph(
    module: torch.nn.Module,
    params: Params,
    masks: Masks,
    structure: Structure,
    args: Any = (),
    kwargs: dict | None = None,
    *,
    allow_inexact: bool = False,
    dynamic_shapes: Any = "auto",
) -> torch.fx.GraphModule:
    """A smaller model as an exported graph: ``module``'s ATen graph with pruned channels removed.

    The graph route; :func:`compact` (the module route) returns the user's own class instead.
    Exports ``module`` (in eval mode, on the example inputs; its last export is reused as
    :func:`~fprune.structure.groups` says), checks that its structure is ``structure``, slices
    every parameter and buffer (BatchNorm running statistics included) and rewrites the channel
    sizes that the graph holds as literals (``view``/``reshape``/``unflatten``
    sizes, ``split`` sizes, ``layer_norm`` shapes, depthwise ``groups``, ``slice`` bounds), so
    it needs no knowledge of the model's classes. For exact groups its outputs equal
    ``fprune.masked_call(module, params, masks, args, kwargs)``; the rewritten graph runs once on
    the example, and every value's shape is checked.

    By default every dim of every tensor input is dynamic (``torch.export.Dim.AUTO``), so the
    graph runs at other batch, sequence and image sizes. What export still fixes: the set of
    keyword inputs and which are None (a GPT-2 exported without ``attention_mask`` takes none
    later), Python values (``use_cache=False``), dtypes, devices and ranks, dims of size 0 or 1
    in the example (use sizes of 2 or more), and dims the model ties to a constant. Each call
    checks these guards. When a tensor input goes through ``**kwargs`` (torch 2.13's export
    takes no dynamic shapes there), or export cannot trace the model with dynamic sizes, the
    graph is exported at the example's shapes, with a warning.

    The result is a ``torch.fx.GraphModule``: no ``.eval()``/``.train()`` (it always runs in
    eval mode), no ``generate``. Its ``state_dict`` keeps the original names with smaller
    shapes; ``torch.export.export(small, args, kwargs)`` gives a program that
    ``torch.export.save`` writes and ``torch.export.load`` reads without fprune.

    Args:
        module: the dense model.
        params: its parameters (as given to :func:`group_structured`); values not in ``params``
            come from the module.
        masks: the masks.
        structure: from :func:`groups` on this module.
        args: example positional inputs (a tuple), as given to :func:`groups`.
        kwargs: example keyword inputs.
        allow_inexact: remove channels of inexact groups too (outputs then differ).
        dynamic_shapes: ``"auto"`` (every tensor dim dynamic), None (the example's shapes
            only) or a ``dynamic_shapes`` for ``torch.export.export``.

    Returns:
        The GraphModule, holding the small parameters.

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
        >>> small = fprune.compact_graph(net, params, masks, s, (x,))
        >>> small.get_parameter("3.weight").shape
        torch.Size([4, 4, 3, 3])
        >>> y = torch.randn(5, 3, 12, 12)  # another batch and image size
        >>> torch.allclose(small(y), fprune.masked_call(net, params, masks, (y,)), atol=1e-5)
        True
    """
    check_structure(structure)
    args, kwargs = check_call(module, args, kwargs)
    if isinstance(dynamic_shapes, str):
        if dynamic_shapes != "auto":
            raise ValueError(
                f"Expected dynamic_shapes to be 'auto', None or torch.export's dynamic_shapes, "
                f"got {dynamic_shapes!r}."
            )
        # Export marks the tensors it makes dynamic (and leaves the marks when it fails): it
        # gets copies, so the caller's tensors stay as they were.
        copied_args, copied_kwargs = _copied((args, kwargs))
        try:
            fresh, analysis, ep = analyse(
                module, copied_args, copied_kwargs, auto_dynamic_shapes(module, copied_args, copied_kwargs)
            )
        except RuntimeError as error:  # export failed with dynamic shapes: try the example's
            fresh, analysis, ep = analyse(module, args, kwargs, None)
            warnings.warn(
                f"compact_graph: torch.export could not make the input sizes dynamic "
                f"({error.__cause__ or error}); the graph runs at the example's shapes only. "
                f"fprune.compact (the module route) runs at any size.",
                UserWarning,
                stacklevel=2,
            )
    else:
        fresh, analysis, ep = analyse(module, args, kwargs, dynamic_shapes)
    if fresh.key() != structure.key():
        raise ValueError(
            "structure does not match this module and these inputs (its groups differ from "
            "fprune.structure.groups(module, args, kwargs)); make it from the same model."
        )
    leaves = Leaves(params, structure)
    parameters = {structure.canonical(n) for n, _ in module.named_parameters(remove_duplicate=False)}
    keep = kept_positions(leaves, masks, structure, allow_inexact, parameters)
    warn_if_nothing_removed(keep, stacklevel=2)
    small_leaves = _shrunk(params, masks, structure, leaves, keep)
    by_canonical = {structure.canonical(k): v for k, v in zip(leaves.names, small_leaves, strict=True)}

    # The program holds the module's own tensors (a kept export is reused only while they are
    # the same objects), so values not in params are the module's as they are now.
    gm = ep.module()
    # New tensors: one per original tensor (tied names share it).
    replaced: dict[int, torch.Tensor] = {}
    for kind, named in (
        ("param", gm.named_parameters(remove_duplicate=False)),
        ("buffer", gm.named_buffers(remove_duplicate=False)),
    ):
        for name, t in list(named):
            canonical = structure.canonical(name)
            if id(t) not in replaced:
                new = by_canonical.get(canonical)
                if new is None:
                    new = shrink(t.detach(), canonical, keep)
                new = new.detach().clone()
                if kind == "param":
                    new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                replaced[id(t)] = new
            _set_tensor(gm, name, replaced[id(t)], kind)

    atom_keep = _atom_keep(analysis, keep)
    _rewrite(gm, analysis, atom_keep)
    gm.recompile()
    try:
        _check_run(gm, analysis, atom_keep, args, kwargs)
    except ValueError as error:
        emptied = sorted({f"{p} dim {d}" for (p, d), along in keep.items() if not bool(along.any())})
        if not emptied:
            raise
        raise ValueError(
            f"The masks remove every channel along {', '.join(emptied[:4])}, and torch cannot "
            f"run some layers with no channel at all (a conv, for one): keep at least one channel "
            f"in every group (a Global scope of group_structured can empty a whole group: pass "
            f"scope=fprune.select.Global(min_keep=...)). {error}"
        ) from error
    return gm


def warn_if_nothing_removed(keep: Keep, stacklevel: int) -> None:
    """Warn (once per call) when the masks remove no channel at all."""
    if not any(not bool(along.all()) for along in keep.values()):
        warnings.warn(
            "compact: the masks remove no channel (no group has a channel pruned in every one "
            "of its members), so the result has the sizes of the dense model. Masks from "
            "fprune.group_structured remove whole channels; unstructured masks only zero "
            "entries, which compact keeps as zeros.",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def _set_tensor(gm: torch.nn.Module, name: str, value: torch.Tensor, kind: str) -> None:
    prefix, _, leaf = name.rpartition(".")
    owner = gm.get_submodule(prefix) if prefix else gm
    if kind == "param":
        # torch types _parameters as Parameter-valued; the rewritten graph module holds plain tensors.
        owner._parameters[leaf] = value  # type: ignore[assignment]
    else:
        owner._buffers[leaf] = value


def _atom_keep(analysis: Analysis, keep: Keep) -> torch.Tensor:
    """Whether each atom survives: its root is not a pruned channel."""
    roots = analysis.roots
    root_keep = torch.ones(analysis.count, dtype=torch.bool)
    for key, along in keep.items():
        atoms = analysis.param_atoms.get(key)
        if atoms is not None:
            root_keep[roots[atoms[~along]]] = False
    return root_keep[roots]


def _rewrite(gm: torch.fx.GraphModule, analysis: Analysis, atom_keep: torch.Tensor) -> None:
    """Rewrite the channel sizes that the graph holds as literals: each node's op's rewrite."""
    rw = Rewriter(gm.graph, analysis.labels, analysis.shapes, analysis.aliases, atom_keep)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.name not in analysis.labels:
            continue
        op: str = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
        rewrite = REWRITES.get(op)
        if rewrite is not None:
            rewrite(rw, node, op, analysis.labels[node.name])


def _check_run(
    gm: torch.fx.GraphModule, analysis: Analysis, atom_keep: torch.Tensor, args: tuple, kwargs: dict
) -> None:
    """Run the rewritten graph once and check every value's shape; name the first that differs."""
    labels = analysis.labels

    class Checker(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            label = labels.get(n.name)
            if (
                n.op == "call_function"
                and isinstance(result, torch.Tensor)
                and isinstance(label, torch.Tensor)
            ):
                want = new_shape(label, atom_keep, n.name)
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
