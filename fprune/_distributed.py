"""Private: exact global selection over ``DTensor`` leaves, without gathering any parameter.

Every rank holds its own shard of each leaf (``DTensor.to_local()``). The selection is the
same radix select as :mod:`fprune._select`, on the same order-preserving integer keys
(:func:`fprune._select.keys`), but its histograms are summed over the mesh with
``all_reduce``, so every rank finds the same threshold and writes its own part of the masks:

1. **Fingerprint.** Every rank hashes what it was called with (function, amount, tree
   structure, global shapes, dtypes, placements, mesh, ``where``'s choice) and the ranks
   compare the hashes in one tiny ``all_reduce`` (max and min). Ranks whose inputs disagree,
   or where one rank's inputs are invalid, all raise at once instead of waiting in different
   collectives.
2. **Counts.** The entries the prior masks keep, per leaf, summed over ranks: ``k`` is
   computed from them exactly as in one process.
3. **Select.** Radix passes over the keys, one digit per pass: each rank counts the digits of
   its own keys still in range, the histograms of every ranking (one for the global method,
   one per leaf for the per-leaf ones) go into one tensor and one ``all_reduce`` per pass.
   After the last digit every rank knows the threshold key, how many keys lie below it and
   how many equal it.
4. **Ties.** When only some of the entries equal to the threshold are pruned, the first ones
   in the global order (leaf order, then row-major position in the *full* tensor) are. The
   ranks sum per-leaf tie counts to find the leaf where the split falls, then select the
   position of the last pruned tie with the same radix select over the global flat positions
   of the ties (so ``Shard(1)``, whose positions interleave across ranks, is exact too).
5. **Masks.** Each rank compares its local keys with the threshold (and the split position)
   and returns ``DTensor`` masks with the params' mesh and placements.

Replicated copies are counted once: a rank counts a local shard only when its mesh
coordinate is 0 along every mesh dimension on which the leaf is ``Replicate()``. Only
histograms, counts and a few scalars cross the network; the bytes handed to collectives are
recorded in :data:`LAST` (see :func:`fprune.distributed.last_communication`).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import optree
import torch

from fprune import _amount, _inputs, _random, _select, _torch, _tree

# Histogram bytes handed to collectives per call (score select + position select): the digit
# width per pass is the widest that keeps every pass of every ranking within it.
HIST_BUDGET = 4 << 20
POSITION_BUDGET = 2 << 20
_MAX_DIGIT = 16
# Global(normalize=...) -> the norm's order (as fprune.select reads it; the scope checked it).
_NORMS = {None: None, False: None, True: 2.0, "l2": 2.0, "l1": 1.0}
_MIN_DIGIT = 1


@dataclass
class Communication:
    """What one distributed mask call handed to collectives on this rank."""

    collectives: int = 0
    bytes: int = 0
    passes: int = 0
    digit_bits: List[int] = field(default_factory=list)


LAST = Communication()


def _dtensor_module():
    # torch.distributed.tensor takes seconds to import: a DTensor can only exist once it is
    # imported, so its absence from sys.modules means there is no DTensor to look for.
    return sys.modules.get("torch.distributed.tensor")


SUPPORTED = (
    "global_unstructured, l1_unstructured, ln_structured, random_unstructured, n_m, "
    "rowwise_unstructured, random_structured"
)


def reject(function: str, *trees: Any) -> None:
    """Raise when a method without a distributed selection gets DTensor leaves."""
    if holds_dtensor(*trees):
        raise NotImplementedError(
            f"{function} does not accept DTensor leaves (sharded models): the distributed "
            f"selection covers {SUPPORTED}. Call it on each rank's local tensors "
            f"(dtensor.to_local()) if a per-shard selection is what you want."
        )


def holds_dtensor(*trees: Any) -> bool:
    """True when any leaf of ``trees`` (``None`` trees skipped) is a ``DTensor``."""
    module = _dtensor_module()
    if module is None:
        return False
    return any(
        isinstance(leaf, module.DTensor)
        for tree in trees
        if tree is not None
        for leaf in optree.tree_leaves(tree)
    )


# ----------------------------------------------------------------------------- mesh & leaves


class _Comm:
    """All-reduces over every rank of a mesh (one collective per mesh dimension)."""

    def __init__(self, mesh, device: torch.device):
        import torch.distributed as dist

        self.dist = dist
        self.groups = [mesh.get_group(d) for d in range(mesh.ndim)]
        self.device = device
        self.stats = Communication()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        reduce_op = {"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX}[op]
        for group in self.groups:
            self.dist.all_reduce(tensor, op=reduce_op, group=group)
            self.stats.collectives += 1
            self.stats.bytes += tensor.numel() * tensor.element_size()
        return tensor


class _Leaf:
    """One DTensor leaf on this rank: its local shard and where that shard sits."""

    def __init__(self, index: int, param, mesh, coordinate: Sequence[int], layouts: Optional[dict] = None):
        module = _dtensor_module()
        self.index = index
        self.placements = tuple(param.placements)
        self.shape = tuple(param.shape)
        self.local = param.to_local()
        # Leaves of one shape and placements share their layout (many-leaf models repeat them).
        layouts = {} if layouts is None else layouts
        layout = layouts.get((self.shape, self.placements))
        if layout is None:
            layout = layouts[(self.shape, self.placements)] = _torch.shard_layout(
                self.shape, tuple(mesh.shape), coordinate, self.placements
            )
        local_shape, offset = layout
        self.local_shape = tuple(local_shape)
        self.offset = tuple(offset)
        if tuple(self.local.shape) != self.local_shape:
            raise ValueError(
                f"The local shard of a DTensor leaf has shape {tuple(self.local.shape)}, expected "
                f"{self.local_shape} for global shape {self.shape} and placements "
                f"{self.placements}."
            )
        self.numel = math.prod(self.shape)
        self.local_numel = self.local.numel()
        # Count this shard only on the first replica along every Replicate() mesh dim.
        self.owned = all(
            coordinate[m] == 0
            for m, p in enumerate(self.placements)
            if isinstance(p, module.Replicate)
        )
        self.contiguous_rows = all(s == l for s, l in zip(self.shape[1:], self.local_shape[1:]))

    def positions(self, start: int, stop: int) -> torch.Tensor:
        """Global row-major positions (in the full tensor) of local flat entries start:stop."""
        index = torch.arange(start, stop, dtype=torch.int64, device=self.local.device)
        if self.contiguous_rows:
            # The shard is whole rows: its entries are one contiguous range of the full tensor.
            first = self.offset[0] * (self.numel // self.shape[0]) if self.shape else 0
            return index + first
        position = torch.zeros_like(index)
        stride = 1
        for size, local_size, offset in reversed(list(zip(self.shape, self.local_shape, self.offset))):
            coordinate = index % local_size
            index = index // local_size
            position += (coordinate + offset) * stride
            stride *= size
        return position

    def dtensor(self, local: torch.Tensor, mesh):
        module = _dtensor_module()
        strides = torch.empty(self.shape, device="meta").stride()
        return module.DTensor.from_local(
            local, mesh, self.placements, run_check=False, shape=torch.Size(self.shape), stride=strides
        )


def _check_leaves(flat: _tree.Flat, others: dict, mesh) -> None:
    """Every leaf a DTensor on ``mesh`` with Shard/Replicate placements, scores and masks alike."""
    module = _dtensor_module()
    _StridedShard = _torch.strided_shard_type()

    def check_one(leaf, where: str, placements=None):
        if not isinstance(leaf, module.DTensor):
            raise TypeError(
                f"Expected every leaf to be a DTensor when any is (plain tensors and DTensors "
                f"cannot be mixed), got a plain {type(leaf).__name__} at {where}; convert it with "
                f"torch.distributed.tensor.distribute_tensor or DTensor.from_local."
            )
        if leaf.device_mesh != mesh:
            raise ValueError(
                f"Expected every DTensor leaf on one device mesh ({mesh}), got {leaf.device_mesh} "
                f"at {where}."
            )
        for p in leaf.placements:
            if isinstance(p, _StridedShard) or not isinstance(p, (module.Shard, module.Replicate)):
                raise ValueError(
                    f"Expected placements Shard(d) or Replicate() for {where}, got "
                    f"{tuple(leaf.placements)}; redistribute Partial leaves first "
                    f"(dtensor.redistribute(mesh, [Replicate()])). _StridedShard (FSDP2 over "
                    f"tensor parallelism) is not supported."
                )
        if placements is not None and tuple(leaf.placements) != placements:
            raise ValueError(
                f"Expected {where} to have the placements of the params, {placements}, got "
                f"{tuple(leaf.placements)}."
            )

    for path, leaf in zip(flat.paths, flat.leaves):
        check_one(leaf, _tree.describe("params", path))
    for argname, leaves in others.items():
        for path, leaf, param in zip(flat.paths, leaves, flat.leaves):
            if leaf is not None:
                check_one(leaf, _tree.describe(argname, path), tuple(param.placements))


def _first_mesh(*trees):
    module = _dtensor_module()
    for tree in trees:
        if tree is None:
            continue
        for leaf in optree.tree_leaves(tree):
            if isinstance(leaf, module.DTensor):
                return leaf.device_mesh
    raise AssertionError("no DTensor leaf")  # holds_dtensor was checked by the caller


def _fingerprint(description: str) -> int:
    digest = hashlib.blake2b(description.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


def _agree(comm: _Comm, description: str, error: Optional[BaseException], function: str) -> None:
    """Raise on every rank unless every rank was called with the same inputs and all are valid."""
    code = -1 if error is not None else _fingerprint(description)
    both = torch.tensor([code, -code], dtype=torch.int64, device=comm.device)
    comm.all_reduce(both, "max")
    highest, lowest = int(both[0]), -int(both[1])
    if error is not None:
        raise error
    if lowest == -1:
        raise ValueError(
            f"fprune.{function}: another rank of the mesh rejected its inputs (see its error); "
            f"this rank's inputs were valid."
        )
    if highest != lowest:
        raise ValueError(
            f"fprune.{function}: the ranks of the mesh were called with different inputs "
            f"(amount, tree structure, shapes, dtypes, placements or the leaves where= picks "
            f"must agree on every rank). This rank: {description[:400]}"
        )


# ----------------------------------------------------------------------------- the select


@dataclass
class _Ranking:
    """One selection problem: prune the ``k`` lowest keys over some sources."""

    k: int
    total: int
    sources: list  # (leaf, key_fn) in tie-break order, every local leaf (owned or not)
    width: int  # key bits: 32 or 64
    dtype: torch.dtype = torch.int32  # the keys' dtype
    threshold: int = 0
    below: int = 0
    ties: int = 0
    split_leaf: Optional[int] = None  # index into sources where the tie split falls
    split_position: int = -1  # ties at global positions <= this are pruned in split_leaf
    mode: str = "select"  # "keep" (k <= 0), "prune" (k >= total) or "select"


def _bits_for(rankings_widths: Sequence[int], budget: int, element: int) -> int:
    count = len(rankings_widths)
    width = max(rankings_widths)
    for bits in range(_MAX_DIGIT, _MIN_DIGIT - 1, -1):
        passes = -(-width // bits)
        if passes * count * ((1 << bits) + 2) * element <= budget:
            return bits
    return _MIN_DIGIT


def _radix_select(
    comm: _Comm,
    problems: List[dict],
    budget: int,
    hist_dtype: torch.dtype,
) -> List[tuple]:
    """``(key, below, equal)`` of the ``k``-th lowest key of each problem, over all ranks.

    Each problem is ``dict(k, low, shift, chunks)`` where ``chunks()`` yields this rank's
    keys (integer tensors; entries outside ``[low, low + 2**shift)`` are ignored) and ``k``
    is 1-based. All problems advance together, one ``all_reduce`` per pass.
    """
    element = torch.empty((), dtype=hist_dtype).element_size()
    bits = _bits_for([p["shift"] for p in problems], budget, element)
    comm.stats.digit_bits.append(bits)
    state = [
        {"low": p["low"], "shift": p["shift"], "k": p["k"], "below": 0, "equal": 0} for p in problems
    ]
    work: dict = {}

    def buffer_like(key):
        held = work.get(key.dtype)
        if held is None or held.numel() < key.numel():
            held = work[key.dtype] = torch.empty(max(key.numel(), _select.CHUNK), dtype=key.dtype, device=key.device)
        return held[: key.numel()]

    while any(s["shift"] > 0 for s in state):
        width = 1 << bits
        hist = torch.zeros(len(problems), width + 2, dtype=torch.int64, device=comm.device)
        firsts = []
        for row, (problem, s) in enumerate(zip(problems, state)):
            if s["shift"] == 0:
                firsts.append(0)
                continue
            next_shift = max(s["shift"] - bits, 0)
            low, shift = s["low"], s["shift"]
            full_range = shift == problem["width"] and low == problem["low"]
            # As _select._histogram: keys below the range clamp into a bin before the in-range
            # ones, keys above into the bin after them; one clamp, subtract and shift per key.
            step = 1 << next_shift
            key_min, key_max = -(1 << (problem["width"] - 1)), (1 << (problem["width"] - 1)) - 1
            floor = low if full_range or low - step < key_min else low - step
            ceiling = min(low + (1 << shift), key_max)
            first = 1 if floor < low else 0
            firsts.append(first)
            for key in problem["chunks"]():
                digit = buffer_like(key)
                if full_range:
                    # The whole key range: the digit is the top bits, offset to be non-negative.
                    torch.bitwise_right_shift(key, next_shift, out=digit)
                    digit.sub_(low >> next_shift)
                else:
                    torch.clamp(key, floor, ceiling, out=digit)
                    digit.sub_(floor)
                    if next_shift:
                        digit.bitwise_right_shift_(next_shift)
                hist[row] += torch.bincount(digit, minlength=width + 2)[: width + 2]
        hist = comm.all_reduce(hist.to(hist_dtype)).to(torch.int64)
        comm.stats.passes += 1
        for row, s in enumerate(state):
            if s["shift"] == 0:
                continue
            next_shift = max(s["shift"] - bits, 0)
            inner = hist[row, firsts[row] : firsts[row] + min(width, 1 << (s["shift"] - next_shift))]
            row_cum = inner.cumsum(0)
            digit = int(torch.searchsorted(row_cum, s["k"]))
            skipped = int(row_cum[digit - 1]) if digit > 0 else 0
            s["below"] += skipped
            s["k"] -= skipped
            s["equal"] = int(inner[digit])
            s["low"] += digit << next_shift
            s["shift"] = next_shift
    return [(s["low"], s["below"], s["equal"]) for s in state]


def _chunk_keys(leaf, key_fn, buffer: torch.Tensor):
    """This leaf's local keys chunk by chunk, in ``buffer`` when the key builder can fill it."""
    fill = getattr(key_fn, "into", None)
    for start in range(0, leaf.local_numel, _select.CHUNK):
        stop = min(start + _select.CHUNK, leaf.local_numel)
        if fill is not None:
            yield start, stop, fill(start, stop, buffer[: stop - start])
        else:
            yield start, stop, key_fn(start, stop)


def _buffer(sources, dtype) -> torch.Tensor:
    size = min(_select.CHUNK, max([leaf.local_numel for leaf, _ in sources], default=1))
    device = sources[0][0].local.device if sources else "cpu"
    return torch.empty(max(size, 1), dtype=dtype, device=device)


# Leaves of at most this many local entries have their keys computed once per select and kept
# (concatenated into blocks), instead of once per pass: the per-leaf work of many small leaves.
SMALL_LOCAL = 4096
_KEPT_KEYS = 1 << 25  # at most this many kept keys per select; the rest are recomputed


def _score_chunks(sources, dtype):
    buffer = _buffer(sources, dtype)
    kept: list = []

    def build():
        pieces, size, total = [], 0, 0
        for leaf, key_fn in sources:
            if not leaf.owned or not 0 < leaf.local_numel <= SMALL_LOCAL or total >= _KEPT_KEYS:
                continue
            pieces.append(key_fn(0, leaf.local_numel).reshape(-1))
            size += leaf.local_numel
            total += leaf.local_numel
            if size >= _select.CHUNK:
                kept.append(torch.cat(pieces))
                pieces, size = [], 0
        if pieces:
            kept.append(torch.cat(pieces))
        return total

    state: dict = {}

    def chunks():
        if "total" not in state:
            state["total"] = build()
        yield from kept
        counted = 0
        for leaf, key_fn in sources:
            if not leaf.owned:
                continue
            if 0 < leaf.local_numel <= SMALL_LOCAL and counted < state["total"]:
                counted += leaf.local_numel  # kept above
                continue
            for _, _, key in _chunk_keys(leaf, key_fn, buffer):
                yield key

    return chunks


def _tie_position_chunks(leaf, key_fn, threshold: int, dtype):
    buffer = _buffer([(leaf, key_fn)], dtype)

    def chunks():
        if not leaf.owned:
            return
        for start, stop, key in _chunk_keys(leaf, key_fn, buffer):
            yield torch.where(key == threshold, leaf.positions(start, stop), -1)

    return chunks


def _select_all(comm: _Comm, rankings: List[_Ranking]) -> None:
    """Fill threshold, ties and the tie split of every ranking (collectives on every rank)."""
    active = [r for r in rankings if r.mode == "select"]
    if not active:
        return
    hist_dtype = torch.int32 if max(r.total for r in active) < 2**31 else torch.int64
    found = _radix_select(
        comm,
        [
            {
                "k": r.k,
                "low": -(1 << (r.width - 1)),
                "shift": r.width,
                "width": r.width,
                "chunks": _score_chunks(r.sources, r.dtype),
            }
            for r in active
        ],
        HIST_BUDGET,
        hist_dtype,
    )
    splits = []
    for r, (threshold, below, equal) in zip(active, found):
        r.threshold, r.below, r.ties = threshold, below, equal
        if r.k - below < equal:
            splits.append(r)
    if not splits:
        return
    # Where does each split fall? Per-leaf tie counts (one leaf: all of them).
    multi = [r for r in splits if len(r.sources) > 1]
    if multi:
        counts = []
        for r in multi:
            for leaf, key_fn in r.sources:
                n = 0
                if leaf.owned:
                    for key in _score_chunks([(leaf, key_fn)], r.dtype)():
                        n += int(torch.count_nonzero(key == r.threshold))
                counts.append(n)
        reduced = comm.all_reduce(torch.tensor(counts, dtype=torch.int64, device=comm.device))
        per_leaf = iter(reduced.tolist())
    position_problems = []
    for r in splits:
        remaining = r.k - r.below  # ties to prune, in [1, ties)
        leaf_ties = [next(per_leaf) for _ in r.sources] if len(r.sources) > 1 else [r.ties]
        for j, n in enumerate(leaf_ties):
            if remaining <= n:
                break
            remaining -= n
        r.split_leaf = j
        leaf, key_fn = r.sources[j]
        if remaining == leaf_ties[j]:
            r.split_position = leaf.numel  # every tie of this leaf is pruned
            continue
        position_problems.append(
            (
                r,
                {
                    "k": remaining,
                    "low": 0,
                    "shift": max(1, (leaf.numel - 1).bit_length()),
                    "width": 64,
                    "chunks": _tie_position_chunks(leaf, key_fn, r.threshold, r.dtype),
                },
            )
        )
    if position_problems:
        hist_dtype = torch.int32 if max(r.total for r, _ in position_problems) < 2**31 else torch.int64
        found = _radix_select(comm, [p for _, p in position_problems], POSITION_BUDGET, hist_dtype)
        for (r, _), (position, _, _) in zip(position_problems, found):
            r.split_position = position


def _keep_masks(ranking: _Ranking) -> List[torch.Tensor]:
    """This rank's local keep-masks of a ranking's sources, once the selection is known."""
    out = []
    buffer = _buffer(ranking.sources, ranking.dtype)
    for j, (leaf, key_fn) in enumerate(ranking.sources):
        if ranking.mode != "select":
            fill = ranking.mode == "keep"
            out.append(torch.full(leaf.local_shape, fill, dtype=torch.bool, device=leaf.local.device))
            continue
        keep = torch.empty(leaf.local_numel, dtype=torch.bool, device=leaf.local.device)
        for start, stop, key in _chunk_keys(leaf, key_fn, buffer):
            part = keep[start:stop]
            if ranking.split_leaf is None or j < ranking.split_leaf:
                torch.gt(key, ranking.threshold, out=part)  # every tie pruned
            elif j > ranking.split_leaf:
                torch.ge(key, ranking.threshold, out=part)  # every tie kept
            else:
                torch.gt(key, ranking.threshold, out=part)
                part |= (key == ranking.threshold) & (leaf.positions(start, stop) > ranking.split_position)
        out.append(keep.view(leaf.local_shape))
    return out


# ----------------------------------------------------------------------------- public entries


def _describe(function, inputs, amount, extra, leaves) -> str:
    flat = inputs.params
    parts = [function, repr(amount), repr(extra), str(flat.spec)]
    for i, p in enumerate(flat.leaves):
        parts.append(
            f"{tuple(p.shape)}|{p.dtype}|{tuple(p.placements)}|{inputs.chosen[i]}|"
            f"{inputs.scores[i] is not None}|{inputs.prior[i] is not None}"
        )
    return ";".join(parts)


def _prepare(function, params, amount, importance_scores, masks, where, extra, check_amount=True):
    mesh = _first_mesh(params, importance_scores, masks)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"fprune.{function}: this rank is not part of the DTensors' mesh {mesh}.")
    # Device of the collectives: the mesh's device type (cpu for gloo, cuda for nccl).
    device = torch.device(mesh.device_type)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    comm = _Comm(mesh, device)
    error, state = None, None
    try:
        if isinstance(amount, torch.Tensor) and amount.dim() == 0 and amount.is_floating_point():
            amount = float(amount)
        inputs = _inputs.gather(params, amount, importance_scores, masks, where, check_amount=check_amount)
        _check_leaves(inputs.params, {"importance_scores": inputs.scores, "masks": inputs.prior}, mesh)
        if inputs.traced:
            raise NotImplementedError(
                f"fprune.{function} on DTensors runs eagerly only (not under vmap, grad or "
                f"torch.compile)."
            )
        layouts: dict = {}
        leaves = [_Leaf(i, p, mesh, coordinate, layouts) for i, p in enumerate(inputs.params.leaves)]
        state = (inputs, leaves, amount)
        description = _describe(function, inputs, amount, extra, leaves)
    except (TypeError, ValueError, IndexError, NotImplementedError) as caught:
        error, description = caught, ""
    _agree(comm, description, error, function)
    return mesh, comm, state


def _local(t):
    return None if t is None else t.to_local()


def _finish(mesh, inputs, leaves, keeps: dict, comm) -> Any:
    new = {i: leaves[i].dtensor(keep, mesh) for i, keep in keeps.items()}
    global LAST
    LAST = comm.stats
    return _inputs.finish(inputs, new)


def _ranking(k, total, sources, dtype) -> _Ranking:
    mode = "keep" if k <= 0 else "prune" if k >= total else "select"
    return _Ranking(k=k, total=total, sources=sources, width=torch.iinfo(dtype).bits, dtype=dtype, mode=mode)


def global_unstructured(params, amount, *, importance_scores, masks, scope, where, rank) -> Any:
    """:func:`fprune.global_unstructured` over DTensor leaves (``scope``: a checked ``Global``)."""
    norm = _NORMS[scope.normalize]  # Global() checked it
    source = _select.MAGNITUDE if rank == "magnitude" else None
    mesh, comm, (inputs, leaves, amount) = _prepare(
        "global_unstructured", params, amount, importance_scores, masks, where, (norm, rank)
    )
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    if not chosen:
        return _finish(mesh, inputs, leaves, {}, comm)
    sizes = [leaves[i].numel for i in chosen]
    alive = _alive_each(comm, inputs, leaves, chosen)
    total_alive = sum(alive)
    k = _amount.count(amount, total_alive, "parameters") + (sum(sizes) - total_alive)
    values = [
        leaves[i].local if inputs.scores[i] is None else inputs.scores[i].to_local() for i in chosen
    ]
    dtype = _select.key_dtype(values)
    priors = [_local(inputs.prior[i]) for i in chosen]
    priors = [None if m is None else _tree.as_bool(m) for m in priors]
    scales = _norm_scales(comm, [leaves[i] for i in chosen], values, priors, norm)
    sources = []
    for i, v, prior, scale in zip(chosen, values, priors, scales):
        transform = source if norm is None else _scaled(scale, dtype, source)
        sources.append((leaves[i], _select.keys(v, prior, dtype, transform)))
    ranking = _ranking(k, sum(sizes), sources, dtype)
    _select_all(comm, [ranking])
    keeps = dict(zip(chosen, _keep_masks(ranking)))
    return _finish(mesh, inputs, leaves, keeps, comm)


def l1_unstructured(params, amount, *, importance_scores, masks, where, rank) -> Any:
    """:func:`fprune.l1_unstructured` over DTensor leaves: one ranking per leaf, batched."""
    source = _select.MAGNITUDE if rank == "magnitude" else None
    mesh, comm, (inputs, leaves, amount) = _prepare(
        "l1_unstructured", params, amount, importance_scores, masks, where, rank
    )
    def values_of(i, leaf):
        return leaf.local if inputs.scores[i] is None else inputs.scores[i].to_local()

    return _select_each(mesh, comm, inputs, leaves, amount, values_of, source)


def _select_each(mesh, comm, inputs, leaves, amount, values_of, source) -> Any:
    """The masks of a per-leaf selection: each chosen leaf's count over the whole mesh, then
    the ``k`` lowest keys of ``values_of(i, leaf)`` (this rank's part of leaf ``i``'s scores)."""
    amounts = _inputs.leaf_amounts(inputs, amount)  # one amount, or per-leaf amounts
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    alive = _alive_each(comm, inputs, leaves, chosen) if chosen else []
    items = []
    for i, n_alive in zip(chosen, alive):
        leaf = leaves[i]
        name = _tree.describe("params", inputs.params.paths[i])
        k = _amount.count(amounts[i], n_alive, "parameters", name) + (leaf.numel - n_alive)
        values = values_of(i, leaf)
        prior = _local(inputs.prior[i])
        prior = None if prior is None else _tree.as_bool(prior)
        dtype = _select.key_dtype([values])
        items.append((leaf, _select.keys(values, prior, dtype, source), k, dtype))
    keeps = dict(zip(chosen, _per_leaf(comm, items)))
    return _finish(mesh, inputs, leaves, keeps, comm)


def _norm_scales(comm, leaves, values, priors, norm) -> list:
    """Per-leaf norms of the kept scores over the whole mesh (float64), or None without normalize."""
    if norm is None:
        return [None] * len(leaves)
    partial = []
    for leaf, v, prior in zip(leaves, values, priors):
        if not leaf.owned:
            partial.append(0.0)
            continue
        kept = v if prior is None else torch.where(prior, v, torch.zeros((), dtype=v.dtype))
        partial.append(kept.to(torch.float64).abs().pow(norm).sum())
    stacked = torch.stack([torch.as_tensor(x, dtype=torch.float64) for x in partial]).to(comm.device)
    total = comm.all_reduce(stacked)
    return list(total.pow(1.0 / norm).unbind())


def _scaled(scale, key_dtype, source):
    # As fprune.select's _normalized: the same work dtype, clamp and division.
    work = torch.float32 if key_dtype == torch.int32 else torch.float64
    scale = torch.clamp(scale, min=torch.finfo(work).tiny).to(work)
    if source is None:
        return lambda chunk: chunk.to(work) / scale
    return lambda chunk: chunk.to(work).abs() / scale


def ln_structured(params, amount, n, dim, *, importance_scores, masks, where) -> Any:
    """:func:`fprune.ln_structured` over DTensor leaves.

    Each rank reduces its own shard to per-channel partial scores; one ``all_reduce`` of the
    channel vectors (one float64 per channel: a leaf's channels, not its entries) gives every
    rank every channel's score, and each rank then ranks the channels as one process would.
    A leaf sharded only along ``dim`` (or replicated) has whole channels on each rank: their
    norms are computed locally exactly as in one process. A leaf sharded along another dim has
    partial channels: the norm is ``(sum |x|**n) ** (1/n)`` of the summed partial powers (max
    or min for ``inf``/``-inf``), which may differ from ``torch.norm`` in the last bits.
    """
    mesh, comm, (inputs, leaves, amount) = _prepare(
        "ln_structured", params, amount, importance_scores, masks, where, (n, dim)
    )
    module = _dtensor_module()
    flat = inputs.params
    dims = {
        i: _inputs.check_dim(
            dim,
            p,
            f" at {_tree.describe('params', path)}",
            "leave such leaves out with where=lambda name, p: p.dim() > 1.",
        )
        for i, (path, p, chosen) in enumerate(zip(flat.paths, flat.leaves, inputs.chosen))
        if chosen
    }
    if n == "nuc":
        raise ValueError("ln_structured on DTensors supports numeric norms and 'fro', not 'nuc'.")
    order = 2.0 if n == "fro" else float(n)
    sums, maxes, plans, locals_ = [], [], [], []
    for i, d in dims.items():
        leaf = leaves[i]
        values = _local(inputs.scores[i])
        prior = _local(inputs.prior[i])
        prior = None if prior is None else _tree.as_bool(prior)
        if values is None:
            values = leaf.local if prior is None else torch.where(prior, leaf.local, torch.zeros((), dtype=leaf.local.dtype))
        others = [x for x in range(len(leaf.shape)) if x != d]
        channels, start, count = leaf.shape[d], leaf.offset[d], leaf.local_shape[d]
        whole = all(isinstance(p, module.Replicate) or p.dim == d for p in leaf.placements)
        score_dtype = torch.norm(torch.zeros(1, dtype=values.dtype), p=n).dtype
        # A leaf sharded nowhere is whole here: its channel vectors need no communication.
        local_only = not _sharded(leaf)
        contribute = (leaf.owned or local_only) and leaf.local_numel > 0
        # Alive channels: any entry kept (kept entries per channel, summed over ranks, > 0).
        alive = torch.zeros(channels if prior is not None else 0, dtype=torch.float64, device=comm.device)
        if contribute and prior is not None:
            alive[start : start + count] = prior.sum(dim=others).to(torch.float64)
        if local_only:
            locals_.append(alive)
            alive_at = ("local", len(locals_) - 1)
        else:
            sums.append(alive)
            alive_at = ("sum", len(sums) - 1)
        use_max = not whole and math.isinf(order)
        partial = torch.zeros(channels, dtype=torch.float64, device=comm.device)
        if use_max:
            partial.fill_(-math.inf)
        if contribute:
            if whole:  # whole channels here: torch.norm exactly as in one process
                local = torch.norm(values, p=n, dim=others).to(torch.float64)
            elif math.isinf(order):
                magnitude = values.abs().to(torch.float64).amax(dim=others) if order > 0 else -values.abs().to(torch.float64).amin(dim=others)
                local = magnitude
            elif order == 0:
                local = (values != 0).sum(dim=others).to(torch.float64)
            else:
                local = values.to(torch.float64).abs().pow(order).sum(dim=others)
            partial[start : start + count] = local
        if local_only:
            locals_.append(partial)
            score_at = ("local", len(locals_) - 1)
        elif use_max:
            maxes.append(partial)
            score_at = ("max", len(maxes) - 1)
        else:
            sums.append(partial)
            score_at = ("sum", len(sums) - 1)
        plans.append((i, d, whole, use_max, score_dtype, alive_at, score_at))
    summed = comm.all_reduce(torch.cat(sums)).split([t.numel() for t in sums]) if sums else []
    maxed = comm.all_reduce(torch.cat(maxes), "max").split([t.numel() for t in maxes]) if maxes else []
    new = {}
    vectors = {"sum": summed, "max": maxed, "local": locals_}
    for i, d, whole, use_max, score_dtype, alive_at, score_at in plans:
        leaf = leaves[i]
        alive_channels = vectors[alive_at[0]][alive_at[1]] > 0
        scores = vectors[score_at[0]][score_at[1]]
        if not whole:
            if math.isinf(order):
                scores = scores if order > 0 else -scores
            elif order != 0:
                scores = scores.pow(1.0 / order)
        scores = scores.to(score_dtype)
        channels = leaf.shape[d]
        prior = _local(inputs.prior[i])
        has_prior = prior is not None
        n_alive = int(alive_channels.sum()) if has_prior else channels
        name = _tree.describe("params", flat.paths[i])
        k = _amount.count(amount, n_alive, "channels", f"{name} along dim {d}") + (channels - n_alive)
        dtype = _select.key_dtype([scores])
        (keep,) = _select.prune_lowest(
            [(channels, _select.keys(scores, alive_channels if has_prior else None, dtype))],
            k,
            traced=False,
            device=scores.device,
        )
        start, count = leaf.offset[d], leaf.local_shape[d]
        shape = [1] * len(leaf.shape)
        shape[d] = count
        local = keep[start : start + count].to(leaf.local.device).view(shape).expand(leaf.local_shape)
        local = local.contiguous() if not has_prior else local & _tree.as_bool(prior)
        new[i] = local
    return _finish(mesh, inputs, leaves, new, comm)


def _generator_state(generator) -> str:
    """What must agree across ranks for the draws to be the same: the seed or the RNG state."""
    if generator is None:
        generator = torch.default_generator
    if isinstance(generator, torch.Generator):
        state = generator.get_state()
        return hashlib.blake2b(state.numpy().tobytes(), digest_size=8).hexdigest()
    return repr(int(generator))


def _seeded(leaf: "_Leaf", generator, stream: int) -> torch.Tensor:
    """The local part of ``fprune._random.uniform(shape, seed, stream)``: the hash of each entry's
    global position, so each rank draws only its own entries."""
    device = leaf.local.device
    seed = torch.as_tensor(generator, dtype=torch.int64, device=device) & _random._M32
    base = _random._mix32(seed ^ ((stream * 0x9E3779B9) & _random._M32))
    index = leaf.positions(0, leaf.local_numel) if leaf.local_numel else torch.zeros(0, dtype=torch.int64)
    bits = _random._mix32(_random._mix32((index + base) & _random._M32) ^ seed)
    return (bits.to(torch.float64) * 2.0**-32).reshape(leaf.local_shape)


def random_unstructured(params, amount, *, generator, masks, where) -> Any:
    """:func:`fprune.random_unstructured` over DTensor leaves.

    An integer seed draws only each rank's own entries (the hash of their global position). A
    ``torch.Generator`` (or ``None``: torch's global generator) gives the single-process masks
    only if every rank draws the same numbers: each rank draws every selected leaf in full, in
    leaf order, as one process does, and keeps its own part (time and a leaf's worth of memory
    per leaf, no communication); the generators' states are part of the inputs the ranks
    compare, so ranks whose generators disagree raise.
    """
    seeded = generator is not None and not isinstance(generator, torch.Generator)
    if seeded and isinstance(generator, torch.Tensor):
        generator = int(generator)
    mesh, comm, (inputs, leaves, amount) = _prepare(
        "random_unstructured", params, amount, None, masks, where, _generator_state(generator)
    )
    def values_of(i, leaf):
        if seeded:
            return _seeded(leaf, generator, i)
        full = _random.uniform(leaf.shape, generator, i, leaf.local.device)
        return full[tuple(slice(o, o + n) for o, n in zip(leaf.offset, leaf.local_shape))]

    return _select_each(mesh, comm, inputs, leaves, amount, values_of, None)


# ----------------------------------------------------------------------------- groups: Rows, NM


def _coordinates(mesh) -> List[tuple]:
    shape = tuple(mesh.shape)
    out = [()]
    for size in shape:
        out = [c + (j,) for c in out for j in range(size)]
    return out


def _shards_along(leaf: "_Leaf", mesh, d: int) -> List[tuple]:
    """``(offset, size)`` along dim ``d`` of every rank's shard of ``leaf`` (from the global shape)."""
    out = set()
    for coordinate in _coordinates(mesh):
        shape, offset = _torch.shard_layout(leaf.shape, tuple(mesh.shape), coordinate, leaf.placements)
        out.add((offset[d], shape[d]))
    return sorted(out)


def _split_along(leaf: "_Leaf", d: int) -> bool:
    """True when some placement shards ``leaf`` along a dim other than ``d``."""
    module = _dtensor_module()
    return any(isinstance(p, module.Shard) and p.dim % len(leaf.shape) != d for p in leaf.placements)


def _sharded(leaf: "_Leaf") -> bool:
    module = _dtensor_module()
    return any(isinstance(p, module.Shard) for p in leaf.placements)


def _other_positions(leaf: "_Leaf", d: int) -> torch.Tensor:
    """Row-major positions, in the full tensor with dim ``d`` removed, of the local entries of
    ``leaf.local.movedim(d, 0)[r]`` (the same for every local index ``r`` along ``d``)."""
    shape = [s for j, s in enumerate(leaf.shape) if j != d]
    local_shape = [s for j, s in enumerate(leaf.local_shape) if j != d]
    offset = [o for j, o in enumerate(leaf.offset) if j != d]
    device = leaf.local.device
    position = torch.zeros(local_shape, dtype=torch.int64, device=device)
    stride = 1
    for j in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[j] = local_shape[j]
        position += (torch.arange(local_shape[j], dtype=torch.int64, device=device) + offset[j]).view(view) * stride
        stride *= shape[j]
    return position.reshape(-1)


def _group_bits(width: int, groups: int, element: int, budget: int) -> int:
    """The digit width whose passes over ``groups`` histograms fit ``budget`` (else the cheapest)."""
    best, best_bytes = 1, None
    for bits in range(min(_MAX_DIGIT, width), 0, -1):
        passes = -(-width // bits)
        total = passes * groups * ((1 << bits) - 1) * element  # the last bin is not sent
        if total <= budget:
            return bits
        if best_bytes is None or total < best_bytes:
            best, best_bytes = bits, total
    return best


def _group_radix(
    comm: "_Comm", parts: list, k: torch.Tensor, low: int, width: int, budget: int, largest: int, totals: torch.Tensor
):
    """The ``k[g]``-th lowest key of every group ``g`` over all ranks, side by side.

    ``parts`` are ``(first_group, keys)`` pairs (or a callable that yields them, once per pass):
    ``keys`` is a ``(groups, entries)`` block of this rank's integer keys for groups
    ``first_group...`` (or for the groups of an int64 tensor ``first_group``, one per row; a
    group may come in several blocks); keys outside
    ``[low, low + 2**width)`` are ignored. ``k`` (int64, one per group, >= 1) is the same on
    every rank. ``totals`` (int64, one per group) counts each group's keys in that range over
    all ranks: the last bin of a histogram is then known (the keys in range less the other
    bins), so each pass sends ``2**bits - 1`` counts per group in one ``all_reduce``. Returns
    ``(key, below, equal)`` tensors: the key, how many keys of the group lie below it and how
    many equal it.
    """
    groups = k.numel()
    count_dtype = torch.int32 if largest < 2**31 else torch.int64  # largest: entries in a group
    bits = _group_bits(width, groups, torch.empty((), dtype=count_dtype).element_size(), budget)
    # No more bins than the largest group has entries: the histograms are sized to the data.
    bits = min(bits, max(1, (largest - 1).bit_length()))
    comm.stats.digit_bits.append(bits)
    device = comm.device
    lows = torch.full((groups,), low, dtype=torch.int64, device=device)
    below = torch.zeros(groups, dtype=torch.int64, device=device)
    remaining = k.clone()
    equal = torch.zeros(groups, dtype=torch.int64, device=device)
    in_range = totals.to(device=device, dtype=torch.int64).clone()
    shift = width
    while shift > 0:
        next_shift = max(shift - bits, 0)
        step_bits = shift - next_shift
        bins = 1 << step_bits
        hist = torch.zeros(groups * bins + 1, dtype=torch.int64, device=device)
        for first, keys in parts() if callable(parts) else parts:
            if keys.numel() == 0:
                continue
            keys = keys.to(torch.int64)
            rows = keys.shape[0]
            if isinstance(first, torch.Tensor):  # the groups of the block's rows, given
                group_ids = first
            else:
                group_ids = torch.arange(first, first + rows, device=device)
            base = lows[group_ids].unsqueeze(1)
            if shift >= 64:  # the whole int64 range: top digit, offset to be non-negative
                digit = (keys >> next_shift) - (base >> next_shift)
                inside = torch.ones_like(keys, dtype=torch.bool)
            else:  # keys - base may wrap only where it is >= 2**63: then it is outside anyway
                offset = keys - base
                inside = (keys >= base) & ((offset >> shift) == 0)
                digit = offset >> next_shift
            if isinstance(first, torch.Tensor):
                index = group_ids.unsqueeze(1) * bins + digit
                index = torch.where(inside, index, groups * bins)  # outside: the discarded last bin
                hist += torch.bincount(index.reshape(-1), minlength=groups * bins + 1)
            else:  # consecutive groups: count into their part of the histograms only
                index = (group_ids - first).unsqueeze(1) * bins + digit
                index = torch.where(inside, index, rows * bins)
                span = hist[first * bins : (first + rows) * bins]
                span += torch.bincount(index.reshape(-1), minlength=rows * bins + 1)[: rows * bins]
        sent = hist[:-1].view(groups, bins)[:, :-1].to(count_dtype).contiguous()
        sent = comm.all_reduce(sent).to(torch.int64)
        hist = torch.cat([sent, (in_range - sent.sum(1)).unsqueeze(1)], 1)
        comm.stats.passes += 1
        cumulative = hist.cumsum(1)
        digit = (cumulative < remaining.unsqueeze(1)).sum(1).clamp(max=bins - 1)
        skipped = torch.where(digit > 0, cumulative.gather(1, (digit - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0)
        below += skipped
        remaining -= skipped
        equal = hist.gather(1, digit.unsqueeze(1)).squeeze(1)
        in_range = equal
        lows += digit << next_shift
        shift = next_shift
    return lows, below, equal


def _row_keys(leaf, values, prior, d, dtype, source) -> torch.Tensor:
    """This rank's keys of ``values`` as ``(local rows along d, local entries per row)``, int64."""
    rows = leaf.local_shape[d]
    moved_values = values.movedim(d, 0).reshape(rows, -1)
    moved_prior = None if prior is None else prior.movedim(d, 0).reshape(rows, -1)
    key_fn = _select.keys(moved_values, moved_prior, dtype, source)
    return key_fn(0, moved_values.numel()).view(rows, -1).to(torch.int64)


def _check_row_amounts(comm, inputs, amounts, least: dict, dim) -> None:
    """An int amount above what a row has left raises on every rank (``least``: leaf -> min alive)."""
    for i, value in least.items():
        if value is not None and amounts[i] > value:
            raise ValueError(
                f"amount={amounts[i]} is more than the {value} parameters left to prune in a "
                f"slice of {inputs.name(i)} along dim {dim}; expected a count of at most "
                f"{value} (or a fraction in [0, 1])."
            )


def rowwise_unstructured(params, amount, *, dim, importance_scores, masks, where, rank) -> Any:
    """:func:`fprune.rowwise_unstructured` over DTensor leaves.

    A leaf sharded only along ``dim`` (or replicated) holds whole rows on each rank: they are
    selected locally, as in one process, with no communication. A leaf sharded along another
    dim has rows split across ranks: per-row kept counts (with prior masks) and per-row radix
    histograms of the keys, then of the tie positions, are summed over the mesh (a few hundred
    bytes per split row, never the parameter).
    """
    source = _select.MAGNITUDE if rank == "magnitude" else None
    mesh, comm, (inputs, leaves, amount) = _prepare(
        "rowwise_unstructured", params, amount, importance_scores, masks, where, (dim, rank)
    )
    amounts = _inputs.leaf_amounts(inputs, amount)
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    dims = {i: _inputs.check_axis(dim, inputs.params.leaves[i], f" at {inputs.name(i)}") for i in chosen}
    new, split, least = {}, [], {}
    for i in chosen:
        leaf, d = leaves[i], dims[i]
        values = leaf.local if inputs.scores[i] is None else inputs.scores[i].to_local()
        prior = _local(inputs.prior[i])
        prior = None if prior is None else _tree.as_bool(prior)
        dtype = _select.key_dtype([values])
        keys = _row_keys(leaf, values, prior, d, dtype, source)
        size = leaf.numel // leaf.shape[d] if leaf.shape[d] else 0
        if _split_along(leaf, d):
            split.append((i, leaf, d, size, keys, prior))
            continue
        # Whole rows here: the single-process program on this rank's rows.
        rows = leaf.local_shape[d]
        alive = torch.full((rows,), size, dtype=torch.int64) if prior is None else prior.movedim(d, 0).reshape(rows, -1).sum(-1)
        k = _amount.count(amounts[i], alive, "parameters", inputs.name(i)) + (size - alive)
        if isinstance(amounts[i], numbers.Integral):
            least[i] = int(alive.min()) if alive.numel() else None
        keep = _lowest_in_groups(keys, k)
        new[i] = keep.reshape(leaf.local.movedim(d, 0).shape).movedim(0, d).contiguous()
    # The int-amount check over every rank's rows (sharded leaves only: one int per leaf).
    sharded_least = [i for i in least if _sharded(leaves[i])]
    if sharded_least:
        values = torch.tensor(
            [-(least[i] if least[i] is not None else 2**62) for i in sharded_least], dtype=torch.int64, device=comm.device
        )
        reduced = comm.all_reduce(values, "max").tolist()
        for i, v in zip(sharded_least, reduced):
            least[i] = None if -v == 2**62 else -v
    if split:
        new.update(_split_rows(comm, inputs, amounts, split, least))
    _check_row_amounts(comm, inputs, amounts, least, dim)
    return _finish(mesh, inputs, leaves, new, comm)


def _split_rows(comm, inputs, amounts, split: list, least: dict) -> dict:
    """Rows split across ranks: per-row radix selects, batched over every such leaf."""
    device = comm.device
    firsts, total_rows = [], 0
    for i, leaf, d, size, keys, prior in split:
        firsts.append(total_rows)
        total_rows += leaf.shape[d]
    # Kept entries per global row (summed over ranks; only with prior masks).
    alive_parts = []
    any_prior = any(prior is not None for *_, prior in split)
    if any_prior:
        counts = torch.zeros(total_rows, dtype=torch.int64, device=device)
        for first, (i, leaf, d, size, keys, prior) in zip(firsts, split):
            start, rows = first + leaf.offset[d], leaf.local_shape[d]
            if prior is None:
                if leaf.owned:
                    counts[start : start + rows] += keys.shape[1]
            elif leaf.owned and rows:
                counts[start : start + rows] += prior.movedim(d, 0).reshape(rows, -1).sum(-1).to(device)
        count_dtype = torch.int32 if max(s for *_, s, _, _ in split) < 2**31 else torch.int64
        alive_all = comm.all_reduce(counts.to(count_dtype)).to(torch.int64)
    ks, sizes = [], []
    for first, (i, leaf, d, size, keys, prior) in zip(firsts, split):
        rows = leaf.shape[d]
        alive = alive_all[first : first + rows] if any_prior else torch.full((rows,), size, dtype=torch.int64, device=device)
        if isinstance(amounts[i], numbers.Integral):
            least[i] = int(alive.min()) if rows else None
        k = _amount.count(amounts[i], alive, "parameters", inputs.name(i)) + (size - alive)
        ks.append(torch.as_tensor(k, dtype=torch.int64, device=device).expand(rows))
        sizes.append(torch.full((rows,), size, dtype=torch.int64, device=device))
    k = torch.cat(ks) if ks else torch.zeros(0, dtype=torch.int64)
    size = torch.cat(sizes)
    k = torch.minimum(k, size)
    keep_all, prune_all = k <= 0, k >= size
    width = 64 if any(_key_width(inputs, s[0]) == 64 for s in split) else 32
    parts = _stack_rows(
        [(first + leaf.offset[d], keys) for first, (i, leaf, d, size_, keys, prior) in zip(firsts, split) if leaf.owned],
        device,
    )
    threshold, below, equal = _group_radix(
        comm, parts, k.clamp(min=1), -(1 << (width - 1)), width, HIST_BUDGET, int(size.max()), size
    )
    ties = k - below  # ties to prune, in [1, equal] where selecting
    partial = ~keep_all & ~prune_all & (ties < equal)
    split_position = torch.where(ties >= equal, size, -1)
    if bool(partial.any()):
        pbits = max(1, int(size.max() - 1).bit_length())
        position_parts = []
        for first, (i, leaf, d, size_, keys, prior) in zip(firsts, split):
            if not leaf.owned:
                continue
            start, rows = first + leaf.offset[d], leaf.local_shape[d]
            positions = _other_positions(leaf, d).unsqueeze(0).expand(rows, -1)
            tie = keys == threshold[start : start + rows].unsqueeze(1)
            position_parts.append((start, torch.where(tie, positions, 1 << pbits)))
        position_parts = _stack_rows(position_parts, device)
        found, _, _ = _group_radix(
            comm, position_parts, ties.clamp(min=1), 0, pbits, POSITION_BUDGET, int(size.max()), equal
        )
        split_position = torch.where(partial, found, split_position)
    new = {}
    for first, (i, leaf, d, size_, keys, prior) in zip(firsts, split):
        start, rows = first + leaf.offset[d], leaf.local_shape[d]
        sl = slice(start, start + rows)
        positions = _other_positions(leaf, d).unsqueeze(0)
        thr = threshold[sl].unsqueeze(1)
        keep = (keys > thr) | ((keys == thr) & (positions > split_position[sl].unsqueeze(1)))
        keep = torch.where(keep_all[sl].unsqueeze(1), True, torch.where(prune_all[sl].unsqueeze(1), False, keep))
        new[i] = keep.reshape(leaf.local.movedim(d, 0).shape).movedim(0, d).contiguous()
    return new


def _stack_rows(blocks: list, device) -> list:
    """``(first_row, (rows, entries))`` blocks stacked by row length into ``(row ids, keys)``
    blocks: one histogram per row length and pass, not one per leaf."""
    by_length: dict = {}
    for first, keys in blocks:
        if keys.numel():
            by_length.setdefault(keys.shape[1], []).append((first, keys))
    out = []
    for group in by_length.values():
        ids = torch.cat([torch.arange(f, f + k.shape[0], device=device) for f, k in group])
        out.append((ids, torch.cat([k.to(device) for _, k in group])))
    return out


def _key_width(inputs, i) -> int:
    values = inputs.params.leaves[i] if inputs.scores[i] is None else inputs.scores[i]
    return 32 if _select.key_dtype([values]) == torch.int32 else 64


def _lowest_in_groups(keys: torch.Tensor, k) -> torch.Tensor:
    """As fprune.select's: keep-masks pruning the ``k[g]`` lowest keys of every group (last dim)."""
    k = torch.as_tensor(k, device=keys.device)
    order = torch.argsort(keys, dim=-1, stable=True)
    positions = torch.arange(keys.shape[-1], device=keys.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(-1, order, positions)
    return ranks >= k.unsqueeze(-1) if k.dim() else ranks >= k


def n_m(params, n, m, *, dim, importance_scores, masks, where, rank) -> Any:
    """:func:`fprune.n_m` over DTensor leaves.

    Groups of ``m`` consecutive entries along ``dim`` that lie inside one rank's shard (every
    group, unless ``dim`` is sharded with shard boundaries that are not multiples of ``m``) are
    selected locally, as in one process, with no communication. Where a boundary along ``dim``
    splits groups, the keys of those groups' entries (``m`` per split group and line, the
    boundary entries only) are summed into one buffer over the mesh, so every rank has the
    whole split groups and selects them as one process would.
    """
    source = _select.MAGNITUDE if rank == "magnitude" else None
    mesh, comm, (inputs, leaves, _) = _prepare(
        "n_m", params, None, importance_scores, masks, where, (n, m, dim, rank), check_amount=False
    )
    chosen = [i for i, c in enumerate(inputs.chosen) if c]
    dims = {i: _inputs.check_axis(dim, inputs.params.leaves[i], f" at {inputs.name(i)}") for i in chosen}
    for i in chosen:
        size = leaves[i].shape[dims[i]]
        if size % m:
            raise ValueError(
                f"Expected the size of {inputs.name(i)} along dim {dim}, {size}, to be a "
                f"multiple of m={m} (groups of m consecutive entries)."
            )
    new, exchanges = {}, []
    for i in chosen:
        leaf, d = leaves[i], dims[i]
        values = leaf.local if inputs.scores[i] is None else inputs.scores[i].to_local()
        prior = _local(inputs.prior[i])
        prior = None if prior is None else _tree.as_bool(prior)
        dtype = _select.key_dtype([values])
        moved = tuple(leaf.local.movedim(d, -1).shape)
        lines, length = math.prod(moved[:-1]), moved[-1]
        key_fn = _select.keys(values.movedim(d, -1).reshape(lines, length), None if prior is None else prior.movedim(d, -1).reshape(lines, length), dtype, source)
        keys = key_fn(0, lines * length).view(lines, length)
        keep = torch.ones(lines, length, dtype=torch.bool, device=leaf.local.device)
        start = leaf.offset[d]
        # Whole groups of this shard: the single-process program on them.
        first = -(-start // m) * m - start
        last = max(first, ((start + length) // m) * m - start)
        if last > first:
            block = keys[:, first:last].reshape(lines, -1, m)
            keep[:, first:last] = _nm_keep(block, n, m).reshape(lines, -1)
        # Groups that shard boundaries along dim split (the same set on every rank).
        split = sorted(
            {b // m for offset, size in _shards_along(leaf, mesh, d) if size for b in (offset, offset + size) if b % m and 0 < b < leaf.shape[d]}
        )
        if split:
            exchanges.append((i, leaf, d, keys, keep, split, dtype))
        new[i] = (keep, moved)
    if exchanges:
        _exchange_groups(comm, exchanges, n, m)
    out = {}
    for i, (keep, moved) in new.items():
        d = dims[i]
        out[i] = keep.reshape(moved).movedim(-1, d).contiguous()
    return _finish(mesh, inputs, leaves, out, comm)


def _nm_keep(keys: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep-masks of whole groups ``keys[..., m]`` as one process selects them (prior masks: the
    entries with the pruned key are pruned first and a group keeps ``min(n, alive)``)."""
    alive = (keys != _select.pruned_key(torch.int32 if keys.dtype == torch.int32 else torch.int64)).sum(-1)
    return _lowest_in_groups(keys, m - torch.clamp(alive, max=n))


def _exchange_groups(comm, exchanges: list, n: int, m: int) -> None:
    """Split N:M groups: the keys of their entries, summed over ranks into one buffer."""
    device = comm.device
    layout, total = [], 0
    for i, leaf, d, keys, keep, split, dtype in exchanges:
        full_lines = leaf.numel // leaf.shape[d]
        layout.append(total)
        total += full_lines * len(split) * m
    dtype = torch.int64 if any(e[6] == torch.int64 for e in exchanges) else torch.int32
    buffer = torch.zeros(total, dtype=dtype, device=device)
    placed = []
    for base, (i, leaf, d, keys, keep, split, _) in zip(layout, exchanges):
        lines = _other_positions(leaf, d).to(device)  # global line of each local line
        start, length = leaf.offset[d], leaf.local_shape[d]
        slots = []
        for s, g in enumerate(split):
            lo, hi = max(start, g * m), min(start + length, (g + 1) * m)
            if lo >= hi:
                continue
            local = slice(lo - start, hi - start)
            index = base + (lines.unsqueeze(1) * len(split) + s) * m + torch.arange(lo - g * m, hi - g * m, device=device)
            slots.append((local, index))
            if leaf.owned:
                buffer[index.reshape(-1)] = keys[:, local].reshape(-1).to(device, dtype)
        placed.append(slots)
    buffer = comm.all_reduce(buffer)
    for base, (i, leaf, d, keys, keep, split, key_dtype), slots in zip(layout, exchanges, placed):
        full_lines = leaf.numel // leaf.shape[d]
        groups = buffer[base : base + full_lines * len(split) * m].view(-1, m).to(key_dtype)
        decided = _nm_keep(groups, n, m).reshape(-1)
        for local, index in slots:
            keep[:, local] = decided[index - base].to(keep.device)


def random_structured(params, amount, dim, *, generator, masks, where) -> Any:
    """:func:`fprune.random_structured` over DTensor leaves.

    The draws are one per channel: every rank draws every selected leaf's channel scores as one
    process does (a seed or a generator in the same state on every rank, which the ranks
    compare) and ranks the channels itself. Only with prior masks, whose alive channels are
    needed, does one ``all_reduce`` of one kept-entry count per channel run.
    """
    seeded = generator is not None and not isinstance(generator, torch.Generator)
    if seeded and isinstance(generator, torch.Tensor):
        generator = int(generator)
    mesh, comm, (inputs, leaves, amount) = _prepare(
        "random_structured", params, amount, None, masks, where, (dim, _generator_state(generator))
    )
    amounts = _inputs.leaf_amounts(inputs, amount)
    chosen = [i for i, a in enumerate(amounts) if a is not None]
    dims = {
        i: _inputs.check_dim(
            dim, inputs.params.leaves[i], f" at {inputs.name(i)}",
            "leave such leaves out with where=lambda name, p: p.dim() > 1.",
        )
        for i in chosen
    }
    counts = []
    # Counts are summed over the mesh only where a leaf is sharded (else each rank counts its copy).
    exchange = any(_sharded(leaves[i]) and inputs.prior[i] is not None for i in chosen)
    for i in chosen:
        leaf, d, prior = leaves[i], dims[i], _local(inputs.prior[i])
        if prior is None:
            continue
        vector = torch.zeros(leaf.shape[d], dtype=torch.int64, device=comm.device)
        if (leaf.owned or not exchange) and leaf.local_numel:
            others = [x for x in range(len(leaf.shape)) if x != d]
            start = leaf.offset[d]
            vector[start : start + leaf.local_shape[d]] = _tree.as_bool(prior).sum(dim=others).to(comm.device)
        counts.append(vector)
    if exchange:
        reduced = comm.all_reduce(torch.cat(counts))
    else:
        reduced = torch.cat(counts) if counts else None
    position = 0
    new = {}
    for i in chosen:
        leaf, d = leaves[i], dims[i]
        channels = leaf.shape[d]
        prior = _local(inputs.prior[i])
        live = None
        if prior is not None:
            live = reduced[position : position + channels] > 0
            position += channels
        n_alive = channels if live is None else int(live.sum())
        k = _amount.count(amounts[i], n_alive, "channels", f"{inputs.name(i)} along dim {d}") + (channels - n_alive)
        draws = _random.uniform((channels,), generator, i, leaf.local.device)
        dtype = _select.key_dtype([draws])
        (keep,) = _select.prune_lowest(
            [(channels, _select.keys(draws, None if live is None else live.to(draws.device), dtype))],
            k, traced=False, device=draws.device,
        )
        start, count = leaf.offset[d], leaf.local_shape[d]
        shape = [1] * len(leaf.shape)
        shape[d] = count
        local = keep[start : start + count].view(shape).expand(leaf.local_shape)
        new[i] = local.contiguous() if prior is None else local & _tree.as_bool(prior)
    return _finish(mesh, inputs, leaves, new, comm)


# ----------------------------------------------------------------------------- per-leaf rankings

# Sharded leaves of at most this many entries exchange their keys (4 or 8 bytes an entry, no
# more than the histograms of a radix select would cost) and are selected whole on every rank.
SMALL_LEAF = 64


def _alive_each(comm, inputs, leaves, indices) -> List[int]:
    """Entries the prior masks keep, per leaf: summed over ranks only for sharded leaves with a
    prior mask (int32 counts while they fit); the others are known without communication."""
    counts, exchanged = [], []
    for i in indices:
        prior, leaf = _local(inputs.prior[i]), leaves[i]
        if prior is None:
            counts.append(leaf.numel)
        elif not _sharded(leaf):
            counts.append(int(_tree.as_bool(prior).sum()))
        else:
            counts.append(None)
            exchanged.append((len(counts) - 1, int(_tree.as_bool(prior).sum()) if leaf.owned else 0, leaf.numel))
    if exchanged:
        dtype = torch.int32 if max(n for *_, n in exchanged) < 2**31 else torch.int64
        reduced = comm.all_reduce(torch.tensor([c for _, c, _ in exchanged], dtype=dtype, device=comm.device))
        for (j, _, _), value in zip(exchanged, reduced.tolist()):
            counts[j] = int(value)
    return counts


def _per_leaf(comm, items: list) -> List[torch.Tensor]:
    """This rank's local keep-masks of per-leaf rankings ``(leaf, key_fn, k, key dtype)``.

    Leaves not sharded on any mesh dim (``Replicate()`` only) are whole on every rank: the
    single-process engine selects them with no communication. Sharded leaves of at most
    :data:`SMALL_LEAF` entries exchange their keys. The others run one radix select side by
    side (:func:`_group_radix`: one histogram row of ``2**bits`` counts per leaf and pass, the
    digit width the widest that fits the budget for all of them), then, for the leaves where
    only some ties are pruned, the same select over the ties' global positions.
    """
    keeps: List[Optional[torch.Tensor]] = [None] * len(items)
    local, small, big = [], [], []
    for j, (leaf, key_fn, k, dtype) in enumerate(items):
        device = leaf.local.device
        if k <= 0 or k >= leaf.numel:
            keeps[j] = torch.full(leaf.local_shape, k <= 0, dtype=torch.bool, device=device)
        elif not _sharded(leaf):
            local.append(j)
        elif leaf.numel <= SMALL_LEAF:
            small.append(j)
        else:
            big.append(j)
    if local:
        found = _select.prune_lowest_each(
            [(items[j][0].local_numel, items[j][1]) for j in local],
            [items[j][2] for j in local],
            traced=False,
            device=items[local[0]][0].local.device,
        )
        for j, keep in zip(local, found):
            keeps[j] = keep.view(items[j][0].local_shape)
    if small:
        _small_leaves(comm, items, small, keeps)
    if big:
        _big_leaves(comm, items, big, keeps)
    return keeps


def _small_leaves(comm, items, chosen, keeps) -> None:
    """Sharded leaves of a few entries: their keys summed into one buffer, selected whole."""
    wide = any(items[j][3] == torch.int64 for j in chosen)
    dtype = torch.int64 if wide else torch.int32
    bases, total = [], 0
    for j in chosen:
        bases.append(total)
        total += items[j][0].numel
    buffer = torch.zeros(total, dtype=dtype, device=comm.device)
    for base, j in zip(bases, chosen):
        leaf, key_fn = items[j][0], items[j][1]
        if leaf.owned and leaf.local_numel:
            buffer[base + leaf.positions(0, leaf.local_numel).to(comm.device)] = key_fn(0, leaf.local_numel).to(comm.device, dtype)
    buffer = comm.all_reduce(buffer)
    for base, j in zip(bases, chosen):
        leaf, _, k, key_dtype = items[j]
        whole = _lowest_in_groups(buffer[base : base + leaf.numel].to(key_dtype).view(1, -1), k).view(-1)
        mine = whole[leaf.positions(0, leaf.local_numel).to(whole.device)] if leaf.local_numel else whole[:0]
        keeps[j] = mine.to(leaf.local.device).view(leaf.local_shape)


def _big_leaves(comm, items, chosen, keeps) -> None:
    device = comm.device
    buffers = {}

    def buffer_for(leaf, dtype):
        held = buffers.get(dtype)
        if held is None or held.numel() < min(_select.CHUNK, leaf.local_numel):
            held = buffers[dtype] = torch.empty(max(1, min(_select.CHUNK, leaf.local_numel)), dtype=dtype, device=leaf.local.device)
        return held

    # Owned leaves of a few local entries: their keys computed once, stacked by local size.
    stacked: dict = {}
    kept = 0
    for g, j in enumerate(chosen):
        leaf, key_fn, _, dtype = items[j]
        if leaf.owned and 0 < leaf.local_numel <= SMALL_LOCAL and kept < _KEPT_KEYS:
            stacked.setdefault(leaf.local_numel, []).append((g, key_fn(0, leaf.local_numel).reshape(-1).to(torch.int64)))
            kept += leaf.local_numel
    blocks = [
        (torch.tensor([g for g, _ in rows], dtype=torch.int64, device=device), torch.stack([key for _, key in rows]))
        for rows in stacked.values()
    ]
    in_blocks = {g for rows in stacked.values() for g, _ in rows}
    stacked.clear()

    def key_blocks():
        yield from blocks
        for g, j in enumerate(chosen):
            leaf, key_fn, _, dtype = items[j]
            if leaf.owned and g not in in_blocks:
                for _, _, key in _chunk_keys(leaf, key_fn, buffer_for(leaf, dtype)):
                    yield g, key.view(1, -1)

    k = torch.tensor([items[j][2] for j in chosen], dtype=torch.int64, device=device)
    width = 64 if any(items[j][3] == torch.int64 for j in chosen) else 32
    largest = max(items[j][0].numel for j in chosen)
    totals = torch.tensor([items[j][0].numel for j in chosen], dtype=torch.int64, device=device)
    threshold, below, equal = _group_radix(
        comm, key_blocks, k, -(1 << (width - 1)), width, HIST_BUDGET, largest, totals
    )
    ties = k - below
    partial = (ties < equal).tolist()
    split = {}
    subset = [g for g, p in enumerate(partial) if p]
    if subset:
        pbits = max(1, max(items[chosen[g]][0].numel - 1 for g in subset).bit_length())
        thresholds = threshold.tolist()

        def position_blocks():
            for row, g in enumerate(subset):
                leaf, key_fn, _, dtype = items[chosen[g]]
                if leaf.owned:
                    for start, stop, key in _chunk_keys(leaf, key_fn, buffer_for(leaf, dtype)):
                        tie = key == thresholds[g]
                        yield row, torch.where(tie, leaf.positions(start, stop), 1 << pbits).view(1, -1)

        found, _, _ = _group_radix(
            comm, position_blocks, ties[subset], 0, pbits, POSITION_BUDGET, largest, equal[subset]
        )
        split = dict(zip(subset, found.tolist()))
    thresholds = threshold.tolist()
    for g, j in enumerate(chosen):
        leaf, key_fn, _, dtype = items[j]
        thr = thresholds[g]
        position = split.get(g, leaf.numel)  # no split: every tie pruned
        keep = torch.empty(leaf.local_numel, dtype=torch.bool, device=leaf.local.device)
        for start, stop, key in _chunk_keys(leaf, key_fn, buffer_for(leaf, dtype)):
            part = keep[start:stop]
            torch.gt(key, thr, out=part)
            if g in split:
                part |= (key == thr) & (leaf.positions(start, stop) > position)
        keeps[j] = keep.view(leaf.local_shape)


# ----------------------------------------------------------------------------- for the pruners


def kept_counts(masks: Sequence[Any]) -> List[int]:
    """The entries each DTensor mask keeps, over the whole mesh (one ``all_reduce``)."""
    masks = list(masks)
    if not masks:
        return []
    mesh = masks[0].device_mesh
    coordinate = mesh.get_coordinate()
    device = torch.device(mesh.device_type)
    comm = _Comm(mesh, device)
    counts = []
    for j, m in enumerate(masks):
        leaf = _Leaf(j, m, mesh, coordinate)
        counts.append(int(_tree.as_bool(leaf.local).sum()) if leaf.owned else 0)
    return [int(c) for c in comm.all_reduce(torch.tensor(counts, dtype=torch.int64, device=device)).tolist()]


def seeded_uniform(param, seed: int, stream: int):
    """``fprune._random.uniform(param.shape, seed, stream)`` as a DTensor like ``param``: each
    rank hashes only its own entries' global positions."""
    mesh = param.device_mesh
    leaf = _Leaf(stream, param, mesh, mesh.get_coordinate())
    return leaf.dtensor(_seeded(leaf, seed, stream), mesh)
