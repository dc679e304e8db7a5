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


# Seconds a page run in its own process may take after importing torch: its interpreter prints every
# thread's stack and exits at TIMEOUT (faulthandler), and the test gives up at TIMEOUT + 60 s.
TIMEOUT = 240

# What a page run in its own process does after its blocks: it must have ended its process group,
# and it leaves without finalizing the interpreter, since torch keeps gloo's threads running after
# destroy_process_group once a DTensor was made, and the teardown under them can abort the process
# ("terminate called without an active exception"; tests/distributed/launch.py does the same).
EPILOGUE = """
import torch.distributed as _dist
if _dist.is_available() and _dist.is_initialized():
    raise AssertionError("{page} ends with its process group initialized: call dist.destroy_process_group()")
faulthandler.cancel_dump_traceback_later()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def own_process_program(page: pathlib.Path, code: list[str]) -> str:
    """The program that runs ``page``'s blocks in a fresh interpreter, each compiled under the page's
    name and block number (so a traceback names them), a hang reported with every thread's stack."""
    return "\n".join(
        [
            "import faulthandler, os, sys",
            "import torch",
            "torch.set_num_threads(1)",
            f"faulthandler.dump_traceback_later({TIMEOUT}, exit=True)",
            "namespace = {'__name__': '__main__'}",
            f"for i, block in enumerate({code!r}):",
            f"    exec(compile(block, f'{page.name} (block {{i + 1}})', 'exec'), namespace)",
            EPILOGUE.format(page=page.name),
        ]
    )


def run_page(page: pathlib.Path) -> None:
    """Run ``page``'s blocks in order (in a fresh interpreter where the page asks for one)."""
    code = blocks(page)
    if OWN_PROCESS in page.read_text():
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        try:
            done = subprocess.run(
                [sys.executable, "-c", own_process_program(page, code)],
                capture_output=True,
                text=True,
                timeout=TIMEOUT + 60,
                env=env,
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired as hung:
            output = [
                o.decode(errors="replace") if isinstance(o, bytes) else o or ""
                for o in (hung.stdout, hung.stderr)
            ]
            raise AssertionError(
                f"{page.name}: its own process did not end within {TIMEOUT + 60} s, nor print its stacks "
                f"at {TIMEOUT} s; its output:\n" + "\n".join(output)
            ) from None
        assert done.returncode == 0, (
            f"{page.name}: its own process exited with {done.returncode} (a hang at {TIMEOUT} s prints "
            f"every thread's stack below):\n" + done.stdout[-3000:] + done.stderr[-6000:]
        )
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


def test_an_own_process_page_must_end_its_process_group(tmp_path):
    page = tmp_path / "group.md"
    page.write_text(
        f"{OWN_PROCESS}\n```python\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n```\n"
    )
    with pytest.raises(AssertionError, match=r"group\.md ends with its process group initialized"):
        run_page(page)


def test_an_own_process_page_that_hangs_shows_where(tmp_path, monkeypatch):
    # The timer starts after import torch; the page reaches its sleep within milliseconds.
    monkeypatch.setattr(sys.modules[__name__], "TIMEOUT", 2)
    page = tmp_path / "hang.md"
    page.write_text(
        f"{OWN_PROCESS}\n```python\nimport time\ndef waits():\n    time.sleep(600)\nwaits()\n```\n"
    )
    with pytest.raises(AssertionError, match=r"hang\.md: its own process exited with 1") as error:
        run_page(page)
    assert 'File "hang.md (block 1)", line 3 in waits' in str(error.value)


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
