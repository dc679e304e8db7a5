"""layout="auto": CSR where the measured crossover says it is faster, dense elsewhere."""

from __future__ import annotations

import itertools

import pytest
import torch

import fprune
from fprune import _torch
from fprune.sparse import _auto, crossover, layouts, to_sparse
from sparse_helpers import assert_close


def _layer(out_features, in_features, amount, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g).to(dtype)
    keep = fprune.l1_unstructured({"w": w.float()}, amount)["w"]
    return {"w": w}, {"w": keep}


def test_crossover_is_the_highest_over_rows_unless_rows_is_given():
    for threads, classes in _auto.CROSSOVER.items():
        for size, table in classes.items():
            assert crossover(size, threads=threads) == max(table.values())
            for rows, value in table.items():
                assert crossover(size, threads=threads, rows=rows) == value
            assert crossover(size, threads=threads, rows=10**6) == table[max(table)]
    big = max(_auto.CROSSOVER[max(_auto.CROSSOVER)])
    assert crossover(big, threads=64) == crossover(
        big, threads=max(_auto.CROSSOVER)
    )  # more threads than measured


def test_crossover_between_measured_rows_takes_the_higher_neighbour():
    table = _auto.CROSSOVER[1][max(_auto.CROSSOVER[1])]
    counts = sorted(table)
    between = (counts[0] + counts[1]) // 2
    if between not in table:
        assert crossover(max(_auto.CROSSOVER[1]), threads=1, rows=between) == max(
            table[counts[0]], table[counts[1]]
        )


def test_smaller_layers_never_need_less_sparsity():
    for threads, classes in _auto.CROSSOVER.items():
        sizes = sorted(classes)
        for small, large in itertools.pairwise(sizes):
            assert crossover(small, threads=threads) >= crossover(large, threads=threads)
    assert crossover(min(min(c) for c in _auto.CROSSOVER.values()) - 1) == _auto.NEVER


@pytest.mark.parametrize("amount", [0.5, 0.75, 0.9, 0.95, 0.98, 0.995])
@pytest.mark.parametrize("shape", [(1024, 1024), (4096, 1024), (768, 3072)])
def test_auto_follows_the_crossover(amount, shape):
    params, masks = _layer(*shape, amount)
    got = layouts(to_sparse(params, masks, measure=False))["w"]
    assert got == ("csr" if amount >= crossover(shape[0] * shape[1]) - 1e-4 else "dense")


def test_rows_chooses_for_that_size():
    size = max(_auto.CROSSOVER[1])
    table = _auto.CROSSOVER[1][size]
    rows = min(table, key=lambda r: table[r])
    params, masks = _layer(size // 1024, 1024, table[rows])
    with _threads(1):
        assert layouts(to_sparse(params, masks, rows=rows, measure=False))["w"] == "csr"
        if max(table.values()) > table[rows]:
            assert layouts(to_sparse(params, masks, measure=False))["w"] == "dense"


def test_small_layers_other_dtypes_and_unmasked_weights_stay_dense():
    params, masks = _layer(64, 64, 0.99)  # below the smallest size class of the table
    assert layouts(to_sparse(params, masks, measure=False))["w"] == "dense"
    params, masks = _layer(1024, 1024, 0.99, torch.bfloat16)  # no CPU sparse kernel
    assert layouts(to_sparse(params, masks))["w"] == "dense"
    params, _ = _layer(1024, 1024, 0.99)
    assert layouts(to_sparse(params, {}))["w"] == "dense"
    assert to_sparse(params, {})["w"] is params["w"]


def test_auto_keeps_weights_on_other_devices_dense():
    params, masks = _layer(1024, 1024, 0.99)
    meta = {"w": params["w"].to("meta")}
    assert layouts(to_sparse(meta, {"w": masks["w"].to("meta")}))["w"] == "dense"


def test_without_wrapper_subclasses_every_weight_stays_dense_and_right(monkeypatch):
    params, masks = _layer(512, 512, 0.99)
    monkeypatch.setattr(_torch, "_MAKE_WRAPPER_SUBCLASS", None)
    assert not _torch.has_wrapper_subclasses()
    with pytest.warns(UserWarning, match="cannot make the tensor subclass"):
        sparse = to_sparse(params, masks, layout="csr")
    assert type(sparse["w"]) is torch.Tensor
    x = torch.randn(3, 512)
    assert_close(torch.nn.functional.linear(x, sparse["w"]), x @ (params["w"] * masks["w"]).t())


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


# --------------------------------------------------------------- measured at conversion


class _FakeTimer:
    """Seconds per call from a table: (name, rows) -> seconds; records every timing asked for."""

    def __init__(self, csr_over_dense, dense_again=1.0):
        self.csr_over_dense = csr_over_dense  # rows -> csr time / dense time
        self.dense_again = dense_again
        self.calls = []

    def __call__(self, fns, budget_s, *, rows):
        assert list(fns) == ["dense", "csr", "dense again"]
        self.calls += [(name, rows) for name in fns if name != "dense again"]
        n = 5
        return {
            "dense": [1.0] * n,
            "csr": [self.csr_over_dense[rows]] * n,
            "dense again": [self.dense_again] * n,
        }


@pytest.fixture
def fake_timer(monkeypatch):
    _auto.clear_measurements()

    def install(csr_over_dense):
        timer = (
            _FakeTimer(*csr_over_dense) if isinstance(csr_over_dense, tuple) else _FakeTimer(csr_over_dense)
        )
        monkeypatch.setattr(_auto, "TIMER", timer)
        return timer

    yield install
    _auto.clear_measurements()


def test_measured_choice_follows_the_timer_with_a_margin_for_dense(fake_timer):
    timer = fake_timer({1: 0.5, 8: 0.96, 64: 0.95, 512: 0.2})
    params, masks = _layer(256, 128, 0.5)
    assert layouts(to_sparse(params, masks, rows=1))["w"] == "csr"
    assert layouts(to_sparse(params, masks, rows=8))["w"] == "dense"
    assert layouts(to_sparse(params, masks, rows=64))["w"] == "dense"  # a tie at the margin: dense
    assert layouts(to_sparse(params, masks, rows=[1, 512]))["w"] == "csr"
    assert layouts(to_sparse(params, masks, rows=[1, 8, 512]))["w"] == "dense"
    assert set(timer.calls) == {(n, r) for n in ("dense", "csr") for r in (1, 8, 64, 512)}


def test_default_rows_are_every_measured_count_and_a_loss_at_any_keeps_dense(fake_timer):
    fake_timer({1: 0.1, 8: 0.1, 64: 0.1, 512: 1.2})
    params, masks = _layer(256, 128, 0.9)
    assert layouts(to_sparse(params, masks))["w"] == "dense"
    _auto.clear_measurements()
    timer = fake_timer({1: 0.1, 8: 0.1, 64: 0.1, 512: 0.1})
    assert layouts(to_sparse(params, masks))["w"] == "csr"
    assert sorted({r for _, r in timer.calls}) == list(_auto.ROWS)


def test_the_cache_is_hit_for_the_same_shape_dtype_sparsity_rows_and_threads(fake_timer):
    timer = fake_timer({1: 0.5, 8: 0.5, 64: 0.5, 512: 0.5})
    params, masks = _layer(256, 128, 0.9)
    first = layouts(to_sparse(params, masks, rows=8))
    n = len(timer.calls)
    assert first == {"w": "csr"} and n == 2 * 2  # two timings of (dense, csr): csr wins both
    other = {"w": torch.randn(256, 128)}  # another weight of the same shape and sparsity
    again = layouts(to_sparse(other, fprune.l1_unstructured(other, 0.9), rows=8))
    assert again == first and len(timer.calls) == n  # no re-timing
    to_sparse(params, masks, rows=1)  # another row count
    to_sparse(*_layer(256, 128, 0.8), rows=8)  # another sparsity
    to_sparse({"w": params["w"].double()}, masks, rows=8)  # another dtype
    to_sparse(*_layer(128, 256, 0.9), rows=8)  # another shape
    with _threads(torch.get_num_threads() % 2 + 1):
        to_sparse(params, masks, rows=8)  # another thread count
    assert len(timer.calls) == n + 5 * 2 * 2
    _auto.clear_measurements()
    to_sparse(params, masks, rows=8)
    assert len(timer.calls) == n + 6 * 2 * 2


def test_timing_too_noisy_to_tell_takes_the_tables_answer(fake_timer):
    params, masks = _layer(1024, 1024, 0.8)  # the table: csr at 8 rows, dense at 1
    table = {r: layouts(to_sparse(params, masks, rows=r, measure=False))["w"] for r in (1, 8)}
    assert table == {1: "dense", 8: "csr"}
    timer = fake_timer(({1: 0.1, 8: 10.0}, 1.6))  # the two dense timings 1.6x apart
    for r in (1, 8):
        assert layouts(to_sparse(params, masks, rows=r))["w"] == table[r]
    assert len(timer.calls) == 2 * 2 * _auto.ATTEMPTS  # each count timed ATTEMPTS times
    _auto.clear_measurements()
    fake_timer(({1: 0.1, 8: 0.96}, 1.4))  # within NOISE: the timing decides, against the faster dense
    assert [layouts(to_sparse(params, masks, rows=r))["w"] for r in (1, 8)] == ["csr", "dense"]
    _auto.clear_measurements()
    fake_timer(({1: 0.1, 8: 0.94}, 1.4))
    assert layouts(to_sparse(params, masks, rows=8))["w"] == "csr"


def test_timing_off_reads_the_table_and_times_nothing(fake_timer):
    timer = fake_timer({})
    for amount in (0.5, 0.8, 0.9, 0.95):
        params, masks = _layer(1024, 1024, amount)
        for rows in (None, 1, (1, 512)):
            got = layouts(to_sparse(params, masks, rows=rows, measure=False))["w"]
            counts = [None] if rows is None else ([rows] if isinstance(rows, int) else rows)
            need = max(crossover(1024 * 1024, rows=r) for r in counts)
            assert got == ("csr" if amount >= need - 1e-4 else "dense")
    assert timer.calls == []


def test_csr_must_win_two_timings_and_one_dense_verdict_ends_the_timing(monkeypatch):
    params, masks = _layer(256, 128, 0.9)
    fast = {"dense": [1.0] * 5, "csr": [0.5] * 5, "dense again": [1.0] * 5}
    slow = dict(fast, csr=[1.2] * 5)
    noisy = dict(fast, **{"dense again": [2.0] * 5})

    def check(sequence, expected, timings_taken):
        _auto.clear_measurements()
        answers = iter(sequence)
        taken = []

        def timer(fns, budget_s, *, rows):
            taken.append(rows)
            return next(answers)

        monkeypatch.setattr(_auto, "TIMER", timer)
        assert layouts(to_sparse(params, masks, rows=8, measure=True))["w"] == expected
        assert len(taken) == timings_taken

    check([fast, fast], "csr", 2)
    check([fast, slow], "dense", 2)  # one fast timing, not confirmed
    check([slow], "dense", 1)  # dense at once
    check([noisy, fast, fast], "csr", 3)  # a noisy timing is retaken
    check([fast, noisy, fast], "csr", 3)
    # a noisy timing and one csr win in three: the table's answer (256x128 is below its sizes: dense)
    check([noisy, noisy, fast], "dense", 3)
    _auto.clear_measurements()


def test_the_real_timer_makes_a_choice_that_gives_the_masked_outputs():
    _auto.clear_measurements()
    params, masks = _layer(512, 256, 0.95)
    sparse = to_sparse(params, masks, rows=(1, 8))
    assert layouts(sparse)["w"] in ("csr", "dense")
    x = torch.randn(8, 256)
    with torch.no_grad():
        assert_close(torch.nn.functional.linear(x, sparse["w"]), x @ (params["w"] * masks["w"]).t())
    _auto.clear_measurements()


def test_one_fast_call_of_csr_does_not_make_it_faster(monkeypatch):
    _auto.clear_measurements()
    timings = {"dense": [1.0] * 5, "csr": [0.5, 2.0, 2.0, 2.0, 2.0], "dense again": [1.0] * 5}
    monkeypatch.setattr(_auto, "TIMER", lambda fns, budget_s, *, rows: timings)
    params, masks = _layer(256, 128, 0.9)
    assert layouts(to_sparse(params, masks, rows=1))["w"] == "dense"
    _auto.clear_measurements()
    timings["csr"] = [0.5, 0.9, 0.9, 2.0, 0.9]  # fastest and median round both below the margin
    assert layouts(to_sparse(params, masks, rows=1))["w"] == "csr"
    _auto.clear_measurements()
