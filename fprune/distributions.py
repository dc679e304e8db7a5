"""Sparsity distributions: how much of each leaf to prune for an overall target.

Each function returns a pytree shaped like ``params`` holding one Python float per selected
leaf, the fraction of that leaf to prune, and ``None`` for the leaves ``where`` does not select,
to be passed as a per-leaf ``amount`` to the local mask functions, where ``None`` means "not
pruned": the leaf is skipped, so, for example, ``ln_structured`` never checks a skipped bias's
dims. (optree treats ``None`` as an empty subtree, so ``optree.tree_map`` over the result skips
those leaves; fprune reads per-leaf amounts with its own walk, where ``None`` is a leaf.)
``uniform`` and ``erk`` read only shapes, never values, so they work on any params (also inside
``vmap``, where they see each member's shapes); ``owl`` reads weights and calibration norms
(eager only).

The fractions are of each leaf's *whole* size, and ``sparsity`` is a fraction of all selected
entries: ``sum(amount[i] * numel[i]) == sparsity * sum(numel[i])`` up to floating-point error,
so that once each leaf's count is rounded (``round(amount * numel)``) the pruned total is within
half an entry per leaf of ``sparsity`` times the total.

``where=None`` selects every leaf, as everywhere in fprune; pass
``where=lambda name, p: p.dim() > 1`` to leave biases and normalization weights dense, as
RigL and jaxpruner do by default.
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from fprune import _observe, _tree
from fprune._types import Params

__all__ = ["erk", "owl", "uniform"]


def uniform(params: Params, sparsity: float, *, where: _tree.Where = None) -> Any:
    """The same fraction ``sparsity`` for every selected leaf.

    Args:
        params: a pytree of tensors (only their shapes are used).
        sparsity: the fraction to prune, a float in [0, 1].
        where: ``where(name, tensor) -> bool`` picks the leaves to prune (all when ``None``);
            the others get ``None`` (not pruned).

    Returns:
        A pytree like ``params`` of Python floats (``None`` for the leaves not selected).

    Raises:
        TypeError / ValueError: on a bad ``sparsity``, ``where`` or non-tensor leaves.

    Example:
        >>> import torch, fprune
        >>> params = {"fc.weight": torch.zeros(4, 3), "fc.bias": torch.zeros(4)}
        >>> fprune.distributions.uniform(params, 0.5, where=lambda name, p: p.dim() > 1)
        {'fc.weight': 0.5, 'fc.bias': None}
    """
    flat = _tree.flatten(params, "params")
    sparsity = _check_sparsity(sparsity)
    chosen = _tree.selected(flat, where)
    return _tree.unflatten(flat, [sparsity if c else None for c in chosen])


def erk(params: Params, sparsity: float, *, where: _tree.Where = None, power_scale: float = 1.0) -> Any:
    """Erdős-Rényi-Kernel fractions (Evci et al. 2020, RigL): thin layers keep more.

    The density (fraction kept) of a selected leaf of shape ``(d_1, ..., d_k)`` is
    ``eps * ((d_1 + ... + d_k) / (d_1 * ... * d_k)) ** power_scale``, kernel dimensions
    included, with one ``eps`` for all leaves chosen so that the selected leaves keep
    ``(1 - sparsity)`` of their entries in all. A leaf whose density would exceed 1 is kept
    dense (``0.0``) and ``eps`` is solved again for the others, until every density is at most 1
    (RigL's ``get_sparsities_erdos_renyi``, which jaxpruner copies, without its rounding of each
    layer's count). ``power_scale < 1`` makes the distribution flatter (``0`` is uniform). A
    0-dim leaf counts as shape ``(1,)``; empty leaves get ``0.0``.

    Args:
        params: a pytree of tensors (only their shapes are used).
        sparsity: the fraction of all selected entries to prune, a float in [0, 1].
        where: picks the leaves to prune (all when ``None``); the others get ``None`` (not
            pruned) and do not count towards the total.
        power_scale: a non-negative exponent for the raw ERK ratio.

    Returns:
        A pytree like ``params`` of Python floats in [0, 1] (``None`` for the leaves not
        selected).

    Raises:
        TypeError / ValueError: on a bad ``sparsity``, ``power_scale``, ``where`` or leaves.

    Example:
        >>> import torch, fprune
        >>> params = {"a": torch.zeros(4, 4), "b": torch.zeros(100, 100)}
        >>> amounts = fprune.distributions.erk(params, 0.9)
        >>> amounts["a"] < amounts["b"]                  # the small layer is pruned less
        True
        >>> round(amounts["a"] * 16 + amounts["b"] * 10000, 6) == round(0.9 * 10016, 6)
        True
    """
    flat = _tree.flatten(params, "params")
    sparsity = _check_sparsity(sparsity)
    power_scale = _check_power_scale(power_scale)
    chosen = _tree.selected(flat, where)
    shapes = [
        (tuple(p.shape) or (1,)) if c and p.numel() > 0 else None
        for p, c in zip(flat.leaves, chosen, strict=True)
    ]
    fractions = _erk_fractions(shapes, sparsity, power_scale)
    return _tree.unflatten(flat, _unselected_as_none(fractions, chosen))


@torch.no_grad()
def owl(
    params: Params,
    norms: dict[str, torch.Tensor],
    sparsity: float,
    *,
    blocks: Callable[[str], Hashable | None] | Mapping[str, Hashable] | None = None,
    m: float = 5.0,
    lam: float = 0.08,
    where: _tree.Where = None,
    module: torch.nn.Module | None = None,
) -> Any:
    """OWL's per-block sparsities: blocks with more outlier weights are pruned less (Yin et al. 2024).

    For each block ``b`` (the selected leaves it groups), the outlier ratio ``r_b`` is the share
    of the entries of ``|W| * norm`` (Wanda's score, over all the block's selected weights
    together) above ``m`` times their mean. The ratios are min-max scaled to
    ``[0, 2 * lam]``: ``s_b = 2 * lam * (r_b - min r) / (max r - min r)`` (all ``0`` when every
    block has the same ratio), and every selected leaf of block ``b`` gets the amount
    ``sparsity - s_b + mean(s)``, clipped to ``[0, 1]`` (a ``UserWarning`` says when clipping
    moved the mean away from ``sparsity``). This is luuyin/OWL's ``prune_wanda_outlier`` /
    ``prune_sparsegpt_outlier`` (``M`` = ``Hyper_m`` = 5, ``Lamda`` = 0.08) and llm-compressor's
    ``_infer_owl_layer_sparsity``, whose norms are ``sqrt(sum x^2)`` over the calibration
    tokens as :func:`fprune.calibration.input_norms` gives them (llm-compressor adds up one norm
    per batch instead; any positive scale of all norms gives the same ratios). The mean of the
    amounts over blocks is ``sparsity``; weighted by block sizes, as the total pruned, it is
    ``sparsity`` when the blocks have equal sizes (a transformer's blocks).

    A 2-d weight's norms must be ``(1, cols)`` or ``(rows, 1)``, as
    :func:`fprune.calibration.input_norms` gives them, finite and non-negative.

    Args:
        params: a pytree of tensors (a flat dict keyed like ``named_parameters()``).
        norms: ``{weight name: norms}`` as :func:`fprune.calibration.input_norms` gives them,
            from the dense model (broadcastable to the weight; ``(1, in)`` or ``(in, 1)``).
        sparsity: the target fraction to prune, a float in [0, 1].
        blocks: a leaf's block: a callable ``name -> key`` (``None``: no block) or a mapping
            ``{name: key}``. Default: the first integer in the name (``transformer.h.3.attn``
            is block 3; a name without a number has no block).
        m: the outlier threshold, a multiple of each block's mean score (``M``, 5).
        lam: half the spread of the sparsities (``Lamda``, 0.08: from ``sparsity - 0.08`` to
            ``sparsity + 0.08``).
        where: ``where(name, tensor) -> bool`` picks the leaves; default: every leaf named in
            ``norms``. A picked leaf must have norms and a block.
        module: the model the params belong to (optional): each norm's orientation is then
            checked against its layer, ``(1, in)`` for ``nn.Linear`` (weight ``(out, in)``) and
            ``(in, 1)`` for transformers' ``Conv1D`` (weight ``(in, out)``); without it a
            square weight cannot tell its norms from transposed ones.

    Returns:
        A pytree like ``params`` of Python floats (``None`` for the leaves not selected): per-leaf
        amounts for any fprune function that takes them, and for :func:`fprune.oneshot.prune`.

    Raises:
        TypeError / ValueError: bad arguments (``m <= 0``, ``lam < 0``); a selected leaf without
            norms or without a block (by default a leaf whose name holds no integer); norms of
            another shape (or orientation, with ``module``), NaN, inf or negative; a selected
            weight holding NaN or inf.

    Warns:
        UserWarning: amounts clipped to [0, 1].

    Example:
        >>> import torch, fprune
        >>> params = {"h.0.fc.weight": torch.ones(2, 8), "h.1.fc.weight": torch.ones(2, 8),
        ...           "h.0.fc.bias": torch.ones(2)}
        >>> norms = {"h.0.fc.weight": torch.ones(1, 8),
        ...          "h.1.fc.weight": torch.tensor([[1.0] * 7 + [100.0]])}  # an outlier feature
        >>> fprune.distributions.owl(params, norms, 0.7)   # block 1 has outliers: pruned less
        {'h.0.fc.weight': 0.78, 'h.1.fc.weight': 0.62, 'h.0.fc.bias': None}
    """
    flat = _tree.flatten(params, "params")
    sparsity = _check_sparsity(sparsity)
    if not isinstance(norms, dict):
        raise TypeError(
            f"Expected norms to be a dict of weight name -> norms (fprune.calibration.input_norms), "
            f"got {type(norms).__name__}."
        )
    for name, value in (("m", m), ("lam", lam)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TypeError(f"Expected {name} to be a finite float, got {value!r}.")
    if m <= 0:
        raise ValueError(f"Expected m > 0 (the outlier threshold, a multiple of the mean score), got {m!r}.")
    if lam < 0:
        raise ValueError(f"Expected lam >= 0, got {lam!r}.")
    block_of = _block_function(blocks)
    layouts = _layouts(module)
    names = [_tree.dotted(path) for path in flat.paths]
    unknown = sorted(set(norms) - set(names))
    if unknown:
        raise ValueError(
            f"norms has entries for {_tree.listing([repr(n) for n in unknown])}, which name no leaf "
            f"of params."
        )
    if where is None:
        chosen = [n in norms for n in names]
    else:
        chosen = _tree.selected(flat, where)
    groups: dict[Hashable, list[int]] = {}
    for i, (name, picked) in enumerate(zip(names, chosen, strict=True)):
        if not picked:
            continue
        if name not in norms:
            raise ValueError(
                f"owl: params[{name!r}] is selected but has no norms; pass its input norms "
                f"(fprune.calibration.input_norms) or leave it out with where=."
            )
        block = block_of(name)
        if block is None:
            why = "its name holds no block number" if blocks is None else "blocks gave None"
            raise ValueError(
                f"owl: params[{name!r}] is selected but belongs to no block ({why}); give it one "
                f"with blocks= or leave it out with where= (or out of norms)."
            )
        groups.setdefault(block, []).append(i)
    ratios = {}
    for block, members in groups.items():
        scores = []
        for i in members:
            weight, norm = flat.leaves[i], norms[names[i]]
            _check_norm(names[i], weight, norm, layouts.get(names[i]))
            try:
                score = weight.detach().abs().double() * norm.detach().double()
            except RuntimeError as error:
                raise ValueError(
                    f"Expected norms[{names[i]!r}] to broadcast to the shape of params[{names[i]!r}], "
                    f"{tuple(weight.shape)}, got {tuple(norm.shape)}."
                ) from error
            scores.append(score.reshape(-1))
        joined = torch.cat(scores)
        ratios[block] = float((joined > m * joined.mean()).double().mean()) if joined.numel() else 0.0
    amounts = _owl_amounts(ratios, sparsity, lam)
    clipped = {b: min(1.0, max(0.0, a)) for b, a in amounts.items()}
    if clipped != amounts:
        warnings.warn(
            f"owl: some block sparsities fell outside [0, 1] (sparsity={sparsity}, lam={lam}) and "
            f"were clipped; the mean over blocks is "
            f"{sum(clipped.values()) / len(clipped):.4f} instead of {sparsity}.",
            UserWarning,
            stacklevel=3,
        )
    out = [None] * len(flat.leaves)
    for block, members in groups.items():
        for i in members:
            out[i] = clipped[block]
    return _tree.unflatten(flat, out)


def _layouts(module: Any) -> dict[str, bool]:
    """``{weight name: transposed}`` of a module's linear layers (``True``: a ``Conv1D``)."""
    if module is None:
        return {}
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be None or a torch.nn.Module, got {type(module).__name__}.")
    return {layer.name: layer.transposed for layer in _observe.linear_layers(module, {}, None)}


def _check_norm(name: str, weight: torch.Tensor, norm: Any, transposed: bool | None) -> None:
    if not isinstance(norm, torch.Tensor):
        raise TypeError(f"Expected norms[{name!r}] to be a tensor, got {type(norm).__name__}.")
    if weight.dim() == 2:
        rows, cols = weight.shape
        shapes = {False: (1, cols), True: (rows, 1)}
        allowed = [shapes[transposed]] if transposed is not None else list(shapes.values())
        if tuple(norm.shape) not in allowed:
            layout = {None: "", False: " (an nn.Linear: one norm per input, a row)"}.get(
                transposed, " (a Conv1D: weight (in, out), one norm per input, a column)"
            )
            raise ValueError(
                f"Expected norms[{name!r}] of shape {' or '.join(map(str, allowed))} for "
                f"params[{name!r}] of shape {tuple(weight.shape)}{layout}, got {tuple(norm.shape)} "
                f"(fprune.calibration.input_norms gives them so; transposed norms would weigh "
                f"the outputs)."
            )
    if not bool(torch.isfinite(norm).all()) or bool((norm < 0).any()):
        raise ValueError(
            f"Expected norms[{name!r}] to be finite and non-negative, got NaN, inf or a negative value."
        )
    if not bool(torch.isfinite(weight).all()):
        raise ValueError(f"Expected params[{name!r}] to hold finite values only, got NaN or inf.")


def _owl_amounts(ratios: dict, sparsity: float, lam: float) -> dict:
    """``sparsity - s_b + mean(s)`` with ``s`` the ratios min-max scaled to ``[0, 2 lam]``."""
    if not ratios:
        return {}
    low, high = min(ratios.values()), max(ratios.values())
    scaled = {b: 0.0 if high == low else (r - low) / (high - low) * 2.0 * lam for b, r in ratios.items()}
    mean = sum(scaled.values()) / len(scaled)
    return {b: round(sparsity - s + mean, 12) for b, s in scaled.items()}


owl_amounts = _owl_amounts  # package-internal: fprune.oneshot.prune_pretrained's OWL, block by block


_FIRST_INTEGER = re.compile(r"\d+")


def _block_function(blocks: Any) -> Callable[[str], Hashable | None]:
    if blocks is None:

        def first_integer(name: str) -> int | None:
            found = _FIRST_INTEGER.search(name)
            return None if found is None else int(found.group(0))

        return first_integer
    if isinstance(blocks, Mapping):
        return lambda name: blocks.get(name)
    if callable(blocks):
        return blocks
    raise TypeError(
        f"Expected blocks to be None, a callable name -> block or a mapping {{name: block}}, got {blocks!r}."
    )


def _unselected_as_none(fractions: list[float], chosen: list[bool]) -> list[Any]:
    """``None`` (not pruned, in a per-leaf amount) for the leaves ``where`` did not select."""
    return [f if c else None for f, c in zip(fractions, chosen, strict=True)]


def _erk_fractions(shapes: list[Any], sparsity: float, power_scale: float = 1.0) -> list[float]:
    """ERK pruning fractions for a list of shapes (``None``: not selected, gets ``0.0``)."""
    sizes = [0 if s is None else math.prod(s) for s in shapes]
    live = [i for i, s in enumerate(shapes) if s is not None]
    out = [0.0] * len(shapes)
    if not live or sparsity == 0.0:
        return out
    if sparsity == 1.0:
        for i in live:
            out[i] = 1.0
        return out
    raw = {i: (sum(shapes[i]) / sizes[i]) ** power_scale for i in live}
    total = sum(sizes[i] for i in live)
    dense: set = set()
    while True:
        # eps * sum(raw_i * n_i over sparse leaves) + sum(n_i over dense leaves)
        #     == (1 - sparsity) * total
        free = [i for i in live if i not in dense]
        if not free:  # only reachable through rounding, with sparsity ~ 0: all dense
            return out
        rhs = (1.0 - sparsity) * total - sum(sizes[i] for i in dense)
        eps = rhs / sum(raw[i] * sizes[i] for i in free)
        top = max(raw[i] for i in free)
        if eps * top <= 1.0:
            break
        # As RigL: every leaf at the maximal raw density becomes dense, then solve again.
        dense.update(i for i in free if raw[i] == top)
    for i in live:
        if i not in dense:
            out[i] = min(1.0, max(0.0, 1.0 - eps * raw[i]))
    return out


def _check_sparsity(sparsity: Any) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real):
        raise TypeError(
            f"Expected sparsity to be a float in [0, 1] (the fraction to prune), got {sparsity!r}."
        )
    if math.isnan(sparsity) or not 0.0 <= float(sparsity) <= 1.0:
        raise ValueError(
            f"Expected sparsity to be a float in [0, 1] (the fraction to prune), got {sparsity!r}."
        )
    return float(sparsity)


def _check_power_scale(power_scale: Any) -> float:
    if isinstance(power_scale, bool) or not isinstance(power_scale, numbers.Real):
        raise TypeError(f"Expected power_scale to be a non-negative float, got {power_scale!r}.")
    if not math.isfinite(power_scale) or power_scale < 0:
        raise ValueError(f"Expected power_scale to be a non-negative float, got {power_scale!r}.")
    return float(power_scale)
