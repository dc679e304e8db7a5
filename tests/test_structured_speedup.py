"""The structured-speedup example (examples/structured_speedup.py) on its quick configuration.

Checks what does not depend on timing: the compact model equals the masked one, parameter and
FLOP counts fall as pruning predicts, fine-tuning recovers accuracy, and the table prints.
"""

import importlib.util
import pathlib
import sys

import pytest

pytest.importorskip("sklearn")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "structured_speedup.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("structured_speedup", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


ex = _load_example()


def test_quick_run():
    rows = ex.run(ex.Config.quick(), threads=1, progress=None)
    dense, half = rows
    assert half["amount"] == 0.5
    assert half["masked_max_diff"] < 1e-5
    # Half the channels of every prunable group: about a quarter of the FLOPs and parameters
    # (the stem's input and the classifier's outputs stay).
    assert 0.2 < half["flops"] / dense["flops"] < 0.35
    assert 0.2 < half["params"] / dense["params"] < 0.35
    assert dense["acc"] > 60 and half["acc"] > 50
    text = ex.table(rows, 1, ex.Config.quick().batch)
    assert text.count("\n") == 3 and "| 50% |" in text


def test_gpt2_check_quick():
    pytest.importorskip("transformers")
    result = ex.gpt2_check(layers=2, width=64, heads=4, vocab=128, progress=None)
    assert result["max_diff"] < 1e-5
    assert result["prunable"] == 5  # 2 x (heads, MLP) + the residual stream (inexact)
