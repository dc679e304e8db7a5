"""Parity with Torch-Pruning (the optional ``structure`` test extra; skipped when absent).

On a ResNet-like CNN that Torch-Pruning handles (convs, BatchNorm, residual adds with a 1x1
projection, a linear classifier), given the same channel scores (squared L2 summed over the
group's weights, biases left out, as ``GroupMagnitudeImportance(p=2, group_reduction="sum",
normalizer=None)``) and counts on which both rules agree (half of an even number of channels),
Torch-Pruning's physically pruned model and ``fprune.compact`` keep the same channels: their
state dicts are equal, name by name.
"""

import copy

import pytest
import torch

import fprune
from tests.helpers import load_example

tp = pytest.importorskip("torch_pruning")


def _resnet(width):
    return load_example("structured_speedup", module_name="structured_speedup_tp").ResNet(width)


def test_same_kept_channels_as_torch_pruning():
    torch.manual_seed(0)
    model = _resnet(8).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 2)
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 1, 8, 8)

    theirs = copy.deepcopy(model)
    importance = tp.importance.GroupMagnitudeImportance(p=2, group_reduction="sum", normalizer=None)
    pruner = tp.pruner.BasePruner(theirs, x, importance, pruning_ratio=0.5, ignored_layers=[theirs.fc])
    pruner.step()

    s = fprune.structure.groups(model, (x,))
    params = {k: v.detach() for k, v in model.named_parameters()}
    scores = {k: torch.zeros_like(v) if k.endswith("bias") else v for k, v in params.items()}
    masks = fprune.group_structured(params, 0.5, s, importance_scores=scores)
    ours = fprune.compact(model, params, masks, s, (x,))

    want = theirs.state_dict()
    got = ours.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        torch.testing.assert_close(got[k], want[k], atol=0, rtol=0, msg=k)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


def test_same_groups_as_torch_pruning():
    model = _resnet(8).eval()
    x = torch.randn(2, 1, 8, 8)
    theirs = copy.deepcopy(model)
    graph = tp.DependencyGraph().build_dependency(theirs, example_inputs=x)
    names = {m: n for n, m in theirs.named_modules()}
    tp_groups = set()
    for group in graph.get_all_groups(
        ignored_layers=[theirs.fc], root_module_types=[torch.nn.Conv2d, torch.nn.Linear]
    ):
        members = set()
        for item in group.items:
            module = item.dep.target.module
            if module not in names:
                continue  # Torch-Pruning's pseudo-modules (element-wise add, ...)
            out = "out" in item.dep.handler.__name__
            dim = 0 if out or isinstance(module, torch.nn.BatchNorm2d) else 1
            members.add((names[module] + ".weight", dim))
        tp_groups.add(frozenset(members))
    s = fprune.structure.groups(model, (x,))
    ours = {
        frozenset((m.param, m.dim) for m in g.members if m.param.endswith(".weight"))
        for g in s.groups
        if g.prunable
    }
    assert ours == tp_groups
