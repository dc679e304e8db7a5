"""docs/sparse_training.md: its Python blocks run in order, as the README's do."""

import pathlib
import re

PAGE = pathlib.Path(__file__).resolve().parent.parent.parent / "docs" / "sparse_training.md"


def test_sparse_training_page_runs_in_order():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace = {"__name__": "docs"}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
