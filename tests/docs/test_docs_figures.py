"""Figures in the docs that come from a command in the repo stay what the command prints."""

import runpy

from tests.helpers import ROOT


def test_selection_normalize_table_is_what_examples_normalize_prints():
    script = runpy.run_path(str(ROOT / "examples" / "normalize.py"))
    page = (ROOT / "docs" / "selection.md").read_text()
    indented = "\n".join("  " + line for line in script["table"]().splitlines())
    assert indented in page
    assert "python examples/normalize.py" in page


def test_docs_zoo_table_is_what_benchmarks_zoo_wrote():
    # docs/zoo.md's torchvision table comes from `python -m benchmarks.zoo` (results/zoo.md).
    results = (ROOT / "benchmarks" / "results" / "zoo.md").read_text()
    table = "\n".join(line for line in results.splitlines() if line.startswith("|"))
    docs = (ROOT / "docs" / "zoo.md").read_text()
    assert table and table in docs
    assert "python -m benchmarks.zoo" in docs
