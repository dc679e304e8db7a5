"""The GPU test plan: run with ``python -m pytest -q -m cuda tests`` on a machine with CUDA.

Skipped without CUDA. What is checked:

* CUDA masks equal CPU masks, eager and traced, for every selection (ties, prior masks, NaN,
  float32 / bfloat16 / float64 scores, several chunks, the sampled window), and integer-seed
  random masks are the same on both devices.
* No host sync where none is allowed: ``apply_masks`` and ``masked_call`` run under
  ``torch.cuda.set_sync_debug_mode("error")``; the selections make at most 16 (counted with
  ``"warn"``), the engine's histogram passes none (``index_add_``, not ``bincount``).
* ``torch.use_deterministic_algorithms(True)`` neither raises nor changes a mask.
* A CPU ``torch.Generator`` with CUDA params raises a clear error.
"""

import pytest
import torch
from torch.func import vmap

import fprune
from benchmarks.gpu import host_syncs
from fprune.select import _histogram, _stream
from tests.engine.engine_helpers import owner

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
BUDGET = 16


def model_params(device, dtype=torch.float32, leaves=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for i in range(leaves):
        shape = (64, 48) if i % 3 else (300,)
        p = torch.randn(shape, generator=g)
        if i % 4 == 0:
            p.view(-1)[::5] = 0.5  # ties
        if i == 5:
            p.view(-1)[3] = float("nan")
        params[f"p{i:02d}"] = p.to(dtype)
    return {k: v.to(device) for k, v in params.items()}


def prior(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.rand(v.shape, generator=g) > 0.3).to(v.device) for k, v in params.items()}


CALLS = {
    "global": lambda p, m: fprune.global_unstructured(p, 0.6, masks=m),
    "global-l2": lambda p, m: fprune.global_unstructured(p, 0.4, masks=m, normalize="l2"),
    "l1": lambda p, m: fprune.l1_unstructured(p, 0.5, masks=m),
    "ln": lambda p, m: fprune.ln_structured(p, 0.5, 2, 0, masks=m, where=lambda n, t: t.dim() > 1),
    "random": lambda p, m: fprune.random_unstructured(p, 0.5, generator=7, masks=m),
    "random-structured": lambda p, m: fprune.random_structured(
        p, 0.5, 0, generator=7, masks=m, where=lambda n, t: t.dim() > 1
    ),
}


def same(a, b):
    return all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("with_prior", [False, True])
@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("engine", [{}, {"CHUNK": 1000, "CUDA_CHUNK": 1000, "SAMPLED": 1 << 12}])
def test_cuda_masks_equal_cpu_masks(monkeypatch, call, with_prior, dtype, engine):
    for name, value in engine.items():
        monkeypatch.setattr(owner(name), name, value)
    cpu = model_params("cpu", dtype)
    gpu = {k: v.to(CUDA) for k, v in cpu.items()}
    m_cpu = prior(cpu) if with_prior else None
    m_gpu = {k: v.to(CUDA) for k, v in m_cpu.items()} if with_prior else None
    want = CALLS[call](cpu, m_cpu)
    got = CALLS[call](gpu, m_gpu)
    assert all(v.device.type == "cuda" for v in got.values())
    assert same(got, want)
    # The traced path (a tensor amount under vmap) on CUDA gives the same masks.
    if call in ("global", "l1"):
        fn = fprune.global_unstructured if call == "global" else fprune.l1_unstructured
        levels = torch.tensor([0.6 if call == "global" else 0.5], device=CUDA)
        traced = vmap(lambda a: fn(gpu, a, masks=m_gpu))(levels)
        assert same({k: v[0] for k, v in traced.items()}, want)


def count_sync_warnings(fn):
    return host_syncs(fn, CUDA)  # the GPU benchmark's own count (sync debug mode)


@pytest.mark.parametrize("leaves", [10, 1000])
@pytest.mark.parametrize("call", list(CALLS))
def test_selections_sync_at_most_16_times(call, leaves):
    params = model_params(CUDA, leaves=leaves)
    CALLS[call](params, None)
    assert count_sync_warnings(lambda: CALLS[call](params, None)) <= BUDGET
    masks = prior(params)
    assert count_sync_warnings(lambda: CALLS[call](params, masks)) <= BUDGET


def test_histogram_passes_do_not_sync():
    keys = torch.randint(0, 1 << 20, (1 << 20,), device=CUDA, dtype=torch.int32)
    counter = _histogram._Counter(1 << 16, CUDA, _stream.Buffers(CUDA), edges=(0, 1 << 15))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        counter.add(keys >> 5)
        total = counter.total()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(total.cpu(), torch.bincount((keys >> 5).cpu().long(), minlength=1 << 16)[: 1 << 16])


@pytest.mark.parametrize("packed", [False, True])
def test_applying_masks_never_syncs(packed):
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).to(CUDA)
    params = dict(model.named_parameters())
    masks = fprune.l1_unstructured(params, 0.5)
    if packed:
        masks = fprune.pack_masks(masks)
    x = torch.randn(4, 64, device=CUDA)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fprune.apply_masks(params, masks)
        fprune.masked_call(model, params, masks, (x,))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_deterministic_algorithms_give_the_same_masks():
    params = model_params(CUDA)
    masks = prior(params)
    want = {call: fn(params, masks) for call, fn in CALLS.items()}
    torch.use_deterministic_algorithms(True)
    try:
        for call, fn in CALLS.items():
            assert same(fn(params, masks), want[call]), call
    finally:
        torch.use_deterministic_algorithms(False)


def test_cpu_generator_with_cuda_params_raises():
    with pytest.raises(ValueError, match="generator"):
        fprune.random_unstructured({"w": torch.randn(10, device=CUDA)}, 0.5, generator=torch.Generator())
