"""The benchmark runner's --quick mode runs and prints well-formed tables and JSON (no timings asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ["### 1-2. Global", "### 3. Local", "### 4. Training", "### 5. Ensemble"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--json", str(out / "r.json"), "--markdown", str(out / "r.md")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads((out / "r.json").read_text()), (out / "r.md").read_text()


def tables(markdown):
    """Each markdown table as a list of rows, each row a list of cells."""
    found, current = [], None
    for line in markdown.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                found.append(current)
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            current = None
    return found


def test_quick_run_writes_every_section_as_a_well_formed_table(quick_run):
    stdout, _, markdown = quick_run
    assert markdown.strip() in stdout
    for header in SECTIONS:
        assert header in markdown
    found = tables(markdown)
    assert len(found) == len(SECTIONS)
    for table in found:
        header, rule, *rows = table
        assert all(set(cell) <= set("-:") for cell in rule) and len(rule) == len(header)
        assert rows, f"table {header} has no rows"
        assert all(len(row) == len(header) for row in rows)


def test_quick_run_json_has_the_machine_and_a_result_for_every_configuration(quick_run):
    stdout, report, _ = quick_run
    assert report["mode"] == "quick"
    for key in ("cpu", "cores", "torch", "torch_threads", "python", "date_utc"):
        assert report["machine"][key] not in (None, "")
    cases = {r["config"]["case"] for r in report["records"]}
    assert cases == {"floor", "global", "local", "structured", "training", "ensemble"}
    for record in report["records"]:
        assert "error" not in record, record
        assert "result" in record or "skipped" in record
    # The same JSON is printed after the tables.
    assert json.loads(stdout.split("```json\n")[1].split("\n```")[0]) == report


def test_quick_run_counts_are_exact_and_memory_is_reported(quick_run):
    _, report, _ = quick_run
    for record in report["records"]:
        config, result = record["config"], record.get("result", {})
        if config["case"] == "global" and result.get("available", True):
            for amount, entry in result["amounts"].items():
                assert entry["pruned"] == round(float(amount) * result["weights"])
                assert entry["median_s"] > 0
            assert result["extra_bytes_per_weight"] >= 0
