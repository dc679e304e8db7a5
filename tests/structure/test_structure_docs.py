"""docs/structure.md: its Python blocks run, in order, in one namespace."""

import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "structure.md"


def test_structure_page_examples_run_in_order(capsys):
    pytest.importorskip("transformers")
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace = {"__name__": "structure_docs"}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
    out = capsys.readouterr().out
    assert "group 0.weight:0: 16 channels, prunable, exact" in out
    assert "fails on the example inputs in module 'fc2' (Linear), called from the top module" in out
