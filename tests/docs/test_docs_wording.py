"""README.md, docs/ and fprune/ speak of the library: not of where or when it was built (the
machine, its locks, who worked beside whom, what was measured again after what). Measurement
conditions live in the results files under benchmarks/results/."""

from __future__ import annotations

import re

from tests.helpers import ROOT

# The phrases the developers' stop hook looks for, and the project's other words for the same.
HISTORY = re.compile(
    r"\bissue #?[0-9]+|\btraps\b|this round|review round|other sessions|been lent|"
    r"this (project's )?(shared )?(2-core )?machine|measured again after|left for later|"
    r"not yet written|shared-machine|\bflock\b|lock file|heavy\.lock|\bsessions?\b|no GPU (has been )?lent",
    re.IGNORECASE,
)

FILES = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "fprune").rglob("*.py"),
    ]
)


def test_docs_and_code_do_not_narrate_where_or_when_they_were_written():
    hits = []
    for path in FILES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert hits == [], "say what the code does, not where or when it was built:\n" + "\n".join(hits)


def test_the_phrases_are_found():
    for line in (
        "measured on this 2-core machine",
        "run under the shared-machine lock",
        "No GPU has been lent to this project",
        "next to other sessions' work",
        "`flock /tmp/heavy.lock python -m benchmarks`",
        "GroupNorm is left for later",
        "The byte counts were measured again after the change",
    ):
        assert HISTORY.search(line), line
    assert not HISTORY.search("timed on the running CPU at conversion")
