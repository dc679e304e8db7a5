"""The benchmark runner's --quick mode runs and prints well-formed tables and JSON (no timings asserted)."""

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

SECTIONS = ["### 1-2. Global", "### 3. Local", "### 4. Training", "### 5. Ensemble"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--json",
            str(out / "r.json"),
            "--markdown",
            str(out / "r.md"),
        ],
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


def test_a_full_run_measures_each_configuration_in_a_fresh_worker_process():
    # --quick runs its configurations in the runner's process; the full and --targets runs start
    # one benchmarks.worker per configuration (here a --targets memory one, with its hash seed).
    from benchmarks import run

    config = {
        "case": "memory",
        "method": "global",
        "impl": "fprune",
        "model": "1M",
        "amounts": [0.5],
        "repeats": 1,
        "hash_seed": 3,
    }
    record = run.run_config(config, threads=1, timeout=300)
    assert "error" not in record, record
    assert record["config"] == dict(config, threads=1) and record["wall_s"] > 0
    result = record["result"]
    assert result["threads"] == 1
    assert result["amounts"]["0.5"]["pruned"] == round(0.5 * result["weights"])
    assert result["extra_bytes_per_weight"] >= 0 and result["baseline_rss"] > 0


def test_compare_measures_each_case_in_process_with_exact_counts_and_operator_counts():
    from benchmarks import compare

    for case in compare.CASES:
        out = compare.measure(case, "tiny", 0.5, repeats=1, threads=1, profile=True)
        assert out["cpu_s"] > 0 and out["wall_s"] > 0 and out["threads"] == 1
        assert out["ops"] and all(op.startswith("aten::") for op in out["ops"])
        if case != "structured":  # structured prunes whole rows: the count is rows x row length
            weights = sum(
                m.weight.numel()
                for _, m in compare._load_models().weight_modules(
                    compare._load_models().transformer_like("tiny")
                )
            )
            assert out["pruned"] == round(0.5 * weights)


@pytest.mark.skipif(
    not (ROOT / ".git").exists(), reason="benchmarks.compare reads revisions with git: needs a git checkout"
)
def test_compare_end_to_end_on_the_working_tree_twice_reports_no_operator_difference(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.compare",
            ".",
            ".",
            "--size",
            "tiny",
            "--rounds",
            "1",
            "--repeats",
            "1",
            "--json",
            str(tmp_path / "c.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    entries = report["revisions"]
    assert [e["rev"] for e in entries] == [".", "."]  # a revision given twice is measured twice
    assert entries[0]["ops"] == entries[1]["ops"] and entries[0]["pruned"] == entries[1]["pruned"]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| .")]
    assert len(rows) == 2 and all(row.endswith("| none |") for row in rows)


def test_compare_refuses_fewer_than_two_revisions():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "at least two revisions" in proc.stderr


def test_memory_seeds_prints_a_row_per_seed():
    # The command behind docs/benchmarks.md's hash-seed memory figures runs (tiny model, no timing).
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.memory_seeds",
            "--size",
            "tiny",
            "--seeds",
            "0",
            "1",
            "--threads",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["0", "1"]


def test_markdown_leaves_out_the_sections_a_run_did_not_measure():
    # `--only ensemble` (or any subset): the other sections' headers and empty tables are not written.
    from benchmarks import run

    machine = {
        "cpu": "cpu",
        "cores": 2,
        "memory_gib": 1,
        "torch": "t",
        "python": "p",
        "cuda": None,
        "git_commit": "abc",
        "date_utc": "now",
    }
    record = {"config": {"case": "ensemble", "batch": 64}, "error": "failed"}
    report = {"machine": machine, "mode": "full", "threads": 1, "load_min": 0.0, "load_max": 0.0}
    text = run.markdown({**report, "records": [record]})
    assert "### 5. Ensemble" in text and "| 64 | failed |" in text
    assert "### 1-2." not in text and "### 3." not in text and "### 4." not in text
    assert "### 5. Ensemble" not in run.markdown({**report, "records": []})
