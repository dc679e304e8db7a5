"""Figures in the README that come from a command in the repo stay what the command prints."""

import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_normalize_table_is_what_examples_normalize_prints():
    script = runpy.run_path(str(ROOT / "examples" / "normalize.py"))
    readme = (ROOT / "README.md").read_text()
    indented = "\n".join("  " + line for line in script["table"]().splitlines())
    assert indented in readme
    assert "python examples/normalize.py" in readme
