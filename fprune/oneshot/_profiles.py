"""Sparsity profiles: per-block amounts from one sparsity (OWL, or any callable)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fprune import distributions


@dataclass(frozen=True)
class OWL:
    """The OWL sparsity profile (:func:`fprune.distributions.owl`, Yin et al. 2024): per-block
    sparsities from the outlier ratios of a dense calibration pass; ``m`` and ``lam``.

    ``profile="owl"`` is ``OWL()``: ``m=5``, ``lam=0.08``, the paper's values. As every
    profile, it is called ``profile(weights, sparsity, blocks=..., norms=...)`` and returns
    per-layer amounts; ``needs_norms`` asks :func:`prune` for the dense pass. ``m`` (> 0)
    and ``lam`` (>= 0) are checked when it is built.
    """

    m: float = 5.0
    lam: float = 0.08
    needs_norms: ClassVar[bool] = True

    def __post_init__(self) -> None:
        distributions.check_owl_options(self.m, self.lam)

    def __call__(
        self,
        weights: dict[str, torch.Tensor],
        sparsity: float,
        *,
        blocks: dict[str, int],
        norms: dict[str, torch.Tensor] | None,
    ) -> dict[str, float | None]:
        assert norms is not None
        return distributions.owl(
            weights,
            norms,
            sparsity,
            blocks=blocks,
            m=self.m,
            lam=self.lam,
            where=lambda name, p: name in norms,
        )


Profile = Callable[..., Mapping[str, Any]]


def as_profile(profile: Any) -> Profile | None:
    if profile is None:
        return None
    if profile == "owl":
        return OWL()
    if not callable(profile) or isinstance(profile, str):
        raise TypeError(
            f"Expected profile to be None, 'owl', fprune.oneshot.OWL(m, lam) or a callable "
            f"(weights, sparsity, *, blocks, norms) -> amounts, got {profile!r}."
        )
    return profile
