"""oneshot.prune on a shared machine: each layer's solve on one torch thread (the count restored
after), and the progress report's hint when a block's time per weight entry jumps, driven by a
fake clock (no real time is asserted)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import fprune
from fprune import _threads
from fprune.oneshot import _progress
from tests.helpers import ROOT


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class Tower(torch.nn.Module):
    def __init__(self, blocks: int = 5, width: int = 8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(blocks)
        )

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def tower(blocks: int = 5):
    torch.manual_seed(0)
    model = Tower(blocks).eval()
    return model, dict(model.named_parameters()), [torch.randn(16, 8) for _ in range(2)]


class Spy(fprune.oneshot.LayerMethod):
    """Magnitude's mask, recording the thread count each solve sees (or raising in it)."""

    statistic = "none"

    def __init__(self, fail: bool = False):
        self.seen: list[int] = []
        self.fail = fail

    def prune_layer(self, weight, statistic, amount=None, *, n_m=None):
        self.seen.append(torch.get_num_threads())
        if self.fail:
            raise RuntimeError("solve failed")
        return fprune.oneshot.Magnitude().prune_layer(weight, statistic, amount)


# ---------------------------------------------------------------------------------------------
# One thread around a region


def test_serial_lowers_to_one_thread_and_restores(two_threads):
    with _threads.serial(100) as lowered:
        assert lowered and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="inside"), _threads.serial(100):
        raise ValueError("inside")
    assert torch.get_num_threads() == 2  # restored on an error too
    with _threads.serial(_threads.SERIAL_ENTRIES + 1) as lowered:  # larger work keeps its threads
        assert not lowered and torch.get_num_threads() == 2


def test_serial_leaves_one_thread_as_it_is():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _threads.serial(100) as lowered:
            assert not lowered and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_serial_runs_the_region_where_torch_refuses_the_count(two_threads, monkeypatch):
    def refuse(n):
        raise RuntimeError("cannot set the number of threads")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    with _threads.serial(100) as lowered:
        assert not lowered and torch.get_num_threads() == 2


def test_prune_solves_small_layers_on_one_thread(two_threads, monkeypatch):
    model, params, batches = tower(2)
    spy = Spy()
    _, masks = fprune.oneshot.prune(model, params, batches, 0.5, method=spy)
    assert spy.seen == [1, 1] and torch.get_num_threads() == 2
    # the same masks as magnitude's, whatever the threads
    _, expected = fprune.oneshot.prune(model, params, batches, 0.5, method="magnitude")
    assert all(torch.equal(masks[k], expected[k]) for k in expected)
    monkeypatch.setattr(_threads, "SERIAL_ENTRIES", 8 * 8 - 1)  # layers larger than the limit
    spy = Spy()
    fprune.oneshot.prune(model, params, batches, 0.5, method=spy)
    assert spy.seen == [2, 2]


def test_prune_restores_the_threads_when_a_solve_raises(two_threads):
    model, params, batches = tower(2)
    with pytest.raises(RuntimeError, match="solve failed"):
        fprune.oneshot.prune(model, params, batches, 0.5, method=Spy(fail=True))
    assert torch.get_num_threads() == 2


# ---------------------------------------------------------------------------------------------
# The hint, from the seconds the pipeline reports


def steps(progress, seconds_and_entries):
    progress.start("prune", len(seconds_and_entries))
    for b, (seconds, entries) in enumerate(seconds_and_entries):
        progress.step(b, f"blocks.{b}", 1, (seconds, 0.0, 0.0), entries)


def hints(seconds_and_entries):
    reports: list = []
    steps(_progress.Progress(reports.append, clock=lambda: 0.0), seconds_and_entries)
    return [r.hint for r in reports]


def test_hint_once_when_a_block_jumps(two_threads, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    found = hints([(1.0, 100)] * 3 + [(2.5, 100), (3.0, 100), (1.0, 100)])
    assert found[:3] == [None] * 3 and found[4:] == [None, None]  # once
    assert found[3] is not None
    assert "2.5x the time per weight" in found[3] and "on 2 torch threads" in found[3]
    assert "torch.set_num_threads(1)" in found[3] and "OMP_NUM_THREADS=1" in found[3]
    assert "OMP_WAIT_POLICY=PASSIVE" in found[3]


def test_no_hint_for_steady_blocks_or_too_few(two_threads):
    assert hints([(1.0, 100)] * 3 + [(2.0, 100)] * 3) == [None] * 6  # 2x: not over
    assert hints([(1.0, 100)] * 2 + [(50.0, 100)]) == [None] * 3  # 2 blocks seen: too few
    # time per weight entry: a block twice as large taking twice as long is not slow
    assert hints([(1.0, 100)] * 3 + [(3.0, 300)]) == [None] * 4
    # blocks with nothing pruned are not counted
    assert hints([(1.0, 100), (5.0, 0), (1.0, 100), (9.0, 0), (3.0, 100)]) == [None] * 5
    # the median, not the mean: one slow early block does not hide a jump
    assert hints([(1.0, 100), (9.0, 100), (1.0, 100), (2.5, 100)])[3] is not None


def test_hint_leaves_out_what_is_set_already(two_threads, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    hint = hints([(1.0, 100)] * 3 + [(3.0, 100)])[3]
    assert hint is not None and "torch.set_num_threads(1)" in hint and "OMP_WAIT_POLICY" not in hint
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # one thread: nothing of torch's to set
        assert hints([(1.0, 100)] * 3 + [(30.0, 100)]) == [None] * 4
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# The hint from prune itself, under a fake clock


class FakeClock:
    """Each reading advances by ``tick`` seconds; a hook raises ``tick`` when a block starts."""

    def __init__(self):
        self.now, self.tick = 0.0, 1.0

    def perf_counter(self):
        self.now += self.tick
        return self.now


def slowed_prune(monkeypatch, progress, slow_from: int = 3):
    clock = FakeClock()
    monkeypatch.setattr(_progress, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    model, params, batches = tower(5)

    def slow_down(module, args):
        clock.tick = 10.0

    handle = model.blocks[slow_from].register_forward_pre_hook(slow_down)
    try:
        fprune.oneshot.prune(model, params, batches, 0.5, method="wanda", progress=progress)
    finally:
        handle.remove()


def test_prune_reports_the_hint_once_at_the_block_that_slowed(two_threads, monkeypatch):
    reports: list = []
    slowed_prune(monkeypatch, reports.append)
    blocks = [r for r in reports if r.phase == "prune"]
    assert [r.hint is not None for r in blocks] == [False, False, False, True, False]
    assert "10.0x the time per weight" in blocks[3].hint
    # the fake clock drives the report's times: 3 readings per block, 1 s each before the hook
    assert [r.statistics_seconds + r.pruning_seconds + r.forward_seconds for r in blocks[:3]] == [3.0] * 3


def test_prune_prints_the_hint_once_on_stderr(two_threads, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    slowed_prune(monkeypatch, True)
    err = capsys.readouterr().err
    assert err.count("torch.set_num_threads(1)") == 1
    lines = err.splitlines()
    at = next(i for i, line in enumerate(lines) if "set_num_threads" in line)
    assert lines[at - 1].startswith("oneshot.prune: block 4/5 blocks.3:")


def test_prune_writes_the_hint_under_the_tqdm_bar(two_threads, monkeypatch, capsys):
    pytest.importorskip("tqdm")
    slowed_prune(monkeypatch, True)
    err = capsys.readouterr().err
    assert err.count("torch.set_num_threads(1)") == 1 and "slow: shared machine?" in err


# ---------------------------------------------------------------------------------------------
# docs/posttrain.md, On a shared machine: its figures are the benchmark's


def test_posttrain_shared_machine_figures_are_the_benchmarks():
    results = (ROOT / "benchmarks" / "results" / "contention.md").read_text()
    page = (ROOT / "docs" / "posttrain.md").read_text()
    section = page[page.index("## On a shared machine") :]
    start = results.index("| busy cores | OMP_WAIT_POLICY | load before |")
    summary = results[start : results.index("\n\n", start)]
    assert summary in section
    assert "python -m benchmarks.contention" in section
