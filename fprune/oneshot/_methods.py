"""Layer methods: the statistic a post-training method needs of the data, and its solve of one
layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fprune import reconstruct, scores
from fprune.calibration import Hessian, InputNorms, NoData, Statistic
from fprune.select import NM, Rows, select

# The names a method written before statistics were objects may still give.
_SHORTHANDS_STATISTIC: dict[str, Callable[[], Statistic]] = {
    "hessian": Hessian,
    "norms": InputNorms,
    "none": NoData,
}


class LayerMethod:
    """A post-training method for one linear layer: the statistic it needs, and the solve.

    A subclass sets ``statistic``, a :class:`fprune.calibration.Statistic` object
    (:class:`~fprune.calibration.Hessian`: ``H = 2/n sum x x^T`` of the layer's inputs,
    ``(in, in)``; :class:`~fprune.calibration.InputNorms`: the L2 norm of each input feature
    over the calibration rows, ``(1, in)``; :class:`~fprune.calibration.NoData`, the default:
    no data; or a statistic of its own), as a class attribute or a property, and overrides
    :meth:`prune_layer`. :func:`prune` runs the rest: the blocks, the statistic's accumulation
    (one per set of layers fed the same input), the float32 work copy, the write-back. The
    names ``"hessian"``, ``"norms"`` and ``"none"`` stand for those three statistics.

    Example:
        >>> import torch, fprune
        >>> class Random(fprune.oneshot.LayerMethod):     # a method that needs no data
        ...     statistic = fprune.calibration.NoData()
        ...     def prune_layer(self, weight, statistic, amount=None, *, n_m=None):
        ...         scores = torch.rand(weight.shape, generator=torch.Generator().manual_seed(0))
        ...         keep = fprune.l1_unstructured({"w": weight}, amount, importance_scores={"w": scores})["w"]
        ...         return weight * keep, keep
        >>> new, keep = Random().prune_layer(torch.ones(4, 4), None, 0.25)
        >>> int((~keep).sum()), float(new.sum())
        (4, 12.0)
    """

    statistic: Statistic | str = NoData()

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: Any,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prune one layer: ``(weight, keep-mask)`` for ``weight`` ``(out, in)``.

        Args:
            weight: ``(out, in)`` float32 work copy (float64 for a float64 model; a ``Conv1D``
                weight transposed). Do not modify it.
            statistic: the layer's statistic: what ``statistic.finish`` gives (``None`` for
                :class:`~fprune.calibration.NoData`). Do not modify it (layers that read the
                same input may share it).
            amount: the fraction of the layer to prune, or ``None`` with ``n_m``.
            n_m: ``(n, m)``: keep ``n`` of every ``m`` consecutive inputs of each output.

        Returns:
            The new weight (zero where pruned) and its ``torch.bool`` keep-mask, both
            ``(out, in)``.
        """
        raise NotImplementedError(f"{type(self).__name__} must override prune_layer")


@dataclass(frozen=True)
class SparseGPT(LayerMethod):
    """SparseGPT (Frantar & Alistarh 2023): :func:`fprune.reconstruct.sparsegpt` with the
    layer's hessian, the mask and the update of the kept weights.

    Args:
        blocksize: columns per block (the reference's 128).
        damp: the damping, a fraction of the mean of ``diag H`` (the reference's ``percdamp``).
        accumulate: the dtype of the hessian's sums: ``torch.float32`` (default) or
            ``torch.float64`` (the reference's; see :class:`fprune.calibration.Hessian`).
    """

    blocksize: int = 128
    damp: float = 0.01
    accumulate: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        reconstruct.check_positive_int(self.blocksize, "blocksize")
        reconstruct.check_damp(self.damp)
        Hessian(self.accumulate)  # checks it

    @property
    def statistic(self) -> Statistic:  # type: ignore[override]
        return Hessian(self.accumulate)

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: Any,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None  # the pipeline gives the hessian
        return reconstruct.sparsegpt(
            weight, statistic, amount, n_m=n_m, blocksize=self.blocksize, damp=self.damp
        )


@dataclass(frozen=True)
class Wanda(LayerMethod):
    """Wanda (Sun et al. 2024): scores ``|W| * ||x_j||`` (:func:`fprune.scores.wanda`), the
    lowest ``round(amount * in)`` of each output row pruned (``fprune.select.Rows``), or N:M
    along the inputs; the kept weights unchanged."""

    statistic = InputNorms()

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: Any,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None  # the pipeline gives the norms
        score = scores.wanda({"w": weight}, {"w": statistic})
        if n_m is not None:
            keep = select(score, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        else:
            keep = select(score, amount, scope=Rows(0))["w"]
        return weight * keep, keep


@dataclass(frozen=True)
class Magnitude(LayerMethod):
    """Magnitude: the lowest ``|W|`` of the whole layer (``round(amount * numel)``, as
    :func:`fprune.l1_unstructured`), or N:M; needs no data (no forward runs unless a profile or
    :class:`Refine` asks for one)."""

    statistic = NoData()

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: Any,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        score = {"w": weight.abs()}
        if n_m is not None:
            keep = select(score, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        else:
            keep = select(score, amount)["w"]
        return weight * keep, keep


@dataclass(frozen=True)
class Refine(LayerMethod):
    """Any method, then the least squares on its mask (:func:`fprune.reconstruct.refine`, from
    the method's weights): needs the hessian and the method's own statistic, both accumulated
    in one pass (once where they are the same).

    Args:
        method: the :class:`LayerMethod` (or its name) that chooses the mask.
        iters: conjugate-gradient steps.
        damp: ridge, a fraction of ``mean(diag H)``.
        accumulate: the dtype of the hessian's sums (see :class:`fprune.calibration.Hessian`).
    """

    method: LayerMethod | str = "sparsegpt"
    iters: int = 30
    damp: float = 0.0
    accumulate: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", as_method(self.method, "Refine's method"))
        reconstruct.check_positive_int(self.iters, "iters", zero_ok=True)
        reconstruct.check_damp(self.damp)
        Hessian(self.accumulate)  # checks it

    @property
    def statistic(self) -> Statistic:  # type: ignore[override]
        assert isinstance(self.method, LayerMethod)
        hessian, inner = Hessian(self.accumulate), as_statistic(self.method.statistic)
        return hessian if inner == hessian else Joint((hessian, inner))

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: Any,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None and isinstance(self.method, LayerMethod)
        hessian, inner = statistic if isinstance(statistic, tuple) else (statistic, statistic)
        new, keep = self.method.prune_layer(weight, inner, amount, n_m=n_m)
        return reconstruct.refine(weight, hessian, keep, init=new, iters=self.iters, damp=self.damp), keep


@dataclass(frozen=True)
class Joint(Statistic):
    """Several statistics accumulated in one pass: their partial sums side by side (keys
    prefixed ``"0."``, ``"1."``, ...), finished to a tuple in their order."""

    parts: tuple[Statistic, ...]

    def add(self, sums: dict[str, torch.Tensor], x: torch.Tensor) -> None:
        for i, part in enumerate(self.parts):
            own = _part(sums, i)
            if part.needs_data:
                part.add(own, x)
            sums.update({f"{i}.{key}": value for key, value in own.items()})

    def finish(self, sums: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple:
        return tuple(part.finish(_part(sums, i), dtype) for i, part in enumerate(self.parts))


def _part(sums: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    prefix = f"{i}."
    return {key[len(prefix) :]: value for key, value in sums.items() if key.startswith(prefix)}


_SHORTHANDS: dict[str, Callable[[], LayerMethod]] = {
    "sparsegpt": SparseGPT,
    "wanda": Wanda,
    "magnitude": Magnitude,
}


def as_method(method: Any, name: str = "method") -> LayerMethod:
    if isinstance(method, str) and method in _SHORTHANDS:
        return _SHORTHANDS[method]()
    if not isinstance(method, LayerMethod):
        raise (TypeError if not isinstance(method, str) else ValueError)(
            f"Expected {name} to be one of {', '.join(map(repr, _SHORTHANDS))} or a "
            f"fprune.oneshot.LayerMethod (SparseGPT(), Wanda(), Magnitude(), Refine(...)), got {method!r}."
        )
    as_statistic(method.statistic, f"{name}.statistic")
    return method


def as_statistic(statistic: Any, name: str = "statistic") -> Statistic:
    """The method's statistic object (``"hessian"``, ``"norms"``, ``"none"`` stand for
    ``Hessian()``, ``InputNorms()``, ``NoData()``)."""
    if isinstance(statistic, str) and statistic in _SHORTHANDS_STATISTIC:
        return _SHORTHANDS_STATISTIC[statistic]()
    if not isinstance(statistic, Statistic):
        raise TypeError(
            f"Expected {name} to be a fprune.calibration.Statistic (Hessian(), InputNorms(), NoData() "
            f"or one of its own), or one of {', '.join(map(repr, _SHORTHANDS_STATISTIC))}, got {statistic!r}."
        )
    return statistic
