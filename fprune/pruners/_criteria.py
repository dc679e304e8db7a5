"""Private: the drop and grow criteria of :func:`fprune.pruners.dynamic_sparse`.

A criterion is one function of a :class:`Leaf` (``param``, ``grad``, ``mask``, ``seed``,
``index``, ``name``) returning scores shaped like the parameter, higher = more important:
:func:`magnitude`, :func:`gradient_magnitude`, :data:`uniform_random`, or the user's own.
:class:`CriterionScores` hands one to the selection layer as a score function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fprune import _random, _tree
from fprune.pruners import _core

Criterion = Callable[["Leaf"], torch.Tensor]


class Leaf:
    """What a drop or grow criterion of :func:`dynamic_sparse` sees of one leaf at an update.

    Attributes:
        param: the parameter (detached).
        grad: its gradient, from ``update(..., grads=)``; reading it when ``update`` got no
            ``grads`` raises ``TypeError``.
        mask: its mask before the update (bool).
        seed: a 0-dim int64 tensor, the pruner's seed hashed with the step (batched under a
            ``vmap`` over seeds): the seed of a random criterion.
        index: the leaf's number in the params' flatten order (a random criterion's stream).
        name: the leaf's dotted name (``"0.weight"``).

    ``update`` makes them; to call a criterion by hand, ``Leaf(param, mask, seed, index, name)``
    (its ``grad`` then raises).
    """

    __slots__ = ("_grads", "index", "mask", "name", "param", "seed")

    def __init__(
        self,
        param: torch.Tensor,
        mask: torch.Tensor | None = None,
        seed: torch.Tensor | None = None,
        index: int = 0,
        name: str = "",
        grads: GivenGrads | None = None,
    ):
        self.param = param
        self.mask = mask
        self.seed = seed
        self.index = index
        self.name = name
        self._grads = grads

    @property
    def grad(self) -> torch.Tensor:
        if self._grads is None:
            raise TypeError(f"This Leaf ({self.name!r}) was made without gradients; it has no grad.")
        return self._grads.leaf(self.index)

    def __repr__(self) -> str:
        return f"Leaf({self.name!r}, shape={tuple(self.param.shape)})"


class GivenGrads:
    """``update``'s ``grads=``, checked against the params when a criterion first reads one."""

    def __init__(self, flat: _tree.Flat, grads: Any):
        self.flat = flat
        self.given = grads
        self.leaves: list | None = None

    def leaf(self, i: int) -> torch.Tensor:
        if self.leaves is None:
            if self.given is None:
                raise TypeError(
                    "This pruner's criterion reads leaf.grad: its update needs grads=, the dense "
                    "gradient shaped like params."
                )
            hint = (
                _core.NONE_GRAD
                + " (RigL then regrows that leaf's first inactive entries, ties to the first position)."
            )
            self.leaves = _tree.check_scores(self.flat, self.given, "grads", hint)
        return self.leaves[i].detach()


def _criterion_name(criterion: Any) -> str:
    """A criterion's name in messages (the same on every rank: no memory address)."""
    return getattr(criterion, "__qualname__", None) or repr(criterion)


class CriterionScores:
    """A criterion as a score function of :func:`fprune.select.select_inputs`: leaf ``i``'s
    scores (negated for growing: the highest are then the lowest, ties still to the first
    position and NaN still last); ``at`` where the criterion has it (the sharded backend then
    asks for a rank's own entries only)."""

    def __init__(self, criterion: Criterion, leaves: list[Leaf], negate: bool):
        self.criterion = criterion
        self.leaves = leaves
        self.negate = negate
        at = getattr(criterion, "at", None)
        if callable(at):
            self.at = lambda i, positions: self._signed(at(self.leaves[i], positions))

    def _signed(self, scores: torch.Tensor) -> torch.Tensor:
        return -scores if self.negate else scores

    def __call__(self, i: int) -> torch.Tensor:
        leaf = self.leaves[i]
        scores = self.criterion(leaf)
        if not isinstance(scores, torch.Tensor) or scores.dtype == torch.bool or scores.is_complex():
            got = f"a tensor of dtype {scores.dtype}" if isinstance(scores, torch.Tensor) else repr(scores)
            raise TypeError(
                f"Expected the criterion {_criterion_name(self.criterion)} to return a real tensor "
                f"shaped like {leaf.name!r} for it, got {got}."
            )
        if scores.shape != leaf.param.shape:
            raise ValueError(
                f"Expected the criterion {_criterion_name(self.criterion)} to return scores shaped "
                f"like {leaf.name!r}, {tuple(leaf.param.shape)}, got {tuple(scores.shape)}."
            )
        return self._signed(scores)

    def fingerprint(self) -> str:
        seed = self.leaves[0].seed if self.leaves else None
        return f"{_criterion_name(self.criterion)}|seed={'' if seed is None else int(seed)}"


def magnitude(leaf: Leaf) -> torch.Tensor:
    """The criterion ``|param|``: SET's and RigL's drop criterion (the default ``drop``).

    Example:
        >>> import torch, fprune
        >>> w = torch.tensor([1.0, -3.0])
        >>> fprune.pruners.magnitude(fprune.pruners.Leaf(w))
        tensor([1., 3.])
    """
    return leaf.param.abs()


def gradient_magnitude(leaf: Leaf) -> torch.Tensor:
    """The criterion ``|grad|``: RigL's grow criterion (``update`` then needs ``grads=``).

    Example:
        >>> import torch, fprune
        >>> pruner = fprune.dynamic_sparse(0.5, grow=fprune.pruners.gradient_magnitude,
        ...     drop_fraction=0.5, every=1, end=9, distribution="uniform")
        >>> params = {"w": torch.ones(1, 4)}
        >>> state = pruner.init(params)
        >>> state.masks["w"]
        tensor([[False, False,  True,  True]])
        >>> _, state = pruner.update(params, state, grads={"w": torch.tensor([[4.0, 3, 2, 1]])})
        >>> state.regrown["w"]            # of the inactive ones, the largest |grad| comes back
        tensor([[ True, False, False, False]])
    """
    return leaf.grad.abs()


def _seed_of(leaf: Leaf) -> torch.Tensor:
    if leaf.seed is None:
        raise TypeError(f"uniform_random needs a seed: this Leaf ({leaf.name!r}) was made without one.")
    return leaf.seed


class _UniformRandom:
    """The criterion of uniform random scores (SET's grow criterion): ``uniform_random(leaf)`` is
    the stateless hash of ``leaf.seed``, ``leaf.index`` and each entry's position, in [0, 1).

    ``uniform_random.at(leaf, positions)`` draws the given flat positions only (a rank of a
    sharded model draws its own entries, the same values as the whole leaf's draw).

    Example:
        >>> import torch, fprune
        >>> leaf = fprune.pruners.Leaf(torch.zeros(2, 3), seed=torch.tensor(7))
        >>> scores = fprune.pruners.uniform_random(leaf)
        >>> scores.shape, bool(((scores >= 0) & (scores < 1)).all())
        (torch.Size([2, 3]), True)
        >>> torch.equal(fprune.pruners.uniform_random.at(leaf, torch.tensor([4])), scores.view(-1)[4:5])
        True
    """

    def __call__(self, leaf: Leaf) -> torch.Tensor:
        return _random.uniform(leaf.param.shape, _seed_of(leaf), leaf.index, leaf.param.device)

    def at(self, leaf: Leaf, positions: torch.Tensor) -> torch.Tensor:
        return _random.uniform_at(positions, _seed_of(leaf), leaf.index)

    def __repr__(self) -> str:
        return "uniform_random"


uniform_random = _UniformRandom()
