"""Devices without float64 (Apple's MPS), on the CPU: the probe is forced to say "no float64".

``fprune._torch.has_float64`` decides, by device type, between the float64 paths and their
float64-free variants. These tests make it answer False for the CPU and check, for every public
call that used float64, that (a) no float64 tensor is made (a dispatch mode records every op's
output dtypes), eager and traced, and (b) the masks equal the float64 path's: exactly (integer
seeds, key building, counts), or, for ``normalize=`` (norms summed in float32), count-exact and
differing only among entries whose normalized scores lie within the documented tolerance of the
threshold. The one place float64 remains is on the CPU, for 0-dim scalars: the count of a tensor
amount, a pruner's count and its schedule (``HOST_FLOAT64``); it is allowed there and nowhere else.

The ``mps``-marked tests at the end run the same calls on a real MPS device (skipped without).
"""

import functools

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st
from torch.func import vmap
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import fprune
import fprune.compat as prune
from fprune import _amount, _random, _torch, pruners
from fprune.select import _engine, _keys
from tests.helpers import prior_of


class Float64Recorder(TorchDispatchMode):
    """Records every op whose output holds a float64 tensor (outside the allowed host count)."""

    active = None

    def __init__(self):
        super().__init__()
        self.seen = []
        self.allowed = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.allowed:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                    self.seen.append(str(func))
        return out

    def __enter__(self):
        Float64Recorder.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        Float64Recorder.active = None
        return super().__exit__(*exc)


# The host computations of 0-dim scalars that keep float64 on the CPU for devices without it:
# a count (a tensor amount's, a pruner's), and a pruner's schedule (its step moved to the CPU).
HOST_FLOAT64 = [(_amount, "_count_on_host"), (pruners._core, "schedule_value")]


def _allowing_float64(fn):
    @functools.wraps(fn)
    def host(*args, **kwargs):
        recorder = Float64Recorder.active
        if recorder is not None:
            recorder.allowed += 1
        try:
            return fn(*args, **kwargs)
        finally:
            if recorder is not None:
                recorder.allowed -= 1

    return host


@pytest.fixture
def no_float64(monkeypatch):
    """The CPU treated as a device without float64; float64 allowed in the host computations."""
    monkeypatch.setattr(_torch, "NO_FLOAT64", frozenset({"cpu", "mps"}))
    for module, name in HOST_FLOAT64:
        monkeypatch.setattr(module, name, _allowing_float64(getattr(module, name)))
    return monkeypatch


def float64_free(call, path, monkeypatch):
    """``call()`` under the recorder; ``path="eager"`` hides the mode from fprune's traced probe."""
    with monkeypatch.context() as m:
        if path == "eager":
            m.setattr(_torch, "in_dispatch_mode", lambda: False)
        with Float64Recorder() as recorder:
            out = call()
    assert recorder.seen == [], f"float64 tensors made by {sorted(set(recorder.seen))}"
    return out


def both(call, no_float64, path):
    """(float64 path's result, float64-free path's result) of ``call``; asserts the latter.

    ``no_float64`` is the fixture's monkeypatch (the CPU already treated as without float64).
    """
    with no_float64.context() as m:
        m.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
        with_float64 = call()
    return with_float64, float64_free(call, path, no_float64)


def assert_same_masks(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def params_of(seed=0):
    g = torch.Generator().manual_seed(seed)
    p = {
        "a": torch.randn(6, 7, generator=g),
        "b": torch.randn(5, 4, generator=g) * 3,
        "c": torch.randn(40, generator=g) * 0.1,
    }
    p["a"].view(-1)[::4] = 0.5  # ties
    return p


PATHS = ["eager", "traced"]
pytestmark = pytest.mark.filterwarnings("ignore:global pruning removed every remaining entry")


def test_probe():
    assert _torch.has_float64("cpu") and _torch.has_float64(None)
    assert _torch.has_float64(torch.device("cuda")) and _torch.has_float64("meta")
    assert not _torch.has_float64("mps") and not _torch.has_float64(torch.device("mps", 0))


def test_integer_keys_equal_the_float64_paths(no_float64):
    g = torch.Generator().manual_seed(3)
    bits = torch.randint(-(2**31), 2**31 - 1, (50_000,), generator=g, dtype=torch.int64)
    floats = torch.cat(
        [
            bits.to(torch.int32).view(torch.float32),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45]),
        ]
    )
    big = torch.randint(-(2**62), 2**62, (50_000,), generator=g) * torch.randint(1, 3, (50_000,), generator=g)
    cases = [
        floats,
        floats.to(torch.float16),
        floats.to(torch.bfloat16),
        bits,
        big,
        bits.to(torch.int32),
        bits.to(torch.int8),
        bits.to(torch.uint8),
        bits > 0,
        torch.tensor([2**53, 2**53 + 1, 2**53 + 2, 2**63 - 1, -(2**63), 0, -1], dtype=torch.int64),
    ]
    for x in cases:
        without = _engine.orderable(x, torch.int64)
        no_float64.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
        with_float64 = _engine.orderable(x, torch.int64)
        no_float64.setattr(_torch, "NO_FLOAT64", frozenset({"cpu", "mps"}))
        assert torch.equal(without, with_float64), x.dtype


@given(
    ints=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50),
    bits=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=50),
)
def test_float64_bits_property(ints, bits):
    """The integer-arithmetic float64 bits equal torch's conversion (NaNs aside: orderable maps them)."""
    v = torch.tensor(ints, dtype=torch.int64)
    assert torch.equal(_keys._float64_bits(v), v.double().view(torch.int64))
    f = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    real = ~torch.isnan(f)
    assert torch.equal(_keys._float64_bits(f)[real], (f.double() + 0.0).view(torch.int64)[real])


@pytest.mark.parametrize("path", PATHS)
def test_orderable_makes_no_float64(no_float64, path):
    x = torch.randn(100)
    for scores in (x, x.to(torch.bfloat16), (x * 1000).to(torch.int64), x > 0):
        float64_free(lambda *, scores=scores: _engine.orderable(scores, torch.int64), path, no_float64)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", [0, 7, torch.tensor(123), -(2**40)])
def test_integer_seed_random_masks_equal_the_float64_paths(no_float64, path, seed):
    params, prior = params_of(), prior_of(params_of())
    calls = [
        lambda: fprune.random_unstructured(params, 0.4, generator=seed),
        lambda: fprune.random_unstructured(params, 5, generator=seed, masks=prior),
        lambda: fprune.random_structured(
            {k: v for k, v in params.items() if v.dim() > 1}, 0.5, 1, generator=seed
        ),
        lambda: fprune.random_structured({"a": params["a"]}, 2, 0, generator=seed, masks={"a": prior["a"]}),
    ]
    for call in calls:
        assert_same_masks(*both(call, no_float64, path))


@pytest.mark.parametrize("path", PATHS)
def test_large_leaves_take_the_same_int64_key_paths(no_float64, path):
    """Leaves above the candidate limit (radix passes over int64 keys in the eager path)."""
    g = torch.Generator().manual_seed(5)
    params = {"big": torch.randn(300, 700, generator=g), "small": torch.randn(50, generator=g)}
    ints = {k: (v * 1e6).to(torch.int64) for k, v in params.items()}
    calls = [
        lambda: fprune.random_unstructured(params, 0.37, generator=11),
        lambda: fprune.global_unstructured(params, 0.61, importance_scores=ints),
    ]
    for call in calls:
        assert_same_masks(*both(call, no_float64, path))


def test_integer_seed_draws_order_like_the_float64_draws(no_float64):
    draws = _random.uniform((1000,), 5, 2, torch.device("cpu"))
    assert draws.dtype == torch.int64 and int(draws.min()) >= 0 and int(draws.max()) < 2**32
    no_float64.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
    reference = _random.uniform((1000,), 5, 2, torch.device("cpu"))
    assert torch.equal(draws, (reference * 2.0**32).to(torch.int64))


def test_vmap_over_seeds_and_amounts_makes_no_float64(no_float64):
    params, prior = params_of(), prior_of(params_of())
    seeds, levels = torch.tensor([1, 2, 3]), torch.tensor([0.1, 0.5, 0.9])
    float64_free(
        lambda: vmap(lambda s: fprune.random_unstructured(params, 0.5, generator=s))(seeds),
        "traced",
        no_float64,
    )
    # a tensor amount with prior masks: the count's ``n`` is a tensor, counted on the host
    got = float64_free(
        lambda: vmap(lambda a: fprune.l1_unstructured(params, a, masks=prior))(levels), "traced", no_float64
    )
    no_float64.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
    want = vmap(lambda a: fprune.l1_unstructured(params, a, masks=prior))(levels)
    assert_same_masks(got, want)


@pytest.mark.parametrize("path", PATHS)
def test_magnitude_and_structured_calls_equal_the_float64_paths(no_float64, path):
    params, prior = params_of(), prior_of(params_of())
    ints = {k: (v * 100).to(torch.int64) for k, v in params.items()}
    two_d = {k: v for k, v in params.items() if v.dim() > 1}
    calls = [
        lambda: fprune.l1_unstructured(params, 0.3),
        lambda: fprune.l1_unstructured(params, torch.tensor(0.3), masks=prior),
        lambda: fprune.l1_unstructured(params, 0.5, importance_scores=ints),
        lambda: fprune.global_unstructured(params, 0.6),
        lambda: fprune.global_unstructured(params, torch.tensor(0.45), masks=prior),
        lambda: fprune.global_unstructured(params, 0.5, importance_scores=ints),
        lambda: fprune.global_unstructured(params, 0.5, importance_scores={**ints, "c": params["c"]}),
        lambda: fprune.ln_structured(two_d, 0.5, 2, 0),
        lambda: fprune.ln_structured(two_d, 0.5, 1, 1, masks={k: prior[k] for k in two_d}),
    ]
    for call in calls:
        assert_same_masks(*both(call, no_float64, path))


def _normalized_reference(params, prior, norm):
    out = {}
    for k, v in params.items():
        kept = torch.where(prior[k], v, 0).double() if prior else v.double()
        out[k] = v.double().abs() / torch.linalg.vector_norm(kept, ord=norm)
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("normalize", ["l1", "l2", True])
@pytest.mark.parametrize("with_prior", [False, True])
def test_normalize_is_count_exact_and_within_tolerance(no_float64, path, normalize, with_prior):
    for seed in range(3):
        params = params_of(seed)
        prior = prior_of(params, seed + 10) if with_prior else None
        want, got = both(
            lambda *, params=params, prior=prior: fprune.global_unstructured(
                params, 0.5, normalize=normalize, masks=prior
            ),
            no_float64,
            path,
        )
        assert sum(int((~m).sum()) for m in got.values()) == sum(int((~m).sum()) for m in want.values())
        differ = {k: want[k] != got[k] for k in want}
        if any(bool(d.any()) for d in differ.values()):  # only right at the threshold
            scores = _normalized_reference(params, prior, 1 if normalize == "l1" else 2)
            pruned = torch.cat([scores[k][~want[k] & (prior[k] if prior else True)] for k in want])
            threshold = float(pruned.max())
            for k, d in differ.items():
                assert torch.allclose(
                    scores[k][d], torch.full_like(scores[k][d], threshold), rtol=1e-6, atol=0
                )


@pytest.mark.parametrize("norm", [1.0, 2.0])
def test_float32_norms_stay_within_the_documented_tolerance(norm):
    """The float32 norm (for ``normalize=``) of a 2M-entry leaf: within 2e-7 of float64's.

    ``torch.linalg.vector_norm``'s float32 sums drift as leaves grow on the CPU; the
    float64-free path sums with ``torch.sum`` (a cascade) instead.
    """
    from fprune.select._global import _norm_float32

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2_000_000, generator=g) * 3
    scale = float(_norm_float32(x, norm))
    exact = float(torch.linalg.vector_norm(x.double(), ord=norm))
    assert abs(scale - exact) <= 2e-7 * exact
    huge = torch.tensor([3e30, 4e30])  # squares would overflow float32
    assert float(huge[0] / _norm_float32(huge, 2.0)) == pytest.approx(0.6, rel=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_sparsity_in_float32_and_report(no_float64, path):
    masks = {
        "a": torch.rand(30, 7) > 0.4,
        "b": torch.ones(5, dtype=torch.bool),
        "e": torch.ones(0, dtype=torch.bool),
    }
    s = float64_free(lambda: fprune.sparsity(masks), path, no_float64)
    assert s.overall.dtype == torch.float32 and s.per_leaf["a"].dtype == torch.float32
    for k, m in masks.items():
        exact = (m.numel() - int(m.sum())) / m.numel() if m.numel() else 0.0
        assert float(s.per_leaf[k]) == pytest.approx(exact, rel=1.2e-7, abs=0)
    r = float64_free(lambda: fprune.report(masks), path, no_float64)
    assert r.total.pruned == sum(m.numel() - int(m.sum()) for m in masks.values())
    no_float64.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
    assert fprune.sparsity(masks).overall.dtype == torch.float64  # unchanged with float64


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))


def test_compat_random_methods_make_no_float64(no_float64):
    def run():
        net = _net()
        prune.random_unstructured(net[0], "weight", 0.4)
        prune.random_structured(net[2], "weight", 0.5, dim=0)
        prune.l1_unstructured(net[0], "bias", 2)
        prune.ln_structured(net[0], "weight", 0.3, n=2, dim=1)
        prune.global_unstructured(
            [(net[0], "weight"), (net[2], "weight")], prune.RandomUnstructured, amount=0.3
        )
        prune.global_unstructured([(net[0], "weight"), (net[2], "weight")], prune.L1Unstructured, amount=0.2)
        return {k: v.clone() for k, v in net.state_dict().items() if k.endswith("_mask")}

    for path in PATHS:
        torch.manual_seed(1)
        got = float64_free(run, path, no_float64)
        with no_float64.context() as m:
            m.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
            torch.manual_seed(1)
            want = run()
        assert_same_masks(got, want)


def _pruner_run(pruner, params, steps=5, grads=False):
    state = pruner.init(params)
    out = []
    for _ in range(steps):
        kwargs = {"grads": {k: v * 0.5 + 1 for k, v in params.items()}} if grads else {}
        masks, state = pruner.update(params, state, **kwargs)
        out.append(masks)
    return {f"{i}.{k}": v for i, m in enumerate(out) for k, v in m.items()}


@pytest.mark.parametrize("path", PATHS)
def test_pruners_and_schedules_equal_the_float64_paths(no_float64, path):
    params = {k: v for k, v in params_of().items() if v.dim() > 1}
    schedule = functools.partial(fprune.schedules.polynomial, final=0.75, end=4)
    runs = [
        lambda: _pruner_run(fprune.gradual_magnitude(schedule, every=1), params),
        lambda: _pruner_run(
            fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=1, end=10, seed=3), params
        ),
        lambda: _pruner_run(
            fprune.rigl(0.5, drop_fraction=schedule, every=1, end=10, seed=3), params, grads=True
        ),
    ]
    for run in runs:
        assert_same_masks(*both(run, no_float64, path))


def test_synflow_runs_on_the_host_and_returns_float32(no_float64):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.zeros(2, 5)
    got = fprune.scores.synflow(model, params, x)
    with no_float64.context() as m:
        m.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
        want = fprune.scores.synflow(model, params, x)
    assert all(got[k].dtype == torch.float32 and want[k].dtype == torch.float64 for k in params)
    assert all(torch.equal(got[k], want[k].float()) for k in params)


def test_calibration_accumulates_in_float32(no_float64):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    params = {k: v.detach() for k, v in model.named_parameters()}
    batches = [torch.randn(8, 6) for _ in range(3)]
    got = float64_free(lambda: fprune.calibration.input_norms(model, params, batches), "eager", no_float64)
    with no_float64.context() as m:
        m.setattr(_torch, "NO_FLOAT64", frozenset({"mps"}))
        want = fprune.calibration.input_norms(model, params, batches)
    assert got.keys() == want.keys()
    assert all(torch.allclose(got[k], want[k], rtol=1e-6, atol=0) for k in want)


# ---------------------------------------------------------------------------------------------
# On a real MPS device (Apple silicon): skipped elsewhere.


@pytest.mark.mps
@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an MPS device")
@pytest.mark.parametrize("seed", [0, 7])
def test_mps_masks_equal_cpu_masks(seed):
    params, prior = params_of(seed), prior_of(params_of(seed))
    mps = {k: v.to("mps") for k, v in params.items()}
    mps_prior = {k: v.to("mps") for k, v in prior.items()}
    two_d = [k for k in params if params[k].dim() > 1]
    calls = [
        lambda p, m: fprune.random_unstructured(p, 0.4, generator=seed, masks=m),
        lambda p, m: fprune.random_structured({k: p[k] for k in two_d}, 0.5, 0, generator=seed),
        lambda p, m: fprune.l1_unstructured(p, torch.tensor(0.3), masks=m),
        lambda p, m: fprune.global_unstructured(p, 0.5, masks=m),
    ]
    for call in calls:
        want, got = call(params, prior), call(mps, mps_prior)
        assert all(torch.equal(want[k], got[k].cpu()) for k in want)
    # normalize=: float32 norms on MPS, count-exact (masks may differ right at the threshold)
    want, got = (fprune.global_unstructured(p, 0.5, normalize="l2") for p in (params, mps))
    assert sum(int((~m).sum()) for m in want.values()) == sum(int((~m).sum()) for m in got.values())
    s = fprune.sparsity(calls[0](mps, mps_prior))
    assert s.overall.dtype == torch.float32 and s.overall.device.type == "mps"
