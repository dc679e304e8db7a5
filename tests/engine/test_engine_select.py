"""The selection engine (fprune.select._engine): the eager streaming radix select, the traced sort path
and a naive reference must give the same masks, whatever the scores (ties, NaN, -0.0, +-inf,
int / float64 / float32 / float16 / bfloat16), prior masks, ``k`` (0 and n included), chunk
size and number of radix passes (``CHUNK`` and ``CANDIDATES`` are monkeypatched small)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fprune.select import _engine, _histogram, _stream
from tests.engine.engine_helpers import (
    CPU,
    owner,
    reference,
    sources_of,
)

SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-3, float("inf"), float("-inf"), float("nan"), 3.0, 7.0]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]


def run_both(scores, keeps, k, transform):
    sources = sources_of(scores, keeps, transform)
    eager = _engine.prune_lowest(sources, k, traced=False, device=CPU)
    traced = _engine.prune_lowest(sources, k, traced=True, device=CPU)
    as_tensor = _engine.prune_lowest(sources, torch.tensor(k), traced=False, device=CPU)
    return eager, traced, as_tensor


@st.composite
def problems(draw):
    dtype_pool = draw(
        st.sampled_from([[torch.float32], [torch.float32, torch.float16, torch.bfloat16], DTYPES])
    )
    count = draw(st.integers(1, 4))
    scores, keeps = [], []
    for _ in range(count):
        dtype = draw(st.sampled_from(dtype_pool))
        n = draw(st.integers(0, 40))
        if dtype.is_floating_point:
            pool = SPECIAL if draw(st.booleans()) else SPECIAL[:7]
            values = draw(
                st.lists(st.sampled_from(pool) | st.floats(-4, 4, width=16), min_size=n, max_size=n)
            )
        else:
            values = draw(st.lists(st.integers(-5, 5) | st.integers(-(2**40), 2**40), min_size=n, max_size=n))
            if dtype == torch.int32:
                values = [max(min(v, 2**31 - 1), -(2**31)) for v in values]
        s = torch.tensor(values, dtype=dtype)
        if draw(st.booleans()) and n % 2 == 0 and n > 0:
            s = s.reshape(2, n // 2)
        scores.append(s)
        keeps.append(
            torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(
                s.shape
            )
            if draw(st.booleans())
            else None
        )
    total = sum(s.numel() for s in scores)
    k = draw(st.integers(0, total))
    transform = draw(st.sampled_from([None, _engine.MAGNITUDE, torch.abs]))
    return scores, keeps, k, transform


ENGINES = {
    "default": {},
    "all-passes": {"CHUNK": 7, "CANDIDATES": 0},
    "few": {"CHUNK": 5, "CANDIDATES": 3},
    "gather": {"CHUNK": 3, "CANDIDATES": 50},
    # The sampled window (int32 keys): windows of 16 or 2**12 keys, samples of 3 blocks of 2,
    # so guesses both hit and miss.
    "sampled-narrow": {"CHUNK": 6, "SAMPLED": 1, "_WINDOW_BITS": 4, "_SAMPLE_BLOCKS": 3, "_SAMPLE_BLOCK": 2},
    "sampled-wide": {"CHUNK": 4, "SAMPLED": 1, "_WINDOW_BITS": 12, "_SAMPLE_BLOCKS": 5, "_SAMPLE_BLOCK": 3},
    # Small leaves packed side by side into shared chunks (runs of alike leaves filled in one
    # call), larger ones in chunks of their own; per-leaf rows for sources of up to 8 entries.
    "packed": {
        "CHUNK": 64,
        "PACK": 24,
        "CANDIDATES": 0,
        "EACH_SMALL": 8,
        "TRACED_SORT": 0,
        "TRACED_SLICE": 5,
    },
    "packed-direct": {"CHUNK": 256, "PACK": 64, "CANDIDATES": 256, "EACH_SMALL": 40},
    # The CUDA histogram (index_add_ into fixed bins, edge bins spread over extra ones), forced
    # on the CPU: radix passes, and sampled windows that hit and miss.
    "scatter": {
        "SCATTER_HISTOGRAM": True,
        "_SPREAD": 3,
        "CHUNK": 6,
        "CANDIDATES": 0,
        "EACH_SMALL": 4,
        "TRACED_SORT": 10,
        "TRACED_SLICE": 1,
        "_TRACED_SLICES": 3,
    },
    "scatter-sampled": {
        "SCATTER_HISTOGRAM": True,
        "_SPREAD": 2,
        "CHUNK": 5,
        "SAMPLED": 1,
        "_WINDOW_BITS": 4,
        "_SAMPLE_BLOCKS": 3,
        "_SAMPLE_BLOCK": 2,
    },
}


@pytest.fixture(params=list(ENGINES), ids=list(ENGINES))
def engine(request, monkeypatch):
    for name, value in ENGINES[request.param].items():
        monkeypatch.setattr(owner(name), name, value)
    return request.param


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problems())
def test_streaming_equals_sort_path_equals_reference(engine, problem):
    scores, keeps, k, transform = problem
    expected = reference(scores, keeps, k, transform)
    for masks in run_both(scores, keeps, k, transform):
        assert len(masks) == len(expected)
        for got, want in zip(masks, expected, strict=True):
            assert got.dtype == torch.bool
            assert torch.equal(got.reshape(-1), want)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problems())
def test_exactly_k_are_pruned(engine, problem):
    scores, keeps, k, transform = problem
    for masks in run_both(scores, keeps, k, transform):
        assert sum(int((~m).sum()) for m in masks) == k


def test_k_zero_and_k_all(engine):
    scores = [torch.tensor([3.0, float("nan"), -1.0]), torch.tensor([0.0, -0.0])]
    for k, kept in ((0, True), (5, False)):
        for masks in run_both(scores, [None, None], k, _engine.MAGNITUDE):
            assert all(bool((m == kept).all()) for m in masks)


def test_ties_split_by_position_across_leaves_and_chunks(engine):
    scores = [torch.full((9,), 2.0), torch.full((4,), -2.0), torch.full((6,), 2.0)]
    for k in range(20):
        for masks in run_both(scores, [None] * 3, k, _engine.MAGNITUDE):
            flat = torch.cat(masks)
            assert torch.equal(flat, torch.arange(19) >= k)


def test_nan_ranks_above_inf_and_all_nans_tie_by_position(engine):
    payloads = torch.tensor([0x7FC00001, -0x400000, 0x7F800001, 0x7FC00000], dtype=torch.int32)
    nans = payloads.view(torch.float32)
    assert bool(nans.isnan().all())
    scores = [torch.cat([nans, torch.tensor([float("inf"), -float("inf")])])]
    for k in range(7):
        expected = reference(scores, [None], k, _engine.MAGNITUDE)
        for masks in run_both(scores, [None], k, _engine.MAGNITUDE):
            assert torch.equal(masks[0], expected[0])
    # inf entries (positions 4, 5) go before any NaN.
    (eager,), _, _ = run_both(scores, [None], 2, _engine.MAGNITUDE)
    assert eager.tolist() == [True, True, True, True, False, False]


def test_negative_zero_equals_zero(engine):
    scores = [torch.tensor([0.0, -0.0, 0.0, -0.0])]
    for transform in (None, _engine.MAGNITUDE):
        for masks in run_both(scores, [None], 3, transform):
            assert masks[0].tolist() == [False, False, False, True]


def test_prior_pruned_rank_below_everything(engine):
    scores = [torch.tensor([-float("inf"), 5.0, 0.0]), torch.tensor([float("nan"), 1.0])]
    keeps = [torch.tensor([True, False, True]), torch.tensor([False, True])]
    for transform in (None, _engine.MAGNITUDE):
        for masks in run_both(scores, keeps, 2, transform):
            assert torch.cat(masks).tolist() == [True, False, True, False, True]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_raw_keys_over_the_whole_integer_range(engine, dtype):
    """Plain key functions (any callable) with keys at the extremes of the key type."""
    info = torch.iinfo(dtype)
    values = [info.min, info.max, info.max, 0, -1, info.min + 1, info.max - 1, 1 << 20, info.min, 7]
    keys = torch.tensor(values, dtype=dtype)
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    for k in range(len(values) + 1):
        sources = [(4, lambda a, b: keys[a:b]), (6, lambda a, b: keys[4 + a : 4 + b])]
        eager = torch.cat(_engine.prune_lowest(sources, k, traced=False, device=CPU))
        traced = torch.cat(_engine.prune_lowest(sources, k, traced=True, device=CPU))
        expected = torch.ones(len(values), dtype=torch.bool)
        expected[order[:k]] = False
        assert torch.equal(eager, expected) and torch.equal(traced, expected)


def test_many_chunks_and_passes_on_wide_random_data(monkeypatch):
    monkeypatch.setattr(owner("CHUNK"), "CHUNK", 1000)
    monkeypatch.setattr(owner("CANDIDATES"), "CANDIDATES", 0)
    g = torch.Generator().manual_seed(0)
    scores = [
        torch.randn(3000, generator=g),
        torch.randn(50, 40, generator=g).double(),
        torch.randn(777, generator=g).half(),
    ]
    scores[0][::7] = 0.5  # many ties
    keeps = [None, torch.rand(50, 40, generator=g) > 0.3, None]
    for k in (1, 1234, 2500, 5776):
        expected = reference(scores, keeps, k, _engine.MAGNITUDE)
        for masks in run_both(scores, keeps, k, _engine.MAGNITUDE):
            assert all(torch.equal(a.reshape(-1), b) for a, b in zip(masks, expected, strict=True))


def test_keys_into_buffer_equal_keys_returned():
    bits = torch.tensor(
        [0x7FC00001, -0x400000, 0x7F800000, -0x800000, 0, -0x80000000, 0x3F800000], dtype=torch.int32
    )
    for scores in (bits.view(torch.float32), torch.randn(5).half(), torch.randn(5).bfloat16()):
        for keep in (None, torch.arange(scores.numel()) % 2 == 0):
            fn = _engine.keys(scores, keep, torch.int32, _engine.MAGNITUDE)
            out = torch.empty(scores.numel(), dtype=torch.int32)
            assert torch.equal(fn.into(0, scores.numel(), out), fn(0, scores.numel()))


def test_orderable_orders_floats():
    g = torch.Generator().manual_seed(1)
    values = torch.cat(
        [
            torch.randn(500, generator=g) * 10.0 ** torch.randint(-30, 30, (500,), generator=g),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf")]),
        ]
    )
    for dtype, wide in ((torch.int32, torch.float32), (torch.int64, torch.float64)):
        x = values.to(wide)
        keys = _engine.orderable(x, dtype)
        order = torch.argsort(x, stable=True)
        assert bool((keys[order][1:] >= keys[order][:-1]).all())
        assert bool(((keys[:, None] == keys[None, :]) == (x[:, None] == x[None, :])).all())


@pytest.mark.parametrize("window_bits", [3, 5, 8])
def test_sampled_window_hits_and_misses_give_the_reference_masks(monkeypatch, window_bits):
    """Scores a few float32 ulps apart (consecutive keys), so a small window can hold the k-th."""
    for name, value in {
        "CHUNK": 8,
        "SAMPLED": 1,
        "_WINDOW_BITS": window_bits,
        "_SAMPLE_BLOCKS": 4,
        "_SAMPLE_BLOCK": 3,
    }.items():
        monkeypatch.setattr(owner(name), name, value)
    outcomes = []
    original = _histogram._kth_key_in_sampled_window

    def recorded(*args):  # a generator, as the engine's steps are (see _engine._drive)
        outcome = yield from original(*args)
        outcomes.append(outcome)
        return outcome

    monkeypatch.setattr(owner("_kth_key_in_sampled_window"), "_kth_key_in_sampled_window", recorded)
    g = torch.Generator().manual_seed(window_bits)
    for _ in range(60):
        ulps = torch.randint(0, 40, (50,), generator=g)
        values = (1.0 + ulps.double() * 2.0**-23).float() * torch.where(
            torch.rand(50, generator=g) < 0.5, -1.0, 1.0
        )
        values[torch.rand(50, generator=g) < 0.05] = float("nan")
        scores = [values[:20], values[20:].reshape(5, 6)]
        keeps = [None, torch.rand(5, 6, generator=g) < 0.8]
        k = int(torch.randint(0, 51, (1,), generator=g))
        expected = reference(scores, keeps, k, _engine.MAGNITUDE)
        masks = _engine.prune_lowest(
            sources_of(scores, keeps, _engine.MAGNITUDE), k, traced=False, device=CPU
        )
        assert all(torch.equal(a.reshape(-1), b) for a, b in zip(masks, expected, strict=True))
    found = [o is not None for o in outcomes]
    assert any(found)
    if window_bits <= 5:
        assert not all(found)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problems(), st.data())
def test_each_equals_one_leaf_at_a_time(engine, problem, data):
    """prune_lowest_each (batched rows, side-by-side streams) = the reference on every leaf alone."""
    scores, keeps, _, transform = problem
    ks = [data.draw(st.integers(0, s.numel())) for s in scores]
    dtype = _engine.key_dtype(scores)
    sources = [
        (s.numel(), _engine.keys(s, keep, dtype, transform)) for s, keep in zip(scores, keeps, strict=True)
    ]
    eager = _engine.prune_lowest_each(sources, ks, traced=False, device=CPU)
    as_tensors = _engine.prune_lowest_each(sources, [torch.tensor(k) for k in ks], traced=False, device=CPU)
    traced = _engine.prune_lowest_each(sources, ks, traced=True, device=CPU)
    for i, (s, keep, k) in enumerate(zip(scores, keeps, ks, strict=True)):
        (want,) = reference([s], [keep], k, transform) if dtype == _engine.key_dtype([s]) else (None,)
        if want is None:  # the leaf's own key dtype is narrower: compare with the one-leaf select
            (want,) = _engine.prune_lowest([sources[i]], k, traced=True, device=CPU)
        for masks in (eager, as_tensors, traced):
            assert masks[i].dtype == torch.bool
            assert torch.equal(masks[i].reshape(-1), want.reshape(-1))


def test_each_batches_many_equal_leaves_with_ties(monkeypatch):
    """Rows of one batch with and without tie splits, and batches of several rows."""
    monkeypatch.setattr(owner("CHUNK"), "CHUNK", 40)
    g = torch.Generator().manual_seed(3)
    scores = [torch.randint(0, 3, (10,), generator=g).float() for _ in range(13)] + [
        torch.randn(300, generator=g)
    ]
    ks = [int(torch.randint(0, 11, (1,), generator=g)) for _ in range(13)] + [150]
    sources = sources_of(scores, [None] * 14, torch.abs)
    masks = _engine.prune_lowest_each(sources, ks, traced=False, device=CPU)
    for s, k, got in zip(scores, ks, masks, strict=True):
        (want,) = reference([s], [None], k, torch.abs)
        assert torch.equal(got, want)


def test_packed_small_leaves_equal_one_large_leaf(monkeypatch):
    """Many small leaves select exactly as the same weights in one leaf (packed vs own chunks)."""
    monkeypatch.setattr(owner("CHUNK"), "CHUNK", 1000)
    monkeypatch.setattr(owner("PACK"), "PACK", 100)
    g = torch.Generator().manual_seed(4)
    whole = torch.randn(6000, generator=g)
    whole[::5] = 0.25  # ties across leaves
    keep = torch.rand(6000, generator=g) > 0.2
    parts = list(whole.split(60)), list(keep.split(60))
    for k in (0, 1, 1200, 3000, 5999, 6000):
        one = _engine.prune_lowest(sources_of([whole], [keep], torch.abs), k, traced=False, device=CPU)
        for traced in (False, True):
            many = _engine.prune_lowest(
                sources_of(parts[0], parts[1], torch.abs), k, traced=traced, device=CPU
            )
            assert torch.equal(torch.cat(many), one[0])


def test_scatter_histogram_equals_bincount(monkeypatch):
    """The CUDA kernel's counts (spread edge bins folded back) equal torch.bincount's."""
    g = torch.Generator().manual_seed(6)
    buffers = _stream.Buffers(CPU)
    digits = [torch.randint(0, 40, (n,), generator=g, dtype=torch.int32) for n in (1, 17, 300)]
    digits.append(torch.zeros(500, dtype=torch.int32))  # one hot bin
    monkeypatch.setattr(owner("SCATTER_HISTOGRAM"), "SCATTER_HISTOGRAM", True)
    counter = _histogram._Counter(41, CPU, buffers, edges=(0, 40))
    for d in digits:
        counter.add(d)
    expected = sum(torch.bincount(d.long(), minlength=41) for d in digits)
    assert torch.equal(counter.total(), expected)


def test_leaves_on_two_devices_raise_a_clear_error():
    scores = [torch.randn(4), torch.randn(3, device="meta")]
    sources = [(s.numel(), _engine.keys(s, None, torch.int32, _engine.MAGNITUDE)) for s in scores]
    for traced in (False, True):
        with pytest.raises(ValueError, match="on one device"):
            _engine.prune_lowest(sources, 2, traced=traced, device=CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_traced_radix_equals_sort_under_vmap_and_compile(monkeypatch, dtype):
    """The traced radix select (no sort, bounded temporaries) under vmap over k and compiled."""
    g = torch.Generator().manual_seed(7)
    scores = [torch.randn(300, generator=g).to(dtype), torch.randn(20, 10, generator=g).to(dtype)]
    scores[0][::4] = 0.5
    keeps = [torch.rand(300, generator=g) > 0.2, None]
    ks = torch.tensor([0, 1, 77, 250, 499, 500])
    key_dtype = _engine.key_dtype(scores)

    def select(k):
        sources = [
            (s.numel(), _engine.keys(s, keep, key_dtype, _engine.MAGNITUDE))
            for s, keep in zip(scores, keeps, strict=True)
        ]
        return torch.cat(_engine.prune_lowest(sources, k, traced=True, device=CPU))

    expected = torch.stack([select(int(k)) for k in ks])
    monkeypatch.setattr(owner("TRACED_SORT"), "TRACED_SORT", 0)
    monkeypatch.setattr(owner("TRACED_SLICE"), "TRACED_SLICE", 64)
    assert torch.equal(torch.vmap(select)(ks), expected)
    compiled = torch.compile(select, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(ks[2]), expected[2])
    for i, k in enumerate(ks.tolist()):
        assert torch.equal(select(k), expected[i])
