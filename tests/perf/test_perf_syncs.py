"""Host syncs per call: a constant number, whatever the number of leaves and chunks.

A host sync is a device-to-host read that makes the host wait for the device: counted on the
CPU, as a CUDA run would make them, by ``tests.helpers.count_syncs`` (``torch.profiler``'s
``aten::_local_scalar_dense``, which every ``.item()``, ``int(t)`` and ``bool(t)`` is,
``aten::nonzero``, ``aten::masked_select``, plus every ``Tensor.tolist()``, which on the CPU
reads memory without an aten op). The budget is 16 per call for the selections and 0 for
applying masks.
"""

import pytest
import torch

import fprune
from fprune.select import _engine
from tests.engine.engine_helpers import owner
from tests.helpers import count_syncs, prior_of

BUDGET = 16


def leaves(count, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i:04d}": torch.randn(shape, generator=g) for i in range(count)}


CALLS = {
    "global_unstructured": lambda p, m: fprune.global_unstructured(p, 0.5, masks=m),
    "l1_unstructured": lambda p, m: fprune.l1_unstructured(p, 0.5, masks=m),
    "ln_structured": lambda p, m: fprune.ln_structured(p, 0.5, 2, 0, masks=m),
    "random_unstructured": lambda p, m: fprune.random_unstructured(p, 0.5, generator=0, masks=m),
    "random_structured": lambda p, m: fprune.random_structured(p, 0.5, 0, generator=0, masks=m),
}
# 10 leaves of 40,000 entries and 1,000 leaves of 400 (2-D, for the structured ones); a small
# CHUNK makes the 10 leaves 100 chunks, and SAMPLED the sampled window path run.
SIZES = {"10 leaves": (10, (200, 200)), "1000 leaves": (1000, (20, 20))}
ENGINES = {"default": {}, "many chunks": {"CHUNK": 4096, "SAMPLED": 1 << 16}}


CASES = [(size, engine) for size in SIZES for engine in ENGINES]


@pytest.mark.parametrize("size, engine", CASES, ids=[f"{size}-{engine}" for size, engine in CASES])
@pytest.mark.parametrize("prior", [False, True], ids=["no masks", "prior masks"])
@pytest.mark.parametrize("call", list(CALLS))
def test_selections_make_a_constant_number_of_host_syncs(monkeypatch, call, size, prior, engine):
    for name, value in ENGINES[engine].items():
        monkeypatch.setattr(owner(name), name, value)
    count, shape = SIZES[size]
    params = leaves(count, shape)
    masks = prior_of(params) if prior else None
    CALLS[call](params, masks)  # warm up
    syncs = count_syncs(lambda: CALLS[call](params, masks))
    assert syncs <= BUDGET, (
        f"{call}, {size}, {'with' if prior else 'without'} prior masks: {syncs} host syncs"
    )


def test_global_tie_split_over_many_chunks_is_one_read(monkeypatch):
    """Half the weights exactly 0 and amount 0.3: the threshold ties split across 100 chunks."""
    monkeypatch.setattr(owner("CHUNK"), "CHUNK", 4096)
    params = leaves(10, (200, 200))
    for p in params.values():
        p[::2] = 0.0
    syncs = count_syncs(lambda: fprune.global_unstructured(params, 0.3))
    assert syncs <= 5  # 4 for the selection and its split, 1 for the NaN check of the scores


@pytest.mark.parametrize("packed", [False, True], ids=["bool masks", "packed masks"])
def test_applying_masks_makes_no_host_sync(packed):
    model = torch.nn.Sequential(*[torch.nn.Linear(20, 20) for _ in range(50)])
    params = dict(model.named_parameters())
    masks = fprune.l1_unstructured(params, 0.5)
    if packed:
        masks = fprune.pack_masks(masks)
    x = torch.randn(3, 20)
    with torch.no_grad():
        assert count_syncs(lambda: fprune.apply_masks(params, masks)) == 0
        assert count_syncs(lambda: fprune.masked_call(model, params, masks, (x,))) == 0


@pytest.mark.parametrize("engine", list(ENGINES))
def test_engine_per_leaf_reads_once_per_step_for_all_leaves(monkeypatch, engine):
    """prune_lowest_each: small leaves in rows, large ones streamed side by side, ks as tensors."""
    for name, value in ENGINES[engine].items():
        monkeypatch.setattr(owner(name), name, value)
    g = torch.Generator().manual_seed(5)
    scores = [torch.randn(30_000, generator=g) for _ in range(10)] + [
        torch.randn(300, generator=g) for _ in range(1000)
    ]
    for s in scores[::3]:
        s[::2] = 1.0  # ties to split
    keeps = [torch.rand(s.shape, generator=g) > 0.3 for s in scores]
    sources = [
        (s.numel(), _engine.keys(s, keep, torch.int32, torch.abs))
        for s, keep in zip(scores, keeps, strict=True)
    ]
    ks = [keep.sum() for keep in keeps]  # counts as tensors, as a layer above that does not read them
    ks = [k // 2 + (s.numel() - k) for k, s in zip(ks, scores, strict=True)]
    syncs = count_syncs(
        lambda: _engine.prune_lowest_each(sources, ks, traced=False, device=torch.device("cpu"))
    )
    assert syncs <= 8
