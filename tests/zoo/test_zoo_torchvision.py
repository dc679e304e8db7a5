"""fprune.structure on torchvision's classification models (random init, nothing downloaded).

Needs torchvision (the ``zoo`` extra); skipped without it. The default run covers
``benchmarks.zoo.FAST``; ``python -m pytest -m zoo_full tests/zoo`` runs all 18 models of
``benchmarks.zoo.MODELS``. For every model:

- half of every prunable exact group, compacted, equals ``masked_call`` (1e-4 of the largest
  output) on the default init and on a copy where every channel matters;
- every prunable group compacts: random channel scores, a random subset of the groups, inexact
  groups included (``allow_inexact=True``); exact when only exact groups are pruned; exported
  with every input dim dynamic (Swin-T with its batch dim dynamic: with its image sizes dynamic
  too, torch.export's shape reasoning over the shifted windows takes about a minute a call);
- where Torch-Pruning 1.6 prunes the model, fprune keeps at most 1.1x its parameters (ConvNeXt
  with its inexact residual stream pruned too, as Torch-Pruning does).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fprune
from benchmarks import zoo

pytestmark = pytest.mark.skipif(
    zoo.import_torchvision() is None, reason="torchvision is not installed (the zoo extra)"
)

#: Models Torch-Pruning 1.6.1 prunes into a model that runs (it fails on the others).
#: ``compact_graph``'s ``dynamic_shapes`` where the default (every input dim) is not used.
DYNAMIC = {"swin_t": ({0: torch.export.Dim.AUTO},)}

TORCH_PRUNING_RUNS = tuple(n for n in zoo.MODELS if n not in ("shufflenet_v2_x1_0", "vit_b_16", "swin_t"))


@pytest.fixture(
    scope="module",
    params=[pytest.param(n, marks=() if n in zoo.FAST else pytest.mark.zoo_full) for n in zoo.MODELS],
)
def analysed(request):
    """``(name, model, x, structure)``; module scope, so each model is built and traced once."""
    model = zoo.build(request.param)
    x = zoo.example(request.param)
    return request.param, model, x, fprune.structure.groups(model, (x,))


def test_prunes_and_compacts_exactly(analysed):
    name, model, x, s = analysed
    prunable = [g for g in s.groups if g.prunable and g.exact]
    assert prunable, s.explain()
    shrink: dict = {}  # (param, dim) -> positions removed
    for g in prunable:
        for member in g.members:
            key = (member.param, member.dim)
            shrink[key] = shrink.get(key, 0) + round(0.5 * g.size) * member.per_channel
    # The default init, then the same module with values where every channel matters (changed
    # in place: compact_graph reuses the module's export and must take the new values).
    for matter in (False, True):
        with zoo.channels_matter(model) if matter else contextlib.nullcontext(model) as m:
            done = zoo.prune_and_compact(m, s, x)
        assert done["error"] <= 1e-4, (name, matter, done["error"])
        small = dict(done["small"].named_parameters())
        for (param, dim), removed in shrink.items():
            if param in small:
                assert small[param].shape[dim] == dict(s.shapes)[param][dim] - removed, (param, dim)


@settings(max_examples=2)
@given(seed=st.integers(0, 2**16), amount=st.sampled_from([0.25, 0.5, 0.75]), share=st.floats(0.2, 1.0))
def test_every_prunable_group_compacts(analysed, seed, amount, share):
    name, model, x, s = analysed
    g = torch.Generator().manual_seed(seed)
    params = {k: v.detach() for k, v in model.named_parameters()}
    scores = {k: torch.rand(v.shape, generator=g) for k, v in params.items()}
    prunable = [grp.name for grp in s.groups if grp.prunable]
    chosen = {
        n
        for n, pick in zip(prunable, torch.rand(len(prunable), generator=g).tolist(), strict=True)
        if pick < share
    }
    masks = fprune.group_structured(
        params, amount, s, importance_scores=scores, where=lambda group_name, group: group_name in chosen
    )
    try:
        small = fprune.compact_graph(
            model, params, masks, s, (x,), allow_inexact=True, dynamic_shapes=DYNAMIC.get(name, "auto")
        )
    except ValueError as error:
        # A high amount of groups of one channel (channel shuffles make some) can empty a layer,
        # which no conv runs with: compact says so, and nothing else may fail.
        assert any(not bool(m.any()) for m in masks.values()), error
        assert "remove every channel" in str(error)
        return
    with torch.no_grad():
        out, ref = small(x), fprune.masked_call(model, params, masks, (x,))
    assert out.shape == ref.shape
    if all(s.group(n).exact for n in chosen):
        assert zoo.relative_error(out, ref) <= 1e-4, name


def test_parameters_within_torch_pruning(analysed):
    name, model, x, s = analysed
    if name not in TORCH_PRUNING_RUNS:
        pytest.skip(f"Torch-Pruning 1.6.1 does not prune {name} into a model that runs")
    tp = pytest.importorskip("torch_pruning")
    theirs = zoo.build(name)
    ignored = [
        m
        for m in theirs.modules()
        if (isinstance(m, torch.nn.Linear) and m.out_features == 1000)
        or (isinstance(m, torch.nn.Conv2d) and m.out_channels == 1000)
    ]
    pruner = tp.pruner.MagnitudePruner(
        theirs, x, tp.importance.GroupMagnitudeImportance(p=2), pruning_ratio=0.5, ignored_layers=ignored
    )
    pruner.step()
    inexact = any(g.prunable and not g.exact for g in s.groups)
    ours = zoo.prune_and_compact(model, s, x, allow_inexact=inexact)["parameters"]
    assert ours <= 1.1 * zoo.parameters(theirs), (ours, zoo.parameters(theirs))
