"""group_structured with a Global scope: a group pruned to nothing warns at the caller's line and
compact refuses it; ``Global(min_keep=)`` floors every group, keeps the count exact, traces, and
equals a greedy reference written here."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import fprune
from fprune.select import Global


class _Res(nn.Module):
    """A conv stem, a residual block, a strided conv and a head; BatchNorm in eval mode."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(x + self.b1(self.c1(x)))
        return self.fc(torch.relu(self.down(x)).mean((2, 3)))


def _res_setup():
    torch.manual_seed(0)
    net = _Res().eval()
    x = torch.randn(2, 3, 8, 8)
    s = fprune.structure.groups(net, (x,))
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    params["down.weight"] *= 1e-3  # the down group's 32 channels score lowest
    params["down.bias"] *= 1e-3
    return net, x, s, params


def test_global_group_structured_warns_at_caller_when_a_group_is_emptied():
    _net, _x, s, params = _res_setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        masks = fprune.group_structured(params, 0.7, s, scope=Global())
    assert not masks["down.weight"].any() and masks["stem.weight"].any()
    collapse = [w for w in caught if issubclass(w.category, fprune.select.LayerCollapseWarning)]
    assert len(collapse) == 1 and collapse[0].filename == __file__
    assert "down.weight:0" in str(collapse[0].message) and "min_keep=" in str(collapse[0].message)


def test_compact_of_an_emptied_group_raises_clearly_instead_of_not_shrinking():
    # A group with no channel left cannot be shrunk: compact raises (naming min_keep=) rather
    # than keep the group at full size, all zeros.
    net, x, s, params = _res_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        masks = fprune.group_structured(params, 0.7, s, scope=Global())
    with pytest.raises(ValueError, match=r"remove every channel along .*min_keep="):
        fprune.compact(net, params, masks, s, (x,))
    with pytest.raises(ValueError, match=r"remove every channel along .*min_keep="):
        fprune.compact_graph(net, params, masks, s, (x,))


def test_group_structured_global_min_keep_floor_and_exact_count():
    net, x, s, params = _res_setup()
    chosen = [g for g in s.groups if g.prunable and g.exact]
    total = sum(g.size for g in chosen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no collapse warning with the floor
        masks = fprune.group_structured(params, 0.7, s, scope=Global(min_keep=2))
    kept = {}
    for g in chosen:
        m = g.members[0]
        mask = masks[m.param].movedim(m.dim, 0)
        kept[g.name] = int(mask.reshape(mask.shape[0], -1).any(1).sum())
    assert all(k >= 2 for k in kept.values())
    assert total - sum(kept.values()) == round(0.7 * total)
    small = fprune.compact(net, params, masks, s, (x,))
    assert torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-5)
    assert small.down.weight.shape[0] == kept["down.weight:0"]


def test_group_structured_bad_min_keep_raises():
    _net, _x, s, params = _res_setup()
    with pytest.raises(ValueError, match="min_keep"):
        fprune.group_structured(params, 0.5, s, scope=Global(min_keep=-1))


def test_group_structured_global_traces_with_min_keep():
    _net, _x, s, params = _res_setup()
    want = fprune.group_structured(params, 0.5, s, scope=Global(min_keep=2))
    compiled = torch.compile(
        lambda p: fprune.group_structured(p, 0.5, s, scope=Global(min_keep=2)),
        fullgraph=True,
        backend="eager",
    )
    got = compiled(params)
    assert all(torch.equal(got[k], want[k]) for k in want)
    stacked = {k: torch.stack([v, v]) for k, v in params.items()}
    batched = torch.func.vmap(lambda p: fprune.group_structured(p, 0.5, s, scope=Global(min_keep=2)))(stacked)
    assert all(torch.equal(batched[k][1], want[k]) for k in want)


def test_group_structured_global_min_keep_equals_a_greedy_reference():
    # A plain reference: channel score = sum over the group's members in params of the squared
    # entries of the channel's slices; walk all channels lowest first (ties: groups in sorted
    # name order, then channel index), skipping a group once it is down to min_keep.
    _net, _x, s, params = _res_setup()
    chosen = sorted((g for g in s.groups if g.prunable and g.exact), key=lambda g: g.name)
    order = []
    for g in chosen:
        score = torch.zeros(g.size, dtype=torch.float64)
        for m in g.members:
            if m.param in params:
                slices = params[m.param].movedim(m.dim, 0)[m.index].reshape(g.size, -1)
                score += slices.double().square().sum(1)
        order += [(float(score[c]), g.name, c) for c in range(g.size)]
    rank = {g.name: i for i, g in enumerate(chosen)}
    order.sort(key=lambda t: (t[0], rank[t[1]], t[2]))
    for amount, floor in [(0.7, 2), (0.8, 3), (0.5, 0.25), (0.6, 0.4)]:
        total = sum(g.size for g in chosen)
        left = {g.name: g.size for g in chosen}
        minimum = {g.name: floor if isinstance(floor, int) else round(floor * g.size) for g in chosen}
        pruned, count = set(), round(amount * total)
        for _score, name, c in order:
            if len(pruned) == count:
                break
            if left[name] > minimum[name]:
                pruned.add((name, c))
                left[name] -= 1
        masks = fprune.group_structured(params, amount, s, scope=Global(min_keep=floor))
        for g in chosen:
            m = g.members[0]
            alive = masks[m.param].movedim(m.dim, 0)[m.index].reshape(g.size, -1).any(1)
            assert {c for c in range(g.size) if not alive[c]} == {c for n, c in pruned if n == g.name}
