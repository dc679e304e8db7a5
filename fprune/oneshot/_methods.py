"""Layer methods: what a post-training method needs of the data, and its solve of one layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fprune import reconstruct
from fprune.select import NM, Rows, select

_STATISTICS = ("hessian", "norms", "none")


class LayerMethod:
    """A post-training method for one linear layer: the statistic it needs, and the solve.

    A subclass sets ``statistic`` (``"hessian"``: ``H = 2/n sum x x^T`` of the layer's inputs,
    ``(in, in)``; ``"norms"``: the L2 norm of each input feature over the calibration rows,
    ``(1, in)``; ``"none"``: no data) and overrides :meth:`prune_layer`. :func:`prune` runs
    the rest: the blocks, the statistics, the float32 work copy, the write-back.

    Example:
        >>> import torch, fprune
        >>> class Random(fprune.oneshot.LayerMethod):     # a method that needs no data
        ...     statistic = "none"
        ...     def prune_layer(self, weight, statistic, amount=None, *, n_m=None):
        ...         scores = torch.rand(weight.shape, generator=torch.Generator().manual_seed(0))
        ...         keep = fprune.l1_unstructured({"w": weight}, amount, importance_scores={"w": scores})["w"]
        ...         return weight * keep, keep
        >>> new, keep = Random().prune_layer(torch.ones(4, 4), None, 0.25)
        >>> int((~keep).sum()), float(new.sum())
        (4, 12.0)
    """

    statistic: ClassVar[str] = "none"

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prune one layer: ``(weight, keep-mask)`` for ``weight`` ``(out, in)``.

        Args:
            weight: ``(out, in)`` float32 work copy (float64 for a float64 model; a ``Conv1D``
                weight transposed). Do not modify it.
            statistic: what ``statistic`` names (``None`` for ``"none"``).
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
    """

    blocksize: int = 128
    damp: float = 0.01
    statistic: ClassVar[str] = "hessian"

    def __post_init__(self) -> None:
        reconstruct.check_positive_int(self.blocksize, "blocksize")
        reconstruct.check_damp(self.damp)

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
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

    statistic: ClassVar[str] = "norms"

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None  # the pipeline gives the norms
        scores = weight.abs().float() * statistic
        if n_m is not None:
            keep = select({"w": scores}, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        else:
            keep = select({"w": scores}, amount, scope=Rows(0))["w"]
        return weight * keep, keep


@dataclass(frozen=True)
class Magnitude(LayerMethod):
    """Magnitude: the lowest ``|W|`` of the whole layer (``round(amount * numel)``, as
    :func:`fprune.l1_unstructured`), or N:M; needs no data (no forward runs unless a profile or
    :class:`Refine` asks for one)."""

    statistic: ClassVar[str] = "none"

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = weight.abs()
        if n_m is not None:
            keep = select({"w": scores}, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        else:
            keep = select({"w": scores}, amount)["w"]
        return weight * keep, keep


@dataclass(frozen=True)
class Refine(LayerMethod):
    """Any method, then the least squares on its mask (:func:`fprune.reconstruct.refine`, from
    the method's weights): needs the hessian (a method that needs norms gets ``sqrt(diag H)``,
    which ranks as the norms do).

    Args:
        method: the :class:`LayerMethod` (or its name) that chooses the mask.
        iters: conjugate-gradient steps.
        damp: ridge, a fraction of ``mean(diag H)``.
    """

    method: LayerMethod | str = "sparsegpt"
    iters: int = 30
    damp: float = 0.0
    statistic: ClassVar[str] = "hessian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", as_method(self.method, "Refine's method"))
        reconstruct.check_positive_int(self.iters, "iters", zero_ok=True)
        reconstruct.check_damp(self.damp)

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None and isinstance(self.method, LayerMethod)
        inner = {"hessian": statistic, "norms": statistic.diagonal().sqrt().view(1, -1), "none": None}
        new, keep = self.method.prune_layer(weight, inner[self.method.statistic], amount, n_m=n_m)
        return reconstruct.refine(weight, statistic, keep, init=new, iters=self.iters, damp=self.damp), keep


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
    if method.statistic not in _STATISTICS:
        raise ValueError(
            f"Expected {name}.statistic to be one of {', '.join(map(repr, _STATISTICS))}, got "
            f"{method.statistic!r}."
        )
    return method
