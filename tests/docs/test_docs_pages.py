"""Every docs page's ```python blocks run, in order, in one namespace per page, as a reader would
paste them. A block the tests cannot run (it needs a GPU or several machines) is preceded by
``<!-- not run: <reason> -->``; the reason is required. A page that starts a process group or
changes process-wide state says ``<!-- tests: own process -->`` and runs in a fresh interpreter
with a hard timeout."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(<!--\s*not run:(?P<why>[^>]*)-->\s*\n)?```python\n(?P<code>.*?)```", re.S)
OWN_PROCESS = "<!-- tests: own process -->"


def blocks(page: pathlib.Path) -> list[str]:
    """The page's runnable blocks (checking that every skipped one says why)."""
    found = []
    for match in BLOCK.finditer(page.read_text()):
        if match["why"] is not None:
            assert match["why"].strip(), f"{page.name}: a block that is not run needs its reason"
            continue
        found.append(match["code"])
    return found


def run_page(page: pathlib.Path) -> None:
    """Run ``page``'s blocks in order (in a fresh interpreter where the page asks for one)."""
    code = blocks(page)
    if OWN_PROCESS in page.read_text():
        program = "import torch\ntorch.set_num_threads(1)\n" + "\n".join(code)
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        done = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        sys.stdout.write(done.stdout)
        return
    torch.manual_seed(0)
    namespace = {"__name__": f"docs_{page.stem}"}
    for i, block in enumerate(code):
        exec(compile(block, f"{page} (block {i + 1})", "exec"), namespace)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_docs_page_code_blocks_run(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    run_page(page)


def test_every_topic_page_has_runnable_code():
    reference = (
        "api.md",
        "benchmarks.md",
        "development.md",
        "experiments.md",
        "install.md",
        "performance.md",
    )
    without = [p.name for p in PAGES if p.name not in reference and not blocks(p)]
    assert without == [], f"topic pages without a runnable example: {without}"


LINK = re.compile(r"\]\((?!https?://|mailto:)(?P<path>[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")


def anchors(page: pathlib.Path) -> set[str]:
    """GitHub's anchors for the page's headings (lower case, punctuation dropped, spaces to -)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    found = set()
    for heading in re.findall(r"^#+ (.*)$", text, flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=["README.md", *[p.name for p in PAGES]])
def test_relative_links_reach_a_file_and_heading(page):
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for match in LINK.finditer(text):
        target = (page.parent / match["path"]).resolve() if match["path"] else page
        missing_heading = (
            target.exists()
            and match["anchor"]
            and target.suffix == ".md"
            and match["anchor"] not in anchors(target)
        )
        if not target.exists() or missing_heading:
            broken.append(match.group(0))
    assert broken == [], f"{page.name}: links to no file or heading: {broken}"


def test_api_reference_is_what_the_docstrings_generate():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import api_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert (ROOT / "docs" / "api.md").read_text() == api_reference.generate(), (
        "docs/api.md is stale: run python scripts/api_reference.py --write"
    )
