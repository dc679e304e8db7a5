"""Every figure in README.md and docs/*.md names the committed results file it comes from, and equals
a number of that file at the precision the text gives.

A figure is a number with a unit of time, speed-up or memory (``4.5 s``, ``63.1 ms``, ``13.3x``,
``41-49x``, ``425 MiB``; not a shape such as ``2 x 256``, nor a target such as ``>= 10x``)
outside code. Its source is the results file(s) that its paragraph, list item or table names
(``benchmarks/results/NAME.md`` or ``.json``, ``docs/NAME.json``), or else the paragraph before
a table, or else the last paragraph of the same section (or of a section above it) that named
one. Each figure must equal a number of those files rounded to the figure's decimals (``41x``
stands for 41.4x; ``1.5 s`` for 1.51). Tables whose rows a command prints are checked row by row
below as well.
"""

from __future__ import annotations

import json
import pathlib
import re
import runpy
import sys

import pytest

from tests.helpers import ROOT

# Pages whose figures their topic's own tests check against their results (and the tests):
# tests/posttrain/test_posttrain_docs.py and tests/sparse/test_sparse_docs.py.
CHECKED_BY_THEIR_TOPIC = {
    "posttrain.md": ROOT / "tests" / "posttrain" / "test_posttrain_docs.py",
    "sparse.md": ROOT / "tests" / "sparse" / "test_sparse_docs.py",
}
PAGES = [
    ROOT / "README.md",
    *sorted(
        p for p in (ROOT / "docs").glob("*.md") if p.name != "api.md" and p.name not in CHECKED_BY_THEIR_TOPIC
    ),
]


def normalize_table() -> str:
    """The table ``python examples/normalize.py`` prints (docs/selection.md shows it, indented)."""
    return runpy.run_path(str(ROOT / "examples" / "normalize.py"))["table"]()


# Blocks that are a command's output, checked against the command itself below.
COMMAND_OUTPUT = {"selection.md": normalize_table}

# A results file as the docs name it: a path under benchmarks/results/, or a docs/*.json.
SOURCE = re.compile(r"(?:benchmarks/)?results/[\w.-]+\.(?:md|json)|(?:docs/)?\b[\w-]+\.json\b")
NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?<![\w.^/-])(?P<first>{NUMBER})(?:\s?[-\u2013]\s?(?P<last>{NUMBER}))?\s?"
    r"(?P<unit>ms|µs|us|s|min|x(?!\s?\d)|GiB|MiB|KiB|GB|MB)(?![\w^])"
)


def source_path(name: str) -> pathlib.Path:
    """The file a page's mention of a results file names (a bare name is looked up in
    benchmarks/results/, then in docs/)."""
    if name.startswith("results/"):
        return ROOT / "benchmarks" / name
    if name.startswith(("benchmarks/", "docs/")):
        return ROOT / name
    results = ROOT / "benchmarks" / "results" / name
    return results if results.exists() else ROOT / "docs" / name


def without_code_blocks(text: str) -> str:
    """``text`` without its code blocks and HTML comments."""
    return re.sub(r"```.*?```|<!--.*?-->", "", text, flags=re.S)


def prose(text: str) -> str:
    """The text without its code blocks, HTML comments and inline code."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def blocks(text: str) -> list[tuple[str, str]]:
    """The page's paragraphs, list items and tables, each with its kind ("table", "heading" or
    "text"), in order. Inline code is kept (a command names its results file there)."""
    text = without_code_blocks(text)
    found: list[tuple[str, str]] = []
    for chunk in re.split(r"\n\s*\n", text):
        lines = chunk.strip("\n").splitlines()
        current: list[str] = []
        kind = ""
        for line in lines:
            line_kind = (
                "table" if line.lstrip().startswith("|") else "heading" if line.startswith("#") else "text"
            )
            starts_item = re.match(r"\s{0,3}([-*]|\d+\.) ", line) is not None
            if current and (line_kind != kind or line_kind == "heading" or (starts_item and kind == "text")):
                found.append((kind, "\n".join(current)))
                current = []
            current.append(line)
            kind = line_kind
        if current:
            found.append((kind, "\n".join(current)))
    return found


# A number after these is a limit (a target), not a measurement.
LIMIT = re.compile(r"(?:[<>=≤≥]|\bwithin|\bat most|\bunder|\btarget:?|\blimit:?)\s*~?$")
BUDGET = re.compile(r"\s+(?:histogram\s+)?budget")


def figures(kind: str, block: str) -> list[str]:
    """The figures of a block: each number with a unit (both ends of a range), outside a table's
    header row (its cells are labels) and targets (``>= 10x``, ``within 1.15x``, ``target: 5x``)."""
    if kind == "table":
        block = "\n".join(block.splitlines()[1:])
    text = prose(block)
    found = []
    for match in FIGURE.finditer(text):
        if LIMIT.search(text[max(0, match.start() - 12) : match.start()]) or BUDGET.match(text, match.end()):
            continue
        found.append(match["first"])
        if match["last"]:
            found.append(match["last"])
    return found


def file_numbers(path: pathlib.Path) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(NUMBER, path.read_text())]


def matches(figure: str, numbers: list[float]) -> bool:
    """Whether ``figure`` equals one of ``numbers`` rounded to the figure's decimals."""
    value = float(figure.replace(",", ""))
    decimals = len(figure.partition(".")[2])
    half = 0.5 * 10.0**-decimals + 1e-9
    return any(abs(n - value) <= half for n in numbers)


def sourced_figures(page: pathlib.Path) -> list[tuple[str, list[pathlib.Path], list[str]]]:
    """Each block of ``page`` that holds figures, the files it cites (see the module docstring)
    and its figures."""
    found = []
    # The files named last in each open section, by heading level: a section's files stand for
    # its subsections too, until one of them names its own.
    named_by_level: dict[int, list[str]] = {0: []}
    level = 0
    previous: tuple[str, str] = ("", "")
    for kind, block in blocks(page.read_text()):
        if kind == "heading":
            level = len(block) - len(block.lstrip("#"))
            named_by_level = {k: v for k, v in named_by_level.items() if k < level}
            named_by_level[level] = []
            previous = (kind, block)
            continue
        named = SOURCE.findall(block)
        if kind == "table" and not named and previous[0] == "text":
            named = SOURCE.findall(previous[1])
        if named:
            named_by_level[level] = named
        sources = named or next((v for _, v in sorted(named_by_level.items(), reverse=True) if v), [])
        found.append((block, [source_path(s) for s in dict.fromkeys(sources)], figures(kind, block)))
        previous = (kind, block)
    return [entry for entry in found if entry[2]]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_figure_names_its_results_file_and_equals_it(page):
    problems = []
    printed = COMMAND_OUTPUT[page.name]() if page.name in COMMAND_OUTPUT else ""
    for block, sources, found in sourced_figures(page):
        if printed and all(line.strip() in printed for line in block.splitlines()):
            continue
        first_line = block.strip().splitlines()[0][:90]
        if not sources:
            problems.append(f"figures {found} name no results file: {first_line!r}")
            continue
        missing = [str(s.relative_to(ROOT)) for s in sources if not s.exists()]
        if missing:
            problems.append(f"names results files that do not exist, {missing}: {first_line!r}")
            continue
        numbers = [n for s in sources for n in file_numbers(s)]
        wrong = [f for f in found if not matches(f, numbers)]
        if wrong:
            cited = [str(s.relative_to(ROOT)) for s in sources]
            problems.append(f"figures {wrong} are in none of {cited}: {first_line!r}")
    assert problems == [], f"{page.name}:\n" + "\n".join(problems)


def test_a_figure_matches_only_at_its_precision():
    assert matches("41", [41.4]) and matches("1.5", [1.51]) and matches("1,371.0", [1371.0])
    assert not matches("41", [41.6]) and not matches("1.50", [1.51]) and not matches("6.855", [6.85])


def test_a_figure_without_a_results_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A\n\nRuns in 4.5 s (`benchmarks/results/cpu.md`).\n\nAnd 3x faster.\n\n"
        "## A.1\n\nIn 5 ms (target: 4 ms, at most 6 ms).\n\n"
        "# B\n\nTakes 2 min.\n\n| 3x | b |\n|---|---|\n| 1 | 2 ms |\n"
    )
    found = sourced_figures(page)
    assert [(f, [s.name for s in sources]) for _, sources, f in found] == [
        (["4.5"], ["cpu.md"]),
        (["3"], ["cpu.md"]),
        (["5"], ["cpu.md"]),
        (["2"], []),
        (["2"], []),
    ]


def test_pages_left_to_their_topic_have_those_tests():
    assert all(test.exists() for test in CHECKED_BY_THEIR_TOPIC.values())


def test_selection_normalize_table_is_what_examples_normalize_prints():
    page = (ROOT / "docs" / "selection.md").read_text()
    indented = "\n".join("  " + line for line in normalize_table().splitlines())
    assert indented in page
    assert "python examples/normalize.py" in page


def _table_rows(path: pathlib.Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if re.match(r"\|[^-]", line)]


@pytest.mark.parametrize(
    ("page", "results", "command"),
    [
        ("zoo.md", "zoo.md", "python -m benchmarks.zoo"),
        ("performance.md", "many_leaves.md", "python -m benchmarks.many_leaves"),
        ("benchmarks.md", "many_leaves.md", "python -m benchmarks.many_leaves"),
        ("compat.md", "compat_overhead.md", "python benchmarks/compat_overhead.py"),
        ("experiments.md", "lottery.md", "python examples/lottery_ticket.py"),
        ("experiments.md", "pruning_at_init.md", "python examples/pruning_at_init.py"),
        ("sparse_training.md", "sparse_training_example.md", "python examples/sparse_training.py"),
        ("structure.md", "structured_speedup.md", "python examples/structured_speedup.py"),
    ],
)
def test_docs_tables_are_the_rows_their_command_wrote(page, results, command):
    # The rows of a committed table appear in the page as the command printed them, and the page
    # names the command.
    rows = _table_rows(ROOT / "benchmarks" / "results" / results)
    text = (ROOT / "docs" / page).read_text()
    assert rows and all(row in text for row in rows), [row for row in rows if row not in text]
    assert command in text


def test_recorded_results_state_their_conditions():
    # Files written by `python -m benchmarks.record` keep the command, CPU, load and commit.
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        text = path.read_text()
        if text.startswith("# ") and "\nCommand: `" in text:
            assert re.search(
                r"CPU: .+, \d+ CPUs \(lscpu\); load average \(1 min\) while it ran [\d.]+-[\d.]+;", text
            )
            assert re.search(r"; commit [0-9a-f]{7,}", text), path.name


def test_json_sources_parse():
    for path in [*(ROOT / "benchmarks" / "results").glob("*.json"), *(ROOT / "docs").glob("*.json")]:
        json.loads(path.read_text())


def test_stated_test_counts_are_the_recorded_runs():
    # Test counts have no unit, so the figure check above does not read them: the zoo page's and
    # the README's counts are those of the runs their results files record.
    zoo = (ROOT / "benchmarks" / "results" / "zoo_tests.md").read_text()
    passed, skipped = re.search(r"(\d+) passed, (\d+) skipped", zoo).groups()
    page = (ROOT / "docs" / "zoo.md").read_text()
    assert f"{int(passed) + int(skipped)} tests" in page and f"{passed} pass and {skipped} skip" in page
    suite = (ROOT / "benchmarks" / "results" / "suite.md").read_text()
    passed, skipped = re.search(r"([\d,]+) passed, ([\d,]+) skipped", suite).groups()
    readme = (ROOT / "README.md").read_text()
    assert f"({passed} passed;" in readme and f"skip, {skipped})" in readme


def test_record_writes_the_output_and_its_conditions(tmp_path):
    # `python -m benchmarks.record` is how the results files above that no benchmark writes are made.
    from benchmarks import record

    out = tmp_path / "r.md"
    assert record.main([str(out), "--title", "T", "--", sys.executable, "-c", "print('hello 4.5 s')"]) == 0
    text = out.read_text()
    assert text.startswith("# T\n") and "hello 4.5 s" in text and "(exit status 0, wall time" in text
    assert re.search(r"CPU: .+, \d+ CPUs \(lscpu\); load average \(1 min\) while it ran [\d.]+-[\d.]+;", text)
    with pytest.raises(SystemExit):
        record.main([str(out)])  # no command after --
