"""The module route of compacting: a smaller copy of the user's own module (:func:`compact`).

The copy is ``copy.deepcopy(module)`` with every parameter and buffer replaced, on the way, by
its kept slices (``deepcopy``'s memo maps each original tensor to its new one, so tied weights
stay tied and no dense tensor is copied). The module tree, the classes and their forward code
are the user's; what a layer holds besides its tensors (``in_features``, ``num_heads``, a
config) is updated by a *resizer*, a function that reads the layer's new parameter shapes and
sets its size attributes. Each lives with the op its layer is built on, in the op's ``layers``
(:mod:`fprune.structure._ops`); classes are keyed by the class itself or by
``"module.QualName"`` (so that the transformers entries need no import of transformers), and
subclasses use their nearest base's entry.

A forward that holds a size fprune does not know (a number in the code, an attribute no
resizer updates) would run wrong or fail on the smaller tensors, so :func:`compact` runs the
copy once on the example inputs and compares it with the masked model; it raises
:class:`CompactError`, naming the module, when they differ.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from fprune import _tree
from fprune._types import Masks, Params
from fprune.apply import apply_masks, masked_call
from fprune.structure._compact import Keep, kept_positions, shrink, warn_if_nothing_removed
from fprune.structure._masks import Leaves, check_structure
from fprune.structure._ops import find_resizer
from fprune.structure._ops._base import GRAPH_ROUTE, where
from fprune.structure._trace import check_call
from fprune.structure._types import CompactError, Structure

__all__ = ["compact", "CompactError"]


# ---------------------------------------------------------------------------------------------
# compact


def compact(
    module: nn.Module,
    params: Params,
    masks: Masks,
    structure: Structure,
    args: Any = (),
    kwargs: dict | None = None,
    *,
    allow_inexact: bool = False,
    tolerance: float | None = None,
) -> nn.Module:
    """A smaller copy of ``module``: its own class and forward, with the pruned channels removed.

    Returns ``copy.deepcopy(module)`` in which every parameter and buffer is replaced by its
    kept slices (the values of :func:`fprune.apply_masks` of ``params``: entries masked inside
    kept channels stay zeros; BatchNorm running statistics sliced too; tied weights stay tied)
    and the size attributes of known layers are updated (``nn.Linear``, ``nn.Conv1d/2d``
    including grouped and depthwise, BatchNorm, ``nn.LayerNorm``, ``nn.Embedding``,
    ``nn.MultiheadAttention``; transformers' ``Conv1D``, GPT-2 and BERT attention, Llama
    attention and MLP: the ops' ``layers``). A model with a transformers config gets the
    config fields that describe its new widths when every layer agrees (``intermediate_size``,
    ``n_inner``, Llama's head counts), so that ``save_pretrained`` / ``from_pretrained``
    round-trip; when the config cannot describe the model (per-layer widths, fewer GPT-2 or
    BERT heads) a warning says so (save it with ``torch.save(model)`` instead).

    The copy is an ordinary model: it runs at any input size, trains, saves with
    ``torch.save`` and ``state_dict``, and (transformers) generates. It keeps the training
    mode, hooks and ``requires_grad`` flags of ``module``, which is not changed.

    Before returning, the copy runs once on the example inputs in eval mode and must give the
    outputs of ``fprune.masked_call(module, params, masks, args, kwargs)``: every output
    tensor within ``tolerance * max(1, max|masked output|)`` (of the same shape only, when
    ``allow_inexact`` removed channels of an inexact group).

    Args:
        module: the dense model (not changed).
        params: its parameters (as given to :func:`group_structured`, a flat dict or a pytree
            with the same dotted names); tensors not in ``params`` come from the module.
        masks: the masks (from :func:`group_structured`, or any masks consistent with the
            groups).
        structure: from :func:`groups` on this module.
        args: example positional inputs (a tuple), as given to :func:`groups`.
        kwargs: example keyword inputs.
        allow_inexact: remove channels of inexact groups too. The outputs then differ from
            the masked model's by design, so the check compares their shapes only.
        tolerance: the largest allowed difference relative to ``max(1, max|output|)``; by
            default ``1e-5`` for float32 outputs (``1e-10`` float64, ``1e-2`` half precision).

    Returns:
        The smaller module (same class as ``module``).

    Raises:
        ValueError: inconsistent masks (the member is named), masks on unprunable or inexact
            groups, a parameter of a pruned group without a mask, a structure of another model.
        CompactError: (a ``ValueError``) a layer that cannot take its new sizes, or a copy
            whose forward fails or differs from the masked model on the example inputs (a
            size held in the code or in an attribute fprune does not update); the message
            names the module and points to :func:`compact_graph`.

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
        ...                           torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).eval()
        >>> x = torch.randn(2, 3, 8, 8)
        >>> s = fprune.structure.groups(net, (x,))
        >>> params = {k: v.detach() for k, v in net.named_parameters()}
        >>> masks = fprune.group_structured(params, 0.5, s)
        >>> small = fprune.compact(net, params, masks, s, (x,))
        >>> type(small).__name__, small[0].out_channels, small[1].num_features, small[3].in_channels
        ('Sequential', 4, 4, 4)
        >>> y = torch.randn(5, 3, 12, 12)  # any batch and image size
        >>> torch.allclose(small(y), fprune.masked_call(net, params, masks, (y,)), atol=1e-5)
        True
    """
    check_structure(structure)
    args, kwargs = check_call(module, args, kwargs)
    if tolerance is not None and (
        isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance > 0
    ):
        raise ValueError(f"Expected tolerance to be None or a positive number, got {tolerance!r}.")
    _check_module(module, structure)
    with torch.no_grad():
        leaves = Leaves(params, structure)
        parameters = {structure.canonical(n) for n, _ in module.named_parameters(remove_duplicate=False)}
        keep = kept_positions(leaves, masks, structure, allow_inexact, parameters)
        warn_if_nothing_removed(keep, stacklevel=2)
        masked = _tree.flatten(apply_masks(params, masks), "params").leaves
        small = _copy(module, structure, leaves, masked, keep)
    config_fields = _resize(small)
    _update_configs(small, config_fields, keep)
    reference = dict(zip(leaves.names, masked, strict=True))
    try:
        exact = not _inexact_removed(structure, keep)
        _verify(module, small, reference, args, kwargs, tolerance, values=exact)
    except CompactError as error:
        emptied = sorted({f"{p} dim {d}" for (p, d), along in keep.items() if not bool(along.any())})
        if not emptied:
            raise
        raise CompactError(
            f"The masks remove every channel along {', '.join(emptied[:4])}, and the model cannot "
            f"run some layers with no channel at all: keep at least one channel in every group "
            f"(a Global scope of group_structured can empty a whole group: pass "
            f"scope=fprune.select.Global(min_keep=...)). {error}"
        ) from error
    _check_config(small)
    return small


def _check_module(module: nn.Module, structure: Structure) -> None:
    """The structure must describe this module: its tensors have the shapes it was made with."""
    shapes = dict(structure.shapes)
    for named in (
        module.named_parameters(remove_duplicate=False),
        module.named_buffers(remove_duplicate=False),
    ):
        for name, t in named:
            want = shapes.get(structure.canonical(name))
            if want is not None and tuple(t.shape) != want:
                raise ValueError(
                    f"structure does not match this module: {name} has shape {tuple(t.shape)} "
                    f"here and {want} in the structure; make it with fprune.structure.groups on "
                    f"this model."
                )
    known = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    known.update(name for name, _ in module.named_buffers(remove_duplicate=False))
    missing = [name for name in shapes if name not in known]
    if missing:
        raise ValueError(
            f"structure does not match this module: it has no parameter or buffer {missing[0]!r}; "
            f"make the structure with fprune.structure.groups on this model."
        )


def _copy(module: nn.Module, structure: Structure, leaves: Leaves, masked: list, keep: Keep) -> nn.Module:
    """``deepcopy(module)`` with each parameter and buffer replaced by its kept slices."""
    given = {structure.canonical(name): t for name, t in zip(leaves.names, masked, strict=True)}
    originals = {t.data_ptr() for t in leaves.flat.leaves if t.numel()}
    memo: dict[int, Any] = {}
    for kind, named in (
        ("param", module.named_parameters(remove_duplicate=False)),
        ("buffer", module.named_buffers(remove_duplicate=False)),
    ):
        for name, t in named:
            if id(t) in memo:
                continue  # a tied alias: the same new tensor
            canonical = structure.canonical(name)
            source = given.get(canonical)
            value = shrink(t.detach() if source is None else source.detach(), canonical, keep)
            if value.numel() and (value.data_ptr() in originals or value.data_ptr() == t.data_ptr()):
                value = value.clone()  # never share memory with the dense model or params
            memo[id(t)] = nn.Parameter(value, requires_grad=t.requires_grad) if kind == "param" else value
    try:
        return copy.deepcopy(module, memo)
    except Exception as error:
        raise CompactError(
            f"compact copies the module with copy.deepcopy, which failed on "
            f"{type(module).__name__}: {type(error).__name__}: {error}. {GRAPH_ROUTE}."
        ) from error


def _resize(small: nn.Module) -> list[tuple[nn.Module, str, dict[str, Any]]]:
    """Run the resizer of every submodule; ``(owner, name, config fields)`` of those reporting."""
    reports = []
    for name, sub in small.named_modules():
        fn = find_resizer(type(sub))
        if fn is None:
            continue
        fields = fn(sub, name)
        if fields:
            reports.append((sub, name, fields))
    return reports


def _update_configs(
    small: nn.Module, reports: list[tuple[nn.Module, str, dict[str, Any]]], keep: Keep
) -> None:
    """Set a config field when every layer that reports it agrees on the value and one of them
    lost channels (a config whose model keeps its widths is left as it was).

    A layer's config is the ``config`` attribute of the layer or of its nearest parent that
    has one (transformers' MLP blocks hold none; their model does)."""
    shrunk = [param for (param, _), along in keep.items() if not bool(along.all())]
    modules = dict(small.named_modules())
    values: dict[tuple[int, str], set] = {}
    changed: set[tuple[int, str]] = set()
    configs: dict[int, Any] = {}
    for sub, name, fields in reports:
        config, prefix = getattr(sub, "config", None), name
        while config is None and prefix:
            prefix = prefix.rpartition(".")[0]
            config = getattr(modules[prefix], "config", None)
        if config is None:
            continue
        configs[id(config)] = config
        lost = any(param.startswith(name + ".") for param in shrunk) if name else bool(shrunk)
        for field, value in fields.items():
            values.setdefault((id(config), field), set()).add(value)
            if lost:
                changed.add((id(config), field))
    for (cid, field), seen in values.items():
        if len(seen) == 1 and (cid, field) in changed:
            setattr(configs[cid], field, next(iter(seen)))


# ---------------------------------------------------------------------------------------------
# The check: the copy computes what the masked model computes


@contextlib.contextmanager
def _eval(module: nn.Module) -> Iterator[None]:
    """Eval mode inside; every submodule's own training flag put back after."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def _tensors(out: Any, path: str = "output") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a (nested) output, with a readable path; other objects are skipped."""
    if isinstance(out, torch.Tensor):
        return [(path, out)]
    if isinstance(out, dict):  # transformers' ModelOutput is a dict too
        return [x for k, v in out.items() for x in _tensors(v, f"{path}[{k!r}]")]
    if isinstance(out, (list, tuple)):
        return [x for i, v in enumerate(out) for x in _tensors(v, f"{path}[{i}]")]
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        fields = dataclasses.fields(out)
        return [x for f in fields for x in _tensors(getattr(out, f.name), f"{path}.{f.name}")]
    return []


_TOLERANCE = {torch.float64: 1e-10, torch.float16: 1e-2, torch.bfloat16: 1e-2}


class _Stack:
    """The modules running in a forward (pre-hook pushes, hook pops): after an exception the
    stack still holds the module that raised and its callers."""

    def __init__(self, root: nn.Module):
        self.names: list[str] = []
        self.handles = []
        for name, sub in root.named_modules():
            self.handles.append(sub.register_forward_pre_hook(self._push(name)))
            self.handles.append(sub.register_forward_hook(self._pop))

    def _push(self, name: str) -> Callable:
        def hook(module: nn.Module, inputs: Any) -> None:
            self.names.append(name)

        return hook

    def _pop(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if self.names:
            self.names.pop()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _describe(small: nn.Module, names: list[str]) -> str:
    def one(name: str) -> str:
        kind = type(small.get_submodule(name)).__name__
        return f"module {name!r} ({kind})" if name else f"the top module ({kind})"

    if not names:
        return one("")
    text = one(names[-1])
    callers = [n for n in reversed(names[:-1]) if n != names[-1]]
    if callers:
        text += ", called from " + ", ".join(one(n) for n in callers)
    return text


def _unknown_shrunk(small: nn.Module, module: nn.Module) -> list[str]:
    """Submodules whose own tensors shrank but whose class has no resizer: suspects."""
    dense = dict(module.named_modules())
    found = []
    for name, sub in small.named_modules():
        if find_resizer(type(sub)) is not None or name not in dense:
            continue
        before = dict(dense[name].named_parameters(recurse=False))
        before.update(dense[name].named_buffers(recurse=False))
        for key, t in list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False)):
            if key in before and tuple(before[key].shape) != tuple(t.shape):
                found.append(f"{where(name)} ({type(sub).__name__})")
                break
    return found


def _hint(small: nn.Module, module: nn.Module) -> str:
    suspects = _unknown_shrunk(small, module)
    who = (
        f" Layers fprune has no resizer for, whose tensors shrank: {', '.join(suspects[:4])}."
        if suspects
        else ""
    )
    return (
        f" The copy runs the model's own forward code on smaller tensors: a size held as a "
        f"number in that code (x.view(-1, 64)) or in an attribute fprune does not update makes it "
        f"fail or differ.{who} {GRAPH_ROUTE}."
    )


def _inexact_removed(structure: Structure, keep: Keep) -> bool:
    """Whether ``keep`` removes channels of an inexact group (outputs then differ by design)."""
    for g in structure.groups:
        if g.exact:
            continue
        for m in g.members:
            along = keep.get((m.param, m.dim))
            if along is not None and not bool(along[m.index.reshape(-1).to(along.device)].all()):
                return True
    return False


def _verify(
    module: nn.Module,
    small: nn.Module,
    reference: dict,
    args: tuple,
    kwargs: dict,
    tolerance: float | None,
    values: bool = True,
) -> None:
    with torch.no_grad(), _eval(module):
        want = masked_call(module, reference, {}, args, kwargs)
    stack = _Stack(small)
    try:
        with torch.no_grad(), _eval(small):
            got = small(*args, **kwargs)
    except Exception as error:
        where = _describe(small, stack.names)
        raise CompactError(
            f"compact: the shrunk {type(small).__name__} fails on the example inputs in {where}: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}."
            + _hint(small, module)
        ) from error
    finally:
        stack.remove()
    got_t, want_t = _tensors(got), _tensors(want)
    if [p for p, _ in got_t] != [p for p, _ in want_t]:
        raise CompactError(
            f"compact: the shrunk {type(small).__name__} returns tensors at "
            f"{[p for p, _ in got_t][:6]}, the masked model at {[p for p, _ in want_t][:6]}."
            + _hint(small, module)
        )
    for (path, g), (_, w) in zip(got_t, want_t, strict=True):
        if g.shape != w.shape:
            raise CompactError(
                f"compact: the shrunk {type(small).__name__}'s {path} has shape {tuple(g.shape)}, "
                f"the masked model's {tuple(w.shape)}." + _hint(small, module)
            )
        if not values:
            continue  # inexact channels removed: the shapes must match, the values differ
        if not (g.is_floating_point() or g.is_complex()):
            if not torch.equal(g, w):
                raise CompactError(
                    f"compact: the shrunk {type(small).__name__}'s {path} differs from the masked "
                    f"model's." + _hint(small, module)
                )
            continue
        if g.numel() == 0:
            continue
        tol = tolerance if tolerance is not None else _TOLERANCE.get(w.dtype, 1e-5)
        scale = max(1.0, float(w.abs().max()))
        diff = float((g.to(w.dtype) - w).abs().max())
        if not diff <= tol * scale:  # NaN fails too
            raise CompactError(
                f"compact: the shrunk {type(small).__name__}'s {path} differs from the masked "
                f"model's by {diff:.3g} (allowed: {tol:g} x {scale:.3g})." + _hint(small, module)
            )


# ---------------------------------------------------------------------------------------------
# transformers: can the config rebuild this model?


def _check_config(small: nn.Module) -> None:
    """Warn when ``type(small)(small.config)`` would have other shapes (``from_pretrained``
    would fail to load the saved weights)."""
    config = getattr(small, "config", None)
    if config is None or not hasattr(small, "save_pretrained") or not hasattr(config, "to_dict"):
        return
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rebuilt = type(small)(copy.deepcopy(config))
    except Exception:  # a model that cannot be built from its config alone: nothing to say
        return
    shapes = {n: tuple(t.shape) for n, t in rebuilt.state_dict().items()}
    for name, t in small.state_dict().items():
        if name in shapes and shapes[name] != tuple(t.shape):
            warnings.warn(
                f"compact: the config of the compacted {type(small).__name__} cannot describe "
                f"its new widths ({name} is {tuple(t.shape)} here, {shapes[name]} in a model "
                f"built from the config: per-layer widths, or fewer heads where the config "
                f"derives the head size from the hidden size), so save_pretrained / "
                f"from_pretrained will not round-trip. Save it with torch.save(model) (load with "
                f"torch.load(path, weights_only=False)), or save its state_dict with the masks "
                f"and rebuild it with fprune.compact from the dense model.",
                UserWarning,
                stacklevel=3,
            )
            return
