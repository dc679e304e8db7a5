"""The structured-speedup example (examples/structured_speedup.py) on its quick configuration.

Checks what does not depend on timing: both compacted models (the module route's ResNet and the
graph route's GraphModule) equal the masked one, parameter and FLOP counts fall as pruning
predicts, fine-tuning recovers accuracy, both routes ran at every batch and image size measured,
GPT-2's compacted model generates the masked model's tokens, and the tables print.
"""

import importlib.util

import pytest

from tests.helpers import load_example

# sklearn is imported by the example when it loads the data: finding it costs no import here.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (the examples extra)"
)

ex = load_example("structured_speedup")


def test_quick_run():
    config = ex.Config.quick()
    rows = ex.run(config, threads=1, progress=None)
    dense, half = rows
    assert half["amount"] == 0.5
    assert half["masked_max_diff"] < 1e-5 and half["graph_max_diff"] < 1e-5
    assert half["same_class"]  # compact returns the example's own ResNet class
    # Half the channels of every prunable group: about a quarter of the FLOPs and parameters
    # (the stem's input and the classifier's outputs stay).
    assert 0.2 < half["flops"] / dense["flops"] < 0.35
    assert 0.2 < half["params"] / dense["params"] < 0.35
    assert dense["acc"] > 60 and half["acc"] > 50
    # Both routes ran (and were timed) at every batch and at the other image size.
    inputs = ["batch 1", "batch 64", f"batch 64, {config.other_size}x{config.other_size}"]
    assert set(half["routes"]) == {"module", "graph"} and set(dense["routes"]) == {"dense"}
    assert all(list(t) == inputs and all(v > 0 for v in t.values()) for t in half["routes"].values())
    text = ex.table(rows, 1, config.batch)
    assert text.count("\n") == 3 and "| 50% |" in text
    routes = ex.route_table(rows, 1)
    assert "| 50% | module / graph |" in routes and "batch 64, 12x12" in routes


def test_gpt2_check_quick():
    pytest.importorskip("transformers")
    result = ex.gpt2_check(layers=2, width=64, heads=4, vocab=128, tokens=8, repeats=1, progress=None)
    assert result["max_diff"] < 1e-5 and result["graph_max_diff"] < 1e-5
    assert result["prunable"] == 5  # 2 x (heads, MLP) + the residual stream (inexact)
    assert result["same_class"]
    assert len(result["small_tokens"]) == 8 and result["small_tokens"] == result["masked_tokens"]
    assert "cannot describe" in result["config_note"]  # GPT2Config cannot say "fewer heads"
