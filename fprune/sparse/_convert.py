"""Private: :func:`to_sparse` and the checkpoint form (:func:`to_state`, :func:`from_state`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import optree
import torch

from fprune import _names, _torch, _tree, packed
from fprune._types import Masks, Params
from fprune.sparse import _auto, _semi
from fprune.sparse._weight import SparseWeight, quiet, sparse_matrix

__all__ = ["LAYOUTS", "from_state", "is_semi_structured", "kind_of", "layouts", "to_sparse", "to_state"]

LAYOUTS = ("auto", "csr", "bsr", "semi_structured", "dense")
# torch's CPU sparse-times-dense kernel (MKL) takes these dtypes only.
_CPU_SPARSE_DTYPES = (torch.float32, torch.float64)
_STATE_FORMAT = "fprune.sparse"
_STATE_VERSION = 1


class _Leaf(NamedTuple):
    name: str  # the dotted name a where predicate sees
    where: str  # "params['fc.weight']", for messages
    p: torch.Tensor
    keep: torch.Tensor | None
    kind: str | None  # "linear" ((out, in), F.linear), "conv1d" ((in, out), addmm), None: neither


def to_sparse(
    params: Params,
    masks: Masks,
    *,
    layout: str = "auto",
    where: _tree.Where = None,
    module: torch.nn.Module | None = None,
    rows: int | Sequence[int] | None = None,
    measure: bool = True,
    blocksize: tuple[int, int] = (4, 4),
) -> Params:
    """The pruned parameters, with the weights of linear layers in a sparse form that runs faster.

    Returns a pytree like ``params`` for ``torch.func.functional_call(module, ..., args)``: the
    masked model's outputs, computed with sparse kernels. Each selected weight becomes a
    :class:`SparseWeight` (a CSR or BSR matrix: ``F.linear`` and ``torch.addmm`` / ``mm`` /
    ``matmul`` run as ``csr @ x.T``) or, with ``layout="semi_structured"``, torch's 2:4 format
    for GPUs; every other leaf is ``p * mask`` (its mask applied, as :func:`fprune.apply_masks`
    gives it) or ``p`` itself where it has no mask. ``params`` and ``masks`` are not changed.

    Inference first: run it under ``torch.no_grad()``. Gradients still reach the layer's input
    (and every dense parameter), but a sparse weight is a constant: for gradients with respect
    to pruned weights use :func:`fprune.masked_call`. Eager code only (conversion reads the
    masks' counts).

    Args:
        params: a pytree of tensors, first of all ``dict(module.named_parameters())``.
        masks: masks like ``params`` or a part of it (bool, 0/1 or bit-packed).
        layout: ``"auto"`` (default): per weight, CSR where it runs faster than dense at every
            count of ``rows``, timed on the running CPU at conversion (``measure``), dense
            otherwise (CPU, float32/float64; on other devices every weight stays dense); ``"csr"``,
            ``"bsr"``: that layout for every selected weight (a bfloat16 / float16 weight on the
            CPU, whose kernel takes float32 and float64 only, multiplies in float32 and gives
            outputs in its dtype: :class:`SparseWeight`); ``"semi_structured"``: torch's 2:4
            format (CUDA, compute capability 8.0+, float16/bfloat16/int8; every group of 4
            consecutive inputs keeps at most 2 weights); ``"dense"``: ``p * mask`` everywhere.
        where: ``where(name, tensor) -> bool`` picks the weights to convert; each must be 2-D
            (and, with ``module``, the weight of an ``nn.Linear`` or ``Conv1D``). Default:
            every 2-D leaf that has a mask (with ``module``: of an ``nn.Linear`` or ``Conv1D``).
        module: the module the params belong to (``params`` is then a flat dict keyed like its
            ``named_parameters()``). It says how each weight is used: an ``nn.Linear`` weight
            ``(out, in)`` by ``F.linear``, a transformers ``Conv1D`` weight ``(in, out)`` by
            ``torch.addmm`` (stored transposed, so both run the fast kernel), anything else
            (an ``nn.Embedding``'s) not at all. Without it every selected weight is taken as an
            ``(out, in)`` weight of ``F.linear``; a ``Conv1D`` weight then runs on a dense copy.
        rows: for ``layout="auto"``: the rows per call the model will run (batch size times
            the tokens per sequence in a call: 1 for a decoding step of one sequence, the prompt
            length for its prefill), an int or a sequence of them; CSR is chosen only where it
            is faster at each. Default: 1, 8, 64 and 512.
        measure: for ``layout="auto"``: time ``F.linear`` dense against CSR for each distinct
            (shape, dtype, sparsity to the percent, rows, threads), a few milliseconds each,
            cached for the process (:func:`clear_measurements` forgets them); CSR where it takes
            under 0.95x the dense time. ``False``: read the crossover table measured on one
            machine instead (:func:`crossover`; docs/sparse.md).
        blocksize: the block of ``layout="bsr"``, ``(rows, cols)`` of the ``(out, in)`` matrix;
            both dims must be multiples of it.

    Returns:
        A pytree like ``params``.

    Raises:
        ValueError: an unknown ``layout``; ``masks`` with a key ``params`` lacks or a wrong
            shape; a ``params`` key that names nothing in ``module``; a selected weight that is
            not 2-D, not a linear layer's (with ``module``), of a dtype or shape the forced
            layout cannot hold, or (``"semi_structured"``) breaks one of the 2:4 format's rules:
            the message names the rule.
        TypeError: ``params`` leaves that are not dense tensors, ``module`` not a module.

    Example:
        >>> import torch, fprune
        >>> from fprune.sparse import to_sparse
        >>> model = torch.nn.Linear(1024, 2048)
        >>> params = dict(model.named_parameters())
        >>> masks = fprune.l1_unstructured(params, 0.99, where=lambda name, p: p.dim() == 2)
        >>> sparse = to_sparse(params, masks, module=model, measure=False)  # the crossover table
        >>> sparse["weight"].layout_name
        'csr'
        >>> x = torch.randn(8, 1024)
        >>> with torch.no_grad():
        ...     y = torch.func.functional_call(model, sparse, (x,))
        ...     ref = fprune.masked_call(model, params, masks, (x,))
        >>> torch.allclose(y, ref, atol=1e-5)
        True
    """
    if layout not in LAYOUTS:
        raise ValueError(f"Expected layout to be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}.")
    counts = _row_counts(rows)
    if layout == "bsr" and not (
        isinstance(blocksize, tuple)
        and len(blocksize) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in blocksize)
    ):
        raise ValueError(f"Expected blocksize to be a tuple of two positive ints, got {blocksize!r}.")
    if module is not None and not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be None or a torch.nn.Module, got {type(module).__name__}.")
    if packed.holds_packed(masks):
        masks = packed.unpack_masks(masks)
    flat = _tree.flatten(params, "params")
    keeps = _tree.check_masks(flat, masks)
    kinds = _kinds(flat, module)
    chosen = _tree.selected(flat, where)
    leaves = [
        _Leaf(_tree.dotted(path), _tree.describe("params", path), p, keep, kind)
        for path, p, keep, kind in zip(flat.paths, flat.leaves, keeps, kinds, strict=True)
    ]
    for leaf in leaves:
        if leaf.keep is not None and leaf.keep.device != leaf.p.device:
            raise ValueError(
                f"Expected the mask of {leaf.where} on its device, {leaf.p.device}, got {leaf.keep.device}."
            )
    if where is None:  # the default: every linear weight that has a mask
        chosen = [leaf.keep is not None and leaf.p.dim() == 2 and leaf.kind is not None for leaf in leaves]
    else:
        for leaf, pick in zip(leaves, chosen, strict=True):
            if pick:
                _check_weight(leaf, module)
    if layout != "dense" and not _torch.has_wrapper_subclasses() and layout != "semi_structured":
        warnings.warn(
            f"This torch ({torch.__version__}) cannot make the tensor subclass that fprune.sparse "
            f"runs sparse kernels with, so every weight stays dense (p * mask): correct, not faster.",
            stacklevel=2,
        )
        layout = "dense"
    out = []
    for leaf, pick in zip(leaves, chosen, strict=True):
        if pick and layout != "dense":
            out.append(_convert(leaf, layout, counts, measure, blocksize))
        else:
            out.append(_masked(leaf))
    return _tree.unflatten(flat, out)


def _row_counts(rows: Any) -> tuple[int, ...] | None:
    def positive(n: Any) -> bool:
        return isinstance(n, int) and not isinstance(n, bool) and n >= 1

    if rows is None:
        return None
    if positive(rows):
        return (rows,)
    if isinstance(rows, (tuple, list)) and rows and all(positive(n) for n in rows):
        return tuple(rows)
    raise ValueError(
        f"Expected rows to be None, a positive int or a non-empty sequence of them (rows per call), "
        f"got {rows!r}."
    )


def _kinds(flat: _tree.Flat, module: torch.nn.Module | None) -> list[str | None]:
    """How each leaf is used: by ``F.linear`` ("linear"), by ``Conv1D``'s addmm ("conv1d"), or not."""
    if module is None:
        return ["linear" if p.dim() == 2 else None for p in flat.leaves]
    kinds: list[str | None] = []
    names = _names.Names(module)
    for path in flat.paths:
        if len(path) != 1 or not isinstance(path[0], str):
            raise TypeError(
                f"Expected params to be a flat dict keyed like module.named_parameters() when module "
                f"is given, got an entry at {_tree.describe('params', path)}."
            )
        name = path[0]
        if name not in names:
            raise names.unknown("params", name, "module.named_parameters()")
        kinds.append(kind_of(*names.owner(name)))
    return kinds


def kind_of(owner: torch.nn.Module, attr: str) -> str | None:
    if attr != "weight":
        return None
    if isinstance(owner, torch.nn.Linear):
        return "linear"
    # transformers.pytorch_utils.Conv1D (GPT-2 and its kin): weight (in, out), y = addmm(b, x, w).
    if type(owner).__name__ == "Conv1D" and hasattr(owner, "nf"):
        return "conv1d"
    return None


def _check_weight(leaf: _Leaf, module: torch.nn.Module | None) -> None:
    if leaf.p.dim() != 2:
        raise ValueError(
            f"Expected {leaf.where}, picked by where, to be a 2-D weight of a linear layer, got a "
            f"{leaf.p.dim()}-D tensor of shape {tuple(leaf.p.shape)}; sparse layouts hold 2-D "
            f"weights only (leave it out of where, and it stays dense with its mask applied)."
        )
    if leaf.kind is None:
        raise ValueError(
            f"Expected {leaf.where}, picked by where, to be the weight of an nn.Linear or a "
            f"transformers Conv1D of the {type(module).__name__} module, got a parameter that "
            f"module uses otherwise (a sparse weight serves F.linear / torch.addmm only)."
        )


def _masked(leaf: _Leaf) -> torch.Tensor:
    if leaf.keep is None:
        return leaf.p
    return leaf.p * leaf.keep.to(leaf.p.dtype)


def _matrix(leaf: _Leaf) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(out, in)`` kernel matrix (pruned entries zero, detached) and its mask."""
    p = leaf.p.detach()
    keep = torch.ones_like(p, dtype=torch.bool) if leaf.keep is None else leaf.keep
    if leaf.keep is not None:
        pruned = p[~keep]
        bad = int((~torch.isfinite(pruned)).sum()) if pruned.is_floating_point() else 0
        if bad:
            warnings.warn(
                f"{leaf.where} has {bad} non-finite weights among its pruned entries: masked_call "
                f"(p * mask) turns them into NaN, its sparse form leaves them out (as zeros).",
                stacklevel=4,
            )
    dense = torch.where(keep, p, torch.zeros((), dtype=p.dtype, device=p.device))
    if leaf.kind == "conv1d":
        return dense.t().contiguous(), keep.t()
    return dense.contiguous(), keep


def _convert(
    leaf: _Leaf, layout: str, rows: tuple[int, ...] | None, measure: bool, blocksize: tuple[int, int]
) -> torch.Tensor:
    p = leaf.p
    if layout == "auto":
        if leaf.kind is None or p.device.type != "cpu" or p.dtype not in _CPU_SPARSE_DTYPES:
            return _masked(leaf)
        kept = p.numel() if leaf.keep is None else int(leaf.keep.sum())
        sparsity = 1.0 - kept / max(p.numel(), 1)
        matrix, _ = _matrix(leaf)
        made: list[torch.Tensor] = []

        def make_csr() -> torch.Tensor:
            made.append(sparse_matrix(matrix, "csr"))
            return made[0]

        if _auto.choose(matrix, sparsity, make_csr, rows=rows, measure=measure) == "dense":
            return _masked(leaf)
        return SparseWeight(
            made[0] if made else sparse_matrix(matrix, "csr"), transposed=leaf.kind == "conv1d"
        )
    if layout == "semi_structured":
        return _semi_structured(leaf)
    if not p.is_floating_point():
        raise ValueError(
            f"Expected {leaf.where} to be a floating tensor for layout={layout!r} (the sparse "
            f"kernels multiply floating weights), got {p.dtype}; leave it dense."
        )
    matrix, _ = _matrix(leaf)
    if layout == "bsr" and (matrix.shape[0] % blocksize[0] or matrix.shape[1] % blocksize[1]):
        raise ValueError(
            f"Expected the (out, in) matrix of {leaf.where}, {tuple(matrix.shape)}, to be a multiple "
            f"of blocksize {blocksize} for layout='bsr'; pick a blocksize that divides it."
        )
    return SparseWeight(sparse_matrix(matrix, layout, blocksize), transposed=leaf.kind == "conv1d")


def _semi_structured(leaf: _Leaf) -> torch.Tensor:
    matrix, keep = _matrix(leaf)
    found = _semi.problems(matrix, keep)
    if found:
        orientation = (
            "a Conv1D weight's (in, out) is transposed, so its groups of 4 run along dim 0: "
            "fprune.n_m(params, 2, 4, dim=0)"
            if leaf.kind == "conv1d"
            else "groups of 4 run along in_features, dim -1: fprune.n_m(params, 2, 4)"
        )
        raise ValueError(
            f"{leaf.where} cannot take layout='semi_structured' (torch.sparse."
            f"to_sparse_semi_structured): " + "; ".join(found) + f". ({orientation}.)"
        )
    with quiet():
        weight = torch.sparse.to_sparse_semi_structured(matrix)
    return weight.t() if leaf.kind == "conv1d" else weight


def layouts(params: Params) -> Any:
    """The layout of each leaf of :func:`to_sparse`'s result: ``"csr"``, ``"bsr"``,
    ``"semi_structured"`` or ``"dense"``, in a pytree like ``params``.

    Example:
        >>> import torch
        >>> from fprune.sparse import layouts, to_sparse
        >>> w = torch.randn(256, 512)
        >>> keep = torch.rand(256, 512) > 0.97
        >>> layouts(to_sparse({"w": w, "b": torch.zeros(256)}, {"w": keep}, layout="csr"))
        {'w': 'csr', 'b': 'dense'}
    """
    return optree.tree_map(_layout_of, params)


def _layout_of(t: Any) -> str:
    if isinstance(t, SparseWeight):
        return t.layout_name
    if is_semi_structured(t):
        return "semi_structured"
    return "dense"


def is_semi_structured(t: Any) -> bool:
    cls = getattr(torch.sparse, "SparseSemiStructuredTensor", None)
    return cls is not None and isinstance(t, cls)


def to_state(params: Params | torch.nn.Module) -> dict:
    """A checkpoint form of :func:`to_sparse`'s result that ``torch.load(weights_only=True)`` reads.

    ``params`` may also be a module that :func:`fprune.load_into` put sparse weights into: its
    ``state_dict()`` (which holds their dense values) with the sparse weights as they are, so
    ``fprune.load_into(fresh_module, from_state(state))`` gives a module of the same class the
    same weights, sparse where they were.

    Sparse weights are saved as torch's own sparse tensors (CSR/BSR with int32 indices: about 8
    bytes per kept float32 weight, against 4 per weight dense), 2:4 weights as their dense
    ``(out, in)`` values (2:4 saves compute, not disk); :func:`from_state` rebuilds them (2:4
    weights on a CUDA device: load with ``map_location="cuda"``). The state holds only tensors, strings, ints,
    lists and dicts.

    Example:
        >>> import io, torch
        >>> from fprune.sparse import from_state, to_sparse, to_state
        >>> sparse = to_sparse({"w": torch.randn(256, 512)}, {"w": torch.rand(256, 512) > 0.95}, layout="csr")
        >>> buffer = io.BytesIO(); torch.save(to_state(sparse), buffer); _ = buffer.seek(0)
        >>> loaded = from_state(torch.load(buffer, weights_only=True))
        >>> torch.equal(loaded["w"].to_dense(), sparse["w"].to_dense())
        True
    """
    tree: Any = params
    if isinstance(params, torch.nn.Module):
        held = params.named_buffers()
        tree = {
            **params.state_dict(),
            **{n: b for n, b in held if isinstance(b, SparseWeight) or is_semi_structured(b)},
        }
    paths, leaves, spec = optree.tree_flatten_with_path(tree)
    transposed, semi, out = [], [], []
    for path, leaf in zip(paths, leaves, strict=True):
        name = _tree.dotted(path)
        if isinstance(leaf, SparseWeight):
            out.append(leaf.matrix.to(leaf.out_dtype))  # a bfloat16 weight's values in bfloat16
            if leaf.transposed:
                transposed.append(name)
        elif is_semi_structured(leaf):
            semi.append(name)
            # torch's 2:4 tensors rebuild their dense values only untransposed (``to_dense`` is
            # ``mm(self, eye)``), and a fresh one has no transposed copy (``packed_t``): the
            # ``.t()`` made for a Conv1D weight is the one without ``packed``.
            if getattr(leaf, "packed", True) is None:
                out.append(leaf.t().to_dense())
                transposed.append(name)
            else:
                out.append(leaf.to_dense())
        elif isinstance(leaf, torch.Tensor):
            out.append(leaf.detach())
        else:
            raise TypeError(
                f"Expected every leaf of params to be a tensor, got {type(leaf).__name__} at "
                f"{_tree.describe('params', path)}."
            )
    return {
        "format": _STATE_FORMAT,
        "version": _STATE_VERSION,
        "params": optree.tree_unflatten(spec, out),
        "transposed": transposed,
        "semi_structured": semi,
    }


def from_state(state: dict) -> Params:
    """The sparse params that :func:`to_state` saved.

    Args:
        state: what :func:`to_state` returned (after ``torch.load(..., weights_only=True)``);
            2:4 weights are rebuilt on the device their values were loaded to.

    Returns:
        A pytree like the one :func:`to_state` was given.

    Raises:
        ValueError: ``state`` is not a state made by :func:`to_state`.

    Example:
        >>> import torch
        >>> from fprune.sparse import from_state, to_sparse, to_state
        >>> sparse = to_sparse({"w": torch.eye(4)}, {"w": torch.eye(4, dtype=torch.bool)}, layout="csr")
        >>> from_state(to_state(sparse))["w"].layout_name
        'csr'
    """
    if not (isinstance(state, dict) and state.get("format") == _STATE_FORMAT):
        raise ValueError(
            f"Expected a state made by fprune.sparse.to_state (a dict with format={_STATE_FORMAT!r}), "
            f"got {type(state).__name__}"
            + (f" with keys {sorted(map(str, state))}" if isinstance(state, dict) else "")
            + "."
        )
    if state.get("version") != _STATE_VERSION:
        raise ValueError(f"Expected state version {_STATE_VERSION}, got {state.get('version')!r}.")
    transposed, semi = set(state["transposed"]), set(state["semi_structured"])
    paths, leaves, spec = optree.tree_flatten_with_path(state["params"])
    out: list[Any] = []
    for path, leaf in zip(paths, leaves, strict=True):
        name = _tree.dotted(path)
        if isinstance(leaf, torch.Tensor) and leaf.layout in (torch.sparse_csr, torch.sparse_bsr):
            out.append(SparseWeight(leaf, transposed=name in transposed))
        elif name in semi:
            with quiet():
                weight = torch.sparse.to_sparse_semi_structured(leaf.contiguous())
            out.append(weight.t() if name in transposed else weight)
        else:
            out.append(leaf)
    return optree.tree_unflatten(spec, out)
