"""Post-training over ranks (``group=``): each rank reads its own share of the calibration
batches; the statistics' partial sums are added up across the ranks, each layer is solved by
one rank and its result broadcast, so that every rank ends with the same model.

The pipeline calls a small interface, :class:`Alone` for one process (every call does nothing)
and :class:`Ranks` over a ``torch.distributed`` process group:

- ``agree(options)``: the ranks were given the same options (a digest of each, compared);
- ``step(what)``: a context in which one rank may fail: at its end the ranks agree on a status
  code (an ``all_reduce``), and every rank raises the same error, naming the rank that failed,
  so that no rank is left waiting in a collective the failed one never joins;
- ``total(count)``, ``reduce(sums)``: counts and partial sums added up across the ranks;
- ``owners(costs)``: the rank that solves each layer, the same on every rank;
- ``share(owner, result, like)``: the owner's result broadcast to every rank.

Summation order: a rank adds its own batches' sums in order, then the ranks' sums are added
by the collective, so the statistics equal one process's on all the batches up to the order of
the float additions (float64 sums for the hessians; the row counts exactly).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fprune.calibration import Hessian


class _OneProcess:
    """The default of ``group=``: no process group. Told apart from ``None``, which
    ``torch.distributed.group.WORLD`` is until ``init_process_group`` runs."""

    def __repr__(self) -> str:
        return "<one process>"


ONE_PROCESS: Any = _OneProcess()


class Alone:
    """One process: every rank operation is a no-op; errors raise where they happen."""

    rank = 0
    world = 1

    def step(self, what: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def agree(self, options: dict[str, str]) -> None:
        pass

    def total(self, count: int) -> int:
        return count

    def reduce(self, sums: dict[str, dict[str, torch.Tensor]]) -> None:
        pass

    def owners(self, costs: dict[str, float]) -> dict[str, int]:
        return dict.fromkeys(costs, 0)

    def share(self, owner: int, result: Any, like: torch.Tensor, mask: bool = True) -> Any:
        return result

    def solve(self, layers: list, *, solve: Callable, write: Callable, **_: Any) -> int:
        """Each layer solved and written back at once (one layer's work at a time)."""
        for layer in layers:
            write(layer, *solve(layer))
        return len(layers)


class NoWriter:
    """The output writer of the ranks other than 0 (rank 0 alone writes a checkpoint)."""

    def start(self, deferred: Any) -> None:
        pass

    def write(self, name: str, tensor: torch.Tensor) -> None:
        pass

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


def over(group: Any, function: str = "oneshot.prune") -> Alone | Ranks:
    """:class:`Alone` for the default, else :class:`Ranks` over ``group`` (checked)."""
    if group is ONE_PROCESS:
        return Alone()
    return Ranks(group, function)


class Ranks:
    """The ranks of a ``torch.distributed`` process group (any backend: the small tensors that
    carry counts and status codes are made on the group's device, CUDA for NCCL)."""

    def __init__(self, group: Any, function: str) -> None:
        import torch.distributed as dist

        self.function = function
        if group is None:
            raise ValueError(
                f"{function}: group=None names no process group; torch.distributed.group.WORLD is "
                f"None until torch.distributed.init_process_group() runs (torchrun starts the "
                f"processes, the script still calls it). Call it first, or leave group out to run "
                f"in one process."
            )
        if not dist.is_available():
            raise ValueError(f"{function}: group= needs torch.distributed, which this torch build lacks.")
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(
                f"Expected group to be a torch.distributed process group (torch.distributed.group.WORLD, "
                f"or one from torch.distributed.new_group), got {type(group).__name__}."
            )
        if not dist.is_initialized():
            raise ValueError(
                f"{function}: group= is given but no process group is initialized (was "
                f"torch.distributed.destroy_process_group called?); call "
                f"torch.distributed.init_process_group() first."
            )
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError(f"{function}: this process is not a member of group= (its rank there is -1).")
        self.dist = dist
        self.group = group
        self.rank = rank
        self.world = dist.get_world_size(group)
        backend = str(dist.get_backend(group))
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
        )

    def _source(self, rank: int) -> int:
        """The global rank of this group's rank ``rank`` (what broadcasts name)."""
        return self.dist.get_global_rank(self.group, rank)

    # Agreement

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Run the body; then every rank learns whether any failed, and all raise one error."""
        error: Exception | None = None
        try:
            yield
        except Exception as caught:  # agreed on below: every rank raises
            error = caught
        self._settle(error, what)

    def _settle(self, error: Exception | None, what: str) -> None:
        failed = torch.zeros(self.world, dtype=torch.int32, device=self.device)
        failed[self.rank] = int(error is not None)
        self.dist.all_reduce(failed, group=self.group)
        ranks = [r for r, code in enumerate(failed.tolist()) if code]
        if not ranks:
            return
        first = ranks[0]
        payload: list[Any] = [None]
        if self.rank == first:
            assert error is not None
            kind = next(
                k.__name__ for k in (TypeError, ValueError, RuntimeError, Exception) if isinstance(error, k)
            )
            notes = "".join(f" ({note})" for note in getattr(error, "__notes__", []))
            payload = [(kind, f"{type(error).__name__}: {error}{notes}")]
        self.dist.broadcast_object_list(payload, src=self._source(first), group=self.group)
        kind, text = payload[0]
        also = (
            f" (and rank{'s' if len(ranks) > 2 else ''} {', '.join(map(str, ranks[1:]))})"
            if len(ranks) > 1
            else ""
        )
        cls = {"TypeError": TypeError, "ValueError": ValueError}.get(kind, RuntimeError)
        message = f"{self.function} over {self.world} ranks: rank {first}{also} failed {what}: {text}"
        raise cls(message) from error

    def agree(self, options: dict[str, str]) -> None:
        """Every rank was given the same options, else one ``ValueError`` on all of them that
        names the options that differ and the ranks that hold each value."""
        mine = {name: (_digest(text), _short(text)) for name, text in options.items()}
        every: list[Any] = [None] * self.world
        self.dist.all_gather_object(every, mine, group=self.group)
        differ = []
        for name in options:
            values: dict[str, tuple[str, list[int]]] = {}
            for rank, theirs in enumerate(every):
                digest, shown = theirs.get(name, ("", "(none)"))
                values.setdefault(digest, (shown, []))[1].append(rank)
            if len(values) > 1:
                parts = [
                    f"{shown} on rank{'s' if len(r) > 1 else ''} {_ranks(r)}" for shown, r in values.values()
                ]
                differ.append(f"{name}: {'; '.join(parts)}")
        if differ:
            raise ValueError(
                f"{self.function} over {self.world} ranks: the ranks were given different options, "
                f"which would prune different models; expected the same on every rank (only the "
                f"batches differ). " + " | ".join(differ)
            )

    # Statistics

    def total(self, count: int) -> int:
        """``count`` added up over the ranks."""
        summed = torch.tensor([count], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(summed, group=self.group)
        return int(summed.item())

    def reduce(self, sums: dict[str, dict[str, torch.Tensor]]) -> None:
        """Add up the partial sums across the ranks, in place: ``sums`` maps each layer to its
        table (a flat dict of tensors, shared by layers fed one input). A rank that has no
        table for a layer (no batch of its share reached it) joins with zeros; where the
        ranks' tables are shared differently, each layer's table is reduced apart."""
        layout = _layout(sums)
        every: list[Any] = [None] * self.world
        self.dist.all_gather_object(every, layout, group=self.group)
        groups: dict[tuple[str, ...], dict[str, tuple[tuple[int, ...], str]]] = {}
        for theirs in every:
            for names, spec in theirs:
                groups.setdefault(names, spec)
        if len({name for names in groups for name in names}) < sum(len(names) for names in groups):
            # A layer shares its table with other layers on one rank, not on another: apart.
            for name in list(sums):
                sums[name] = {key: value.clone() for key, value in sums[name].items()}
            apart: dict[tuple[str, ...], dict[str, tuple[tuple[int, ...], str]]] = {}
            for names, spec in groups.items():
                for name in names:
                    apart.setdefault((name,), spec)
            groups = apart
        for names, spec in sorted(groups.items()):
            table = sums.get(names[0])
            if table is None:
                device = next((t.device for tb in sums.values() for t in tb.values()), self.device)
                table = {
                    key: torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
                    for key, (shape, dtype) in spec.items()
                }
                for name in names:
                    sums[name] = table
            for key in sorted(spec):
                self.dist.all_reduce(table[key], group=self.group)

    # Layers

    def owners(self, costs: dict[str, float]) -> dict[str, int]:
        return assign(costs, self.world)

    def solve(
        self,
        layers: list,
        *,
        solve: Callable,
        write: Callable,
        like: Callable,
        cost: Callable,
        release: Callable,
        masks: bool,
        what: str,
    ) -> int:
        """Each layer solved by its owner (``solve(layer) -> (new, keep)``; the others
        ``release(layer)``'s statistic first), the ranks agree that every solve succeeded, then
        every result is broadcast from its owner and written on every rank (``write(layer, new,
        keep)``, ``new`` in the dtype of ``like(layer)``)."""
        owner = self.owners({layer.name: cost(layer) for layer in layers})
        mine = [layer for layer in layers if owner[layer.name] == self.rank]
        for layer in layers:
            if owner[layer.name] != self.rank:
                release(layer)
        results = {}
        with self.step(what):
            for layer in mine:
                new, keep = solve(layer)
                results[layer.name] = (new.to(like(layer).dtype), keep)
        for layer in layers:
            write(layer, *self.share(owner[layer.name], results.pop(layer.name, None), like(layer), masks))
        return len(layers)

    def share(self, owner: int, result: Any, like: torch.Tensor, mask: bool = True) -> Any:
        """The owner's ``(new weight, keep)`` (the weight's shape and dtype) on every rank,
        broadcast byte for byte (the keep-mask only if ``mask``)."""
        if self.rank == owner:
            new, keep = result
            new = new.contiguous()
            keep = keep.contiguous() if mask else keep
        else:
            new = torch.empty(like.shape, dtype=like.dtype, device=like.device)
            keep = torch.empty(like.shape, dtype=torch.bool, device=like.device) if mask else None
        self._broadcast(new, owner)
        if mask:
            self._broadcast(keep, owner)
        return new, keep

    def _broadcast(self, tensor: torch.Tensor, owner: int) -> None:
        if tensor.numel():
            self.dist.broadcast(tensor.view(-1).view(torch.uint8), src=self._source(owner), group=self.group)


def assign(costs: dict[str, float], world: int) -> dict[str, int]:
    """The rank that solves each layer: the costliest first (by name on ties), each to the rank
    with the least work so far (the lowest rank on ties): the same on every rank, as the costs
    are. The ranks' loads then differ by at most the largest cost."""
    load = [0.0] * world
    owner = {}
    for name in sorted(costs, key=lambda n: (-costs[n], n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += costs[name]
    return owner


def _layout(sums: dict[str, dict[str, torch.Tensor]]) -> list:
    """This rank's tables: the sorted names sharing each, and each entry's shape and dtype."""
    shared: dict[int, list[str]] = {}
    for name in sorted(sums):
        shared.setdefault(id(sums[name]), []).append(name)
    return [
        (
            tuple(names),
            {
                key: (tuple(value.shape), str(value.dtype).removeprefix("torch."))
                for key, value in sums[names[0]].items()
            },
        )
        for names in shared.values()
    ]


def cost(statistic: Any, layer: Any) -> float:
    """The estimated flops of one layer's solve, ``(rows, cols)`` its weight as ``(out, in)``:
    ``rows * cols^2`` plus ``cols^3`` for the factorization, for a method that reads the
    hessian (SparseGPT, Refine); ``rows * cols`` for one that ranks scores (Wanda, magnitude)."""
    shape = layer.weight.shape
    rows, cols = (shape[1], shape[0]) if layer.transposed else (shape[0], shape[-1])
    if any(isinstance(part, Hessian) for part in getattr(statistic, "parts", (statistic,))):
        return float(rows) * cols * cols + float(cols) ** 3
    return float(rows) * cols


def options(plan: Any) -> dict[str, str]:
    """What the ranks must agree on, each as a text: the method, the amounts (or N:M, or the
    profile and its sparsity), the blocks, and the layers selected with their shapes."""
    amounts = set(plan.amounts.values())
    if plan.profile is not None:
        sparsity = repr(plan.sparsity)
    elif len(amounts) == 1:
        sparsity = repr(next(iter(amounts)))
    else:
        sparsity = repr(sorted(plan.amounts.items()))
    layers = [(layer.name, tuple(layer.weight.shape)) for group in plan.layers for layer in group]
    return {
        "method": describe(plan.method),
        "n_m": repr(plan.n_m),
        "sparsity": sparsity,
        "profile": describe(plan.profile),
        "blocks": repr(plan.blocks),
        "layers": repr(layers),
    }


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def describe(value: Any) -> str:
    """A text for an option that is the same on every rank given the same option: its repr
    without memory addresses (a function: its module and name)."""
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    return _ADDRESS.sub("", repr(value))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 20] + " ... " + text[-15:]


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
