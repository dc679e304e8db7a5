"""The lottery-ticket example (examples/lottery_ticket.py) on a short configuration.

Checks the expected shape of the result (magnitude pruning keeps accuracy longer than random
pruning; global magnitude at least as long as layer-wise), the exact weight counts of every
round, determinism, that pruned weights stay put in training, that the vmapped pruning equals
the eager one, and the command line (table and PNG).
"""

import dataclasses
import importlib.util

import pytest
import torch

import fprune
from tests.helpers import ROOT, load_example

# sklearn is imported by the example when it loads the data: finding it costs no import here.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (the examples extra)"
)

lt = load_example("lottery_ticket")
QUICK = lt.Config.quick()


@pytest.fixture(scope="module")
def quick_result():
    return lt.run(QUICK, progress=None)


def _expected_remaining(sizes, rate, rounds):
    """Weights left after each round when every group of ``sizes`` loses round(rate * alive)."""
    alive = list(sizes)
    totals = [sum(alive)]
    for _ in range(rounds):
        alive = [a - round(rate * a) for a in alive]
        totals.append(sum(alive))
    return totals


def test_quick_config_reaches_high_sparsity():
    assert QUICK.rate**QUICK.rounds <= 0.02


def test_remaining_weights_are_exact_every_round(quick_result):
    _base, init = lt.initial_models(QUICK)
    sizes = [p[0].numel() for name, p in init.items() if lt.is_weight(name, p)]
    assert quick_result.total_weights == sum(sizes)
    expected = {
        "global magnitude": _expected_remaining([sum(sizes)], QUICK.rate, QUICK.rounds),
        "layer-wise magnitude": _expected_remaining(sizes, QUICK.rate, QUICK.rounds),
        "random": _expected_remaining(sizes, QUICK.rate, QUICK.rounds),
    }
    for method in lt.METHODS:
        counts = quick_result.remaining[method]
        assert counts.shape == (QUICK.rounds + 1, QUICK.seeds)
        for seed in range(QUICK.seeds):
            assert counts[:, seed].tolist() == expected[method], method


def test_dense_network_is_well_above_chance(quick_result):
    for method in lt.METHODS:
        assert float(quick_result.accuracy[method][0].min()) > 0.8


def test_magnitude_pruning_outlasts_random_pruning(quick_result):
    acc = {m: quick_result.accuracy[m].mean(1) for m in lt.METHODS}  # mean over seeds, per round
    sparse = slice(QUICK.rounds // 2, None)  # the sparse half: <= 12.5% of the weights
    global_, layer, random = (float(acc[m][sparse].mean()) for m in lt.METHODS)
    # Noise margins: a few points between the magnitude methods, much more against random.
    assert global_ >= layer - 0.03
    assert global_ >= random + 0.15
    assert layer >= random + 0.05
    # At the sparsest round, global magnitude still beats random by a wide margin.
    assert float(acc["global magnitude"][-1]) >= float(acc["random"][-1]) + 0.2
    # Random pruning ends near chance; the dense network does not.
    assert float(acc["random"][-1]) < 0.5


def test_runs_are_deterministic():
    config = dataclasses.replace(QUICK, rounds=2, epochs=2)
    first, second = lt.run(config, progress=None), lt.run(config, progress=None)
    for method in lt.METHODS:
        assert torch.equal(first.accuracy[method], second.accuracy[method])
        assert torch.equal(first.remaining[method], second.remaining[method])


def test_training_keeps_pruned_weights_at_their_initial_values():
    config = dataclasses.replace(QUICK, epochs=1)
    x_train, y_train, _, _ = lt.load_digits_split(config)
    base, init = lt.initial_models(config)
    masks = lt.prune("random", init, fprune.identity(init), 0.5, torch.arange(config.seeds))
    trained = lt.train(base, init, masks, (x_train, y_train), config, round_=0)
    for name in init:
        pruned = ~masks[name]
        assert torch.equal(trained[name][pruned], init[name][pruned]), name
        if lt.is_weight(name, init[name]):
            assert pruned.any()
            assert not torch.equal(trained[name][~pruned], init[name][~pruned]), name
        else:
            assert not pruned.any()  # biases are never pruned


@pytest.mark.parametrize("method", lt.METHODS)
def test_vmapped_pruning_equals_pruning_each_seed_eagerly(method):
    _base, params = lt.initial_models(QUICK)
    seeds = torch.arange(QUICK.seeds) * 1000 + 3
    first = lt.prune(method, params, fprune.identity(params), 0.2, seeds)
    second = lt.prune(method, params, first, 0.2, seeds)
    eager = {
        "global magnitude": lambda p, m, s: fprune.global_unstructured(p, 0.2, masks=m, where=lt.is_weight),
        "layer-wise magnitude": lambda p, m, s: fprune.l1_unstructured(p, 0.2, masks=m, where=lt.is_weight),
        "random": lambda p, m, s: fprune.random_unstructured(
            p, 0.2, generator=int(s), masks=m, where=lt.is_weight
        ),
    }[method]
    for seed in range(QUICK.seeds):
        p = {name: t[seed] for name, t in params.items()}
        m1 = eager(p, None, seeds[seed])
        m2 = eager(p, m1, seeds[seed])
        for name in params:
            assert torch.equal(first[name][seed], m1[name]), name
            assert torch.equal(second[name][seed], m2[name]), name


def test_unknown_method_is_rejected():
    _base, params = lt.initial_models(QUICK)
    with pytest.raises(ValueError, match="'magnitude'"):
        lt.prune("magnitude", params, fprune.identity(params), 0.2, torch.arange(QUICK.seeds))


def test_command_line_writes_table_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, table = tmp_path / "lottery.png", tmp_path / "table.md"
    argv = ["--quick", "--rounds", "2", "--seeds", "1", "--plot", str(png), "--table", str(table)]
    result = lt.main(argv)
    out = capsys.readouterr().out
    assert "1 thread(s)" in out
    assert out.count("round ") == 3  # a line per round
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = table.read_text().strip().splitlines()
    assert lines[0] == "| weights remaining | global magnitude | layer-wise magnitude | random |"
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| 100.00% |") and lines[3].startswith("| 50.00% |")
    assert lines[2] in out
    assert result.config.seeds == 1 and result.config.rounds == 2


def _committed_table():
    header = "| weights remaining | global magnitude | layer-wise magnitude | random |"
    lines = (ROOT / "docs" / "experiments.md").read_text().splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_committed_table_matches_a_fresh_run_of_the_first_rounds():
    # docs/experiments.md's table came from `python examples/lottery_ticket.py` (one thread, the
    # default): the first rounds of a fresh run must print the same rows, so the committed table
    # cannot silently go stale when training or pruning changes.
    table = _committed_table()
    assert len(table) == lt.Config().rounds + 1
    assert torch.get_num_threads() == 1
    fresh = lt.markdown_table(lt.run(dataclasses.replace(lt.Config(), rounds=2), progress=None)).splitlines()[
        2:
    ]
    assert fresh == table[:3]
