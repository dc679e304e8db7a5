"""docs/posttrain.md's results table is the example's (its code blocks run in tests/docs)."""

from __future__ import annotations

import json
import pathlib
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "posttrain.md"


def test_results_table_is_what_the_example_wrote():
    example = runpy.run_path(str(ROOT / "examples" / "posttrain_lm.py"))
    report = json.loads((ROOT / "docs" / "posttrain.json").read_text())
    assert not report["quick"]
    assert example["table"](report) in PAGE.read_text()
    assert example["table"](report) in (ROOT / "README.md").read_text()  # its summary
    assert (ROOT / "docs" / "posttrain.png").exists()
    assert (
        "python examples/posttrain_lm.py --json docs/posttrain.json --plot docs/posttrain.png"
        in PAGE.read_text()
    )


def test_example_quick_runs():
    pytest.importorskip("transformers")
    example = runpy.run_path(str(ROOT / "examples" / "posttrain_lm.py"))
    report = example["run"](quick=True, log=lambda s: None)
    results = report["results"]
    assert len(results) == 1 + 4 * 5 and all(v > 1 for v in results.values())
