"""Private pytree helpers: flattening with readable paths, matching trees, and leaf checks.

Every public function in fprune flattens its inputs here, so every error message about a
leaf names it the same way: ``params['fc1.weight']``, ``masks[0]['w']``.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, NamedTuple, Optional, Sequence

import optree
import torch

Where = Optional[Callable[[str, torch.Tensor], bool]]


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


def flatten(tree: Any, argname: str) -> Flat:
    """Flatten ``tree``; every leaf must be a tensor (``TypeError`` naming the leaf otherwise)."""
    paths, leaves, spec = optree.tree_flatten_with_path(tree)
    for path, leaf in zip(paths, leaves):
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
    return Flat(list(paths), list(leaves), spec)


def check_values(flat: Flat, argname: str, traced: bool, bool_ok: bool = False) -> None:
    """Parameters to prune: not ``torch.bool`` (unless ``bool_ok``), and (in eager code) not on
    the ``meta`` device.

    A meta tensor has a shape but no values, so eager selection (which reads counts on the
    host) cannot rank it; under a transform nothing is read and meta tensors trace like fake
    ones.
    """
    for path, leaf in zip(flat.paths, flat.leaves):
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
        by_path = dict(zip(map(tuple, flat.paths), flat.leaves))
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
    for path, leaf, ref in zip(params.paths, matched, params.leaves):
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


def nearest(
    path: Sequence[Any], candidates: Sequence[Sequence[Any]], argname: str = "params"
) -> str:
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
    for path, leaf in zip(params.paths, leaves):
        if leaf is None:
            missing = [describe("params", p) for p, x in zip(params.paths, leaves) if x is None]
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


def check_masks(params: Flat, masks: Any) -> list:
    """Prior ``masks`` as bool tensors lined up with ``params``; ``None`` where a dict leaves one out."""
    leaves = align(params, masks, "masks")
    return [None if leaf is None else as_bool(leaf) for leaf in leaves]


def as_bool(mask: torch.Tensor) -> torch.Tensor:
    """A mask as ``torch.bool``: bool masks as they are, 0/1 masks of any other dtype as ``!= 0``."""
    return mask if mask.dtype == torch.bool else mask != 0


def selected(params: Flat, where: Where) -> list:
    """Which leaves ``where(name, tensor)`` selects for pruning (all of them when ``where`` is None)."""
    if where is None:
        return [True] * len(params.leaves)
    if not callable(where):
        raise TypeError(
            f"Expected where to be None or a callable (name, tensor) -> bool, got {where!r}."
        )
    return [bool(where(dotted(path), leaf)) for path, leaf in zip(params.paths, params.leaves)]


def unflatten(params: Flat, leaves: list) -> Any:
    """A tree with the structure of ``params`` holding ``leaves``."""
    return optree.tree_unflatten(params.spec, leaves)
