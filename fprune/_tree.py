"""Private pytree helpers: flattening with readable paths, matching trees, and leaf checks.

Every public function in fprune flattens its inputs here, so every error message about a
leaf names it the same way: ``params['fc1.weight']``, ``masks[0]['w']``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import optree
import torch

from fprune import _torch

#: A leaf picker: ``where(name, tensor) -> bool`` or ``where(tensor) -> bool`` (see :func:`predicate`).
Where = Callable[..., bool] | None


class Flat(NamedTuple):
    """A flattened pytree: its paths (tuples of keys), leaves and treespec."""

    paths: list
    leaves: list
    spec: Any


def describe(argname: str, path: Sequence[Any]) -> str:
    """``describe("params", ("fc", 0))`` -> ``"params['fc'][0]"``."""
    return argname + "".join(f"[{key!r}]" for key in path)


def dotted(path: Sequence[Any]) -> str:
    """The name a ``where`` predicate sees: path keys joined by dots (the key of a flat dict)."""
    return ".".join(str(key) for key in path)


# The trees that hold parameters (or the scores that stand for them in ``select``): their names
# must not be those of a hook-pruned model (see :func:`check_hook_names`).
PARAM_TREES = ("params", "scores")


def flatten(tree: Any, argname: str, *, hook_names: bool | None = None) -> Flat:
    """Flatten ``tree``; every leaf must be a tensor (``TypeError`` naming the leaf otherwise).

    A tree of parameters (``argname`` in :data:`PARAM_TREES`, or ``hook_names=True``) is also
    checked for names of a hook-pruned model (:func:`check_hook_names`); ``hook_names=False``
    skips that (``masked_call``, which checks against the module itself).
    """
    paths, leaves, spec = optree.tree_flatten_with_path(tree)
    for path, leaf in zip(paths, leaves, strict=True):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"Expected every leaf of {argname} to be a torch.Tensor, got "
                f"{type(leaf).__name__} at {describe(argname, path)}."
            )
        if leaf.layout != torch.strided:
            raise TypeError(
                f"Expected every leaf of {argname} to be a dense (strided) tensor, got a "
                f"{str(leaf.layout).removeprefix('torch.')} tensor at {describe(argname, path)}; "
                f"convert it with .to_dense()."
            )
    flat = Flat(list(paths), list(leaves), spec)
    if hook_names or (hook_names is None and argname in PARAM_TREES):
        check_hook_names(flat, argname)
    return flat


# torch.nn.utils.prune keeps a pruned tensor ``name`` as the parameter ``name + "_orig"`` and
# the buffer ``name + "_mask"``, and recomputes ``name`` from them before every forward.
HOOK_SUFFIX = "_orig"


def hook_base(name: str) -> str | None:
    """The name of the tensor a ``torch.nn.utils.prune`` hook recomputes from the parameter
    ``name`` (``"fc.weight"`` for ``"fc.weight_orig"``), or None when ``name`` is not of that form.

    >>> hook_base("fc.weight_orig"), hook_base("fc.weight"), hook_base("_orig")
    ('fc.weight', None, None)
    """
    last = name.rpartition(".")[2]
    if len(last) > len(HOOK_SUFFIX) and last.endswith(HOOK_SUFFIX):
        return name[: -len(HOOK_SUFFIX)]
    return None


def hook_names_error(where: str, base: str, how: str, by_name: bool = True) -> ValueError:
    """The error for a parameter named like a hook-pruned model's: ``where`` names it, ``base`` is
    the tensor the hook recomputes, ``how`` says how it was recognised (``by_name``: by its name
    alone, which a tensor of the user's own can share)."""
    own = (
        f" A tensor of your own whose name ends in {HOOK_SUFFIX!r} (torch.nn.utils.spectral_norm's "
        f"'weight_orig', say) must go under another key here."
        if by_name
        else ""
    )
    return ValueError(
        f"{where} is named like the parameter a torch.nn.utils.prune hook keeps ({how}): the "
        f"hook recomputes {base!r} from it and its {base + '_mask'!r} buffer before every "
        f"forward, so masks computed from (or applied to) it would ignore what the hooks pruned "
        f"and revive those entries. Expected params keyed like the unpruned model: "
        f"params, masks = fprune.compat.hooks_to_functional(model) gives them, with the hooks' "
        f"masks to pass as masks= (fprune.compat.strip_pruning(model) removes the hooks).{own}"
    )


def check_hook_names(flat: Flat, argname: str) -> None:
    """Refuse a leaf whose name ends in ``_orig`` (:func:`hook_base`): the key of a hook-pruned
    model's ``named_parameters()`` (``ValueError`` naming it and the way out).

    A tree carries no module, so its names are all there is to go by: the rule is the name alone.
    (:func:`fprune.masked_call` knows the module and refuses such a key only when the module has
    the hook's ``_mask`` buffer beside it.)
    """
    for path in flat.paths:
        if not (path and str(path[-1]).endswith(HOOK_SUFFIX)):
            continue  # the common case, decided without building the dotted name
        base = hook_base(dotted(path))
        if base is not None:
            raise hook_names_error(describe(argname, path), base, f"its name ends in {HOOK_SUFFIX!r}")


def check_values(flat: Flat, argname: str, traced: bool, bool_ok: bool = False) -> None:
    """Parameters to prune: not ``torch.bool`` (unless ``bool_ok``), and (in eager code) not on
    the ``meta`` device.

    A meta tensor has a shape but no values, so eager selection (which reads counts on the
    host) cannot rank it; under a transform nothing is read and meta tensors trace like fake
    ones.
    """
    for path, leaf in zip(flat.paths, flat.leaves, strict=True):
        if leaf.dtype == torch.bool and not bool_ok:
            raise TypeError(
                f"Expected {describe(argname, path)} to be a floating-point or integer tensor, "
                f"got dtype torch.bool (a mask? prior masks go in masks=)."
            )
        if not traced and leaf.device.type == "meta":
            raise ValueError(
                f"Expected {describe(argname, path)} to hold values, got a meta tensor (shape "
                f"{tuple(leaf.shape)}, no data): masks are computed from values. Load or "
                f"initialize the weights first (e.g. module.to_empty(device='cpu') and a "
                f"state_dict), or trace with fake tensors."
            )


def align(params: Flat, other: Any, argname: str) -> list:
    """Leaves of ``other`` lined up with the leaves of ``params``; ``None`` where ``other`` has none.

    ``other`` has the structure of ``params``, or is a part of it: a dict may leave keys out
    (``{"fc1.weight": m}`` for params with a bias too). Every leaf of ``other`` must sit at a
    path that ``params`` has, and have that leaf's shape.
    """
    flat = flatten(other, argname)
    if flat.spec == params.spec:
        matched = flat.leaves
    else:
        by_path = dict(zip(map(tuple, flat.paths), flat.leaves, strict=True))
        known = set(map(tuple, params.paths))
        extra = [path for path in by_path if path not in known]
        if extra:
            first = extra[0]
            others = [describe(argname, p) + nearest(p, params.paths) for p in extra[1:]]
            more = f" Other entries of {argname} not in params: {listing(others)}." if others else ""
            raise ValueError(
                f"{describe(argname, first)} has no matching entry in params"
                f"{nearest(first, params.paths)}; expected the structure of params or a part of "
                f"it (a dict may leave keys out).{more}"
            )
        matched = [by_path.get(tuple(path)) for path in params.paths]
    for path, leaf, ref in zip(params.paths, matched, params.leaves, strict=True):
        if leaf is not None and leaf.shape != ref.shape:
            raise ValueError(
                f"Expected {describe(argname, path)} to have the shape of "
                f"{describe('params', path)}, {tuple(ref.shape)}, got {tuple(leaf.shape)}."
            )
    return matched


def listing(items: Sequence[str], limit: int = 5) -> str:
    """``a, b, c`` for short lists, ``a, b, c, d, e and 7 more`` for long ones (errors stay short)."""
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def nearest(path: Sequence[Any], candidates: Sequence[Sequence[Any]], argname: str = "params") -> str:
    """`` (nearest in params: params['fc.weight'])``, or ``""`` when nothing is close (difflib)."""
    names = {dotted(c): c for c in candidates}
    close = difflib.get_close_matches(dotted(path), list(names), n=3, cutoff=0.5)
    if not close:
        return ""
    return f" (nearest in {argname}: {listing([describe(argname, names[c]) for c in close])})"


def check_scores(params: Flat, scores: Any, argname: str = "importance_scores", hint: str = "") -> list:
    """``scores`` leaves lined up with ``params``; same structure and shapes, real dtypes.

    ``argname`` names the argument in messages; ``hint`` ends the message for a missing leaf.
    """
    leaves = align(params, scores, argname)
    for path, leaf in zip(params.paths, leaves, strict=True):
        if leaf is None:
            missing = [describe("params", p) for p, x in zip(params.paths, leaves, strict=True) if x is None]
            raise ValueError(
                f"{argname} has no entry for {describe('params', path)}; expected the "
                f"structure of params (a score for every leaf). Missing: {listing(missing)}.{hint}"
            )
        if leaf.is_complex() or leaf.dtype == torch.bool:
            raise TypeError(
                f"Expected {describe(argname, path)} to be a real tensor (floating-point "
                f"or integer), got dtype {leaf.dtype}."
            )
    return leaves


def check_masks(params: Flat, masks: Any, traced: bool | None = None) -> list:
    """Prior ``masks`` as bool tensors lined up with ``params``; ``None`` where a dict leaves one out.

    Each mask follows :func:`check_mask_values`' rule (``traced`` as there; None: found here).
    """
    leaves = align_masks(params, masks)
    if traced is None:
        traced = _torch.is_traced([leaf for leaf in leaves if leaf is not None])
    check_mask_values(params, leaves, traced)
    return [None if leaf is None else as_bool(leaf) for leaf in leaves]


def align_masks(params: Flat, masks: Any, argname: str = "masks") -> list:
    """``masks`` lined up with ``params`` (:func:`align`), each of a real dtype (not complex).

    The dtype half of the mask rule (see :func:`check_mask_values`): metadata only, so it holds
    under every transform too. ``TypeError`` naming the mask otherwise.
    """
    leaves = align(params, masks, argname)
    for path, leaf in zip(params.paths, leaves, strict=True):
        if leaf is not None and leaf.is_complex():
            raise TypeError(
                f"Expected {describe(argname, path)} to be a torch.bool mask (True = kept) or 0/1 "
                f"values of a real dtype, got dtype {leaf.dtype}; convert it with .bool()."
            )
    return leaves


def check_mask_values(params: Flat, masks: list, traced: bool, argname: str = "masks") -> None:
    """The rule for masks: ``torch.bool`` (``True`` = kept), or the values 0 and 1 in a real dtype
    (torch.nn.utils.prune's float buffers hold 0/1 in the weight's dtype, which ``apply_masks``
    multiplies by without a conversion). Any other value (a float 0.5 would halve a weight, not
    prune it) raises ``ValueError`` naming the mask.

    ``masks`` comes from :func:`align_masks`. The values of the non-bool masks are read in eager
    code only, one host read per device for all of them (``traced``: none; a meta mask has no
    values to read), as a tensor ``amount`` is checked; bool masks need no read, nor does a
    mask checked before and unchanged since (same tensor, same version counter: a training
    loop's float masks are read on the first step only).
    """
    if traced:
        return
    by_device: dict = {}
    for i, leaf in enumerate(masks):
        if leaf is None or leaf.dtype == torch.bool or leaf.device.type == "meta":
            continue
        if not _checked(leaf):
            by_device.setdefault(leaf.device, []).append(i)
    for indices in by_device.values():
        # (m == 0) | (m == 1) everywhere; NaN fails both comparisons
        flags = torch.stack([((masks[i] == 0) | (masks[i] == 1)).all() for i in indices]).tolist()
        for i, good in zip(indices, flags, strict=True):
            if good:
                _remember(masks[i])
            else:
                bad = masks[i][(masks[i] != 0) & (masks[i] != 1)].reshape(-1)[:3].tolist()
                raise ValueError(
                    f"Expected {describe(argname, params.paths[i])} to hold only 0 and 1 (a "
                    f"{masks[i].dtype} mask: 1 = kept), got values such as {bad}; a fractional "
                    f"value would scale the weight, not prune it. Pass a torch.bool mask (e.g. "
                    f"mask > 0.5) or 0/1 values."
                )


# Non-bool masks whose values were checked, by id: (a weak reference, the version checked). A mask
# passed again unchanged (a training loop's float masks, every step) is not read again.
_CHECKED: dict = {}


def _checked(mask: torch.Tensor) -> bool:
    entry = _CHECKED.get(id(mask))
    return entry is not None and entry[0]() is mask and entry[1] == _torch.tensor_version(mask)


def _forget(key: int, _ref: object) -> None:
    _CHECKED.pop(key, None)


def _remember(mask: torch.Tensor) -> None:
    version = _torch.tensor_version(mask)
    if version is None:
        return
    key = id(mask)
    try:
        ref = weakref.ref(mask, functools.partial(_forget, key))
    except TypeError:  # a tensor type without weak references: checked every time
        return
    _CHECKED[key] = (ref, version)


def as_bool(mask: torch.Tensor) -> torch.Tensor:
    """A mask as ``torch.bool``: bool masks as they are, 0/1 masks of any other dtype as ``!= 0``."""
    return mask if mask.dtype == torch.bool else mask != 0


def predicate(where: Any) -> Callable[[str, Any], bool] | None:
    """``where`` as a ``(name, leaf) -> bool``, by the one rule every ``where=`` of fprune follows.

    ``where`` is None (every leaf), or a callable called as ``where(name, leaf)`` when it can take
    two positional arguments and as ``where(leaf)`` when it takes exactly one (``lambda p: p.dim()
    > 1``); one whose signature cannot be read (a builtin) gets the two-argument form. Anything
    else raises ``TypeError`` naming ``where``, before any work is done. ``name`` is the key of a
    flat dict, the dotted path otherwise.

    >>> predicate(lambda name, p: name == "w")("w", None), predicate(lambda p: p is None)("w", None)
    (True, True)
    """
    if where is None:
        return None
    if not callable(where):
        raise TypeError(
            f"Expected where to be None or a callable where(name, tensor) -> bool (or "
            f"where(tensor) -> bool), got {where!r}."
        )
    try:
        signature = inspect.signature(where)
    except (TypeError, ValueError):  # no signature to read (a builtin): the two-argument form
        return lambda name, leaf: _ask(where, name, (name, leaf))
    if _binds(signature, 2):
        return lambda name, leaf: _ask(where, name, (name, leaf))
    if _binds(signature, 1):
        return lambda name, leaf: _ask(where, name, (leaf,))
    raise TypeError(
        f"Expected where to take (name, tensor) or (tensor) and return a bool, got a callable "
        f"with signature {signature}: write it as where=lambda name, p: ... (name is the key of "
        f"a flat dict, the dotted path otherwise) or where=lambda p: ..."
    )


def _ask(where: Callable, name: str, args: tuple) -> bool:
    """``where(*args)`` as a bool; an error in it gets a note naming the leaf and the call form."""
    form = "where(name, tensor)" if len(args) == 2 else "where(tensor)"
    try:
        answer = where(*args)
    except Exception as error:
        error.add_note(
            f"Raised by {form} for the leaf {name!r}: a where that takes two arguments gets "
            f"(name, tensor), one that takes one argument gets the tensor only."
        )
        raise
    try:
        return bool(answer)
    except (RuntimeError, TypeError, ValueError) as error:
        raise TypeError(
            f"Expected {form} to return a bool for the leaf {name!r}, got "
            f"{type(answer).__name__} {_short(answer)} (a tensor of more than one value is not a "
            f"bool: where picks whole leaves; prune some entries of a leaf with masks= instead)."
        ) from error


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"of shape {tuple(value.shape)}"
    return repr(value)[:60]


def _binds(signature: inspect.Signature, count: int) -> bool:
    try:
        signature.bind(*([None] * count))
    except TypeError:
        return False
    return True


def selected(params: Flat, where: Where) -> list:
    """Which leaves ``where`` (:func:`predicate`'s rule) selects for pruning (all when None)."""
    picks = predicate(where)
    if picks is None:
        return [True] * len(params.leaves)
    return [picks(dotted(path), leaf) for path, leaf in zip(params.paths, params.leaves, strict=True)]


def unflatten(params: Flat, leaves: list) -> Any:
    """A tree with the structure of ``params`` holding ``leaves``."""
    return optree.tree_unflatten(params.spec, leaves)


def check_module_and_params(module: Any, params: Any) -> None:
    """The rule for a ``(module, params)`` pair that a function runs with ``functional_call``:
    a ``torch.nn.Module`` and a flat dict of name -> tensor; ``TypeError`` naming the argument."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(params, dict):
        raise TypeError(
            f"Expected params to be a flat dict of name -> tensor (as module.named_parameters() "
            f"gives), got {type(params).__name__}."
        )
