"""The public types of :mod:`fprune.structure`: members, groups and the structure of a model."""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["Member", "Group", "Structure", "CompactError"]


@dataclasses.dataclass(frozen=True, eq=False)
class Member:
    """One parameter dim of a group: channel ``c`` is the slices ``index[c]`` along ``dim``.

    ``index`` is a ``LongTensor`` of shape ``(group.size, k)``: ``k`` positions per channel (1 for
    a plain channel; more for a whole attention head, or a channel that a grouped conv repeats in
    every group).
    """

    param: str
    dim: int
    index: torch.Tensor

    @property
    def per_channel(self) -> int:
        return int(self.index.shape[1])

    def key(self) -> tuple:
        return (self.param, self.dim, tuple(self.index.reshape(-1).tolist()), self.per_channel)

    def slices(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s slices of every channel along :attr:`dim`, one row per channel.

        Returns a tensor of shape ``(size, per_channel * rest)``: row ``c`` holds every entry of
        ``t`` that channel ``c`` owns (``t`` has the member's parameter's shape).

        Example:
            >>> import torch
            >>> m = Member("w", 0, torch.tensor([[0], [2]]))
            >>> m.slices(torch.arange(6).view(3, 2))
            tensor([[0, 1],
                    [4, 5]])
        """
        picked = t.movedim(self.dim, 0)[self.index.to(t.device)]
        return picked.reshape(self.index.shape[0], -1)

    def positions(self, length: int, device: torch.device | str | None = None) -> torch.Tensor:
        """For each of the ``length`` positions along :attr:`dim`, its channel (-1: in none).

        Example:
            >>> import torch
            >>> Member("w", 0, torch.tensor([[0], [2]])).positions(4)
            tensor([ 0, -1,  1, -1])
        """
        size, k = self.index.shape
        pos = torch.full((length,), -1, dtype=torch.int64)
        pos[self.index.reshape(-1)] = torch.arange(size).repeat_interleave(k)
        return pos.to(device) if device is not None else pos


@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    """Channels that are pruned together: every member's slices of channel ``c`` go at once.

    Attributes:
        name: ``"param:dim"`` of its first member, unique within a :class:`Structure`.
        size: the number of channels.
        members: the parameter (and buffer) dims it covers, in the model's parameter order.
        prunable: False when a channel reaches a model input or output, or an op with no rule.
        reason: why it is not prunable (None when it is).
        exact: True when removing channels (:func:`fprune.compact`) gives the same outputs as
            masking them (:func:`fprune.masked_call`). False, say, for a residual stream that a
            LayerNorm normalizes: its statistics change.
        inexact_reason: why it is not exact (None when it is).
        kind: ``"channel"``, or ``"head"`` when a channel is a whole attention head.
    """

    name: str
    size: int
    members: tuple[Member, ...]
    prunable: bool
    reason: str | None
    exact: bool
    inexact_reason: str | None
    kind: str

    def key(self) -> tuple:
        return (
            self.name,
            self.size,
            self.prunable,
            self.exact,
            self.kind,
            tuple(m.key() for m in self.members),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class Structure:
    """The dependency groups of a model, from :func:`groups`. Frozen, picklable, no module inside.

    Attributes:
        groups: every group, in the model's parameter order.
        aliases: ``(alias, name)`` pairs for tied parameters: ``alias`` is the same tensor as
            ``name`` (the name ``dict(module.named_parameters())`` keeps). Members use ``name``.
        shapes: ``(name, shape)`` of every parameter and buffer the analysis saw.
    """

    groups: tuple[Group, ...]
    aliases: tuple[tuple[str, str], ...]
    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    def canonical(self, name: str) -> str:
        """The member name of parameter ``name`` (``name`` itself unless it is a tied alias)."""
        return dict(self.aliases).get(name, name)

    def group(self, name: str) -> Group:
        """The group called ``name``."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"No group named {name!r}; groups are {[g.name for g in self.groups]}.")

    def key(self) -> tuple:
        return (tuple(g.key() for g in self.groups), self.aliases, self.shapes)

    def explain(self) -> str:
        """A readable listing: one paragraph per group, its members and flags.

        Example:
            >>> import torch, fprune
            >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
            >>> found = fprune.structure.groups(net, (torch.randn(2, 3),))
            >>> print(found.explain())  # doctest: +NORMALIZE_WHITESPACE
            group 0.weight:0: 4 channels, prunable, exact
                0.weight dim 0 (1 per channel)
                0.bias dim 0 (1 per channel)
                2.weight dim 1 (1 per channel)
            group 0.weight:1: 3 channels, not prunable (model input 'input'), exact
                0.weight dim 1 (1 per channel)
            group 2.weight:0: 2 channels, not prunable (model output), exact
                2.weight dim 0 (1 per channel)
                2.bias dim 0 (1 per channel)
        """
        lines = []
        for g in self.groups:
            flags = ["prunable" if g.prunable else f"not prunable ({g.reason})"]
            flags.append("exact" if g.exact else f"inexact ({g.inexact_reason})")
            unit = "heads" if g.kind == "head" else "channels"
            lines.append(f"group {g.name}: {g.size} {unit}, " + ", ".join(flags))
            for m in g.members:
                lines.append(f"    {m.param} dim {m.dim} ({m.per_channel} per channel)")
        if self.aliases:
            lines.append("tied: " + ", ".join(f"{a} = {n}" for a, n in self.aliases))
        return "\n".join(lines)

    def __repr__(self) -> str:
        free = sum(g.prunable for g in self.groups)
        return f"Structure({len(self.groups)} groups, {free} prunable)"


class CompactError(ValueError):
    """The module route cannot build this model: a layer cannot take its new sizes, or the
    shrunk copy does not compute what the masked model computes (its forward holds an old
    size). :func:`fprune.structure.compact_graph` rewrites the sizes in the exported graph
    instead."""
