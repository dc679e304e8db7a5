"""docs/inputs.md: its python blocks run, in order, as written."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "inputs.md"


@pytest.mark.filterwarnings("ignore::fprune.select.LayerCollapseWarning")
def test_the_page_runs_in_order():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace = {"__name__": "docs_inputs"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
