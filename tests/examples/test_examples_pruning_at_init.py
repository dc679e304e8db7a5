"""The pruning-at-initialization example (examples/pruning_at_init.py) on its quick configuration.

Checks the shape of the result with noise margins: exact counts for the global methods, SynFlow
never collapses a layer, magnitude at initialization does (the fan-in scaling of the init makes
the 128-input layer's weights the smallest), the score-based methods beat random at 10x, and
the command line writes a table and a plot.
"""

import importlib.util

import pytest

from tests.helpers import load_example

# sklearn is imported by the example when it loads the data: finding it costs no import here.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (the examples extra)"
)

pai = load_example("pruning_at_init")
QUICK = pai.Config.quick()


@pytest.fixture(scope="module")
def result():
    return pai.run(QUICK, progress=None)


def test_result_shape_and_exact_counts(result):
    comps = list(QUICK.compressions)
    expected = {("at init", m) for m in pai.AT_INIT} | {("after training", m) for m in pai.POST_TRAINING}
    assert set(result.accuracy) == expected
    total = result.total_weights
    assert total == 64 * 128 + 128 * 64 + 64 * 10
    for key, acc in result.accuracy.items():
        assert acc.shape == result.collapsed[key].shape == (len(comps), QUICK.seeds)
        for j, c in enumerate(comps):
            kept = result.kept[key][j]
            if key[1] == "Wanda (per row)":  # every row keeps round(n / c) of its n weights
                amount = 1 - 1 / c
                rows = [(128, 64), (64, 128), (10, 64)]
                want = sum(r * (n - round(amount * n)) for r, n in rows)
            else:
                want = total - round((1 - 1 / c) * total)
            assert (kept == want).all(), (key, c)


def test_layer_collapse_as_the_literature_says(result):
    # Tanaka et al. 2020: SynFlow never collapses a layer; magnitude at init does at high
    # compression (here from 10x: the 128-input layer's init is the smallest).
    assert (result.collapsed[("at init", "SynFlow")] == 0).all()
    assert (result.collapsed[("at init", "magnitude")][-1] > 0).all()
    assert (result.collapsed[("at init", "magnitude")][1] > 0).all()
    # A collapsed network is at chance level.
    assert float(result.accuracy[("at init", "magnitude")][1].mean()) < 0.2


def test_scores_beat_random_at_10x(result):
    j = list(QUICK.compressions).index(10)
    acc = {m: float(result.accuracy[("at init", m)][j].mean()) for m in pai.AT_INIT}
    for method in ("SNIP", "GraSP", "SynFlow"):
        assert acc[method] > acc["random"] + 0.03, acc
    assert float(result.dense_accuracy.mean()) > 0.85
    # At 2x every score-based choice trains close to the dense network.
    for method in ("SNIP", "GraSP", "SynFlow"):
        assert (
            float(result.accuracy[("at init", method)][0].mean()) > float(result.dense_accuracy.mean()) - 0.1
        )


def test_command_line_writes_table_and_plot(result, tmp_path, monkeypatch):
    monkeypatch.setattr(pai, "run", lambda config, progress=None: result)
    png, table = tmp_path / "plot.png", tmp_path / "table.md"
    pai.main(["--quick", "--plot", str(png), "--table", str(table)])
    assert png.stat().st_size > 1000
    text = table.read_text()
    assert text.startswith("| pruned | method | 2x: accuracy") and text.count("\n") == 2 + 8
