"""docs/sparse.md's tables are the benchmark's, and the benchmark's quick mode works (its code
blocks run in tests/docs)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sparse.md"


def _table_rows(text: str, first_cell: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"| {first_cell}")]


def test_docs_tables_come_from_the_recorded_results():
    doc = DOC.read_text()
    results = (ROOT / "benchmarks" / "results" / "sparse.md").read_text()
    forward = [line for line in results.splitlines() if re.match(r"\| \d+% \| \d+ \|", line)]
    assert forward and all(line in doc for line in forward)
    readme = [
        line for line in (ROOT / "README.md").read_text().splitlines() if re.match(r"\| \d+% \| \d+ \|", line)
    ]
    assert readme and all(line in forward for line in readme)  # the README's rows are recorded ones
    crossover = (ROOT / "benchmarks" / "results" / "sparse_crossover.md").read_text()
    table = re.search(r"CROSSOVER = (\{.*\})", crossover).group(1)
    from fprune.sparse import _auto

    recorded = {
        int(t): {int(size): {int(r): v for r, v in rows.items()} for size, rows in classes.items()}
        for t, classes in json.loads(table).items()
    }
    assert recorded == _auto.CROSSOVER


@pytest.mark.parametrize("extra", [[], ["--crossover"], ["--kernels"], ["--decode"], ["--auto"]])
def test_benchmark_quick_mode_writes_its_tables(tmp_path, capsys, extra):
    out = tmp_path / "r.json"
    argv = ["--quick", "--no-end-to-end", "--json", str(out), *extra]
    if extra == ["--crossover"]:  # the command line, in its own process
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.sparse", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        stdout = proc.stdout
    else:  # the other sections in this process (torch's thread count is restored after each)
        from benchmarks import sparse

        threads = torch.get_num_threads()
        assert sparse.main(argv) == 0
        assert torch.get_num_threads() == threads
        stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["machine"]["torch_threads"] >= 1
    if extra == ["--crossover"]:
        assert report["crossover"] and "CROSSOVER = " in stdout
    elif extra == ["--kernels"]:
        assert report["kernels"] and "| `csr @ x.T` |" in stdout
    elif extra == ["--decode"]:
        assert {r["model"] for r in report["decode"]} == {"GPT-2 (2 x 128)", "Llama (2 x 128)"}
        assert all(r["layouts"]["csr"] == {"csr": 8 if "GPT" in r["model"] else 14} for r in report["decode"])
        assert "| GPT-2 (2 x 128) |" in stdout
    elif extra == ["--auto"]:
        assert {c["choice"] for c in report["auto"]} <= {"csr", "dense"}
        assert "auto at most 1.05x dense" in stdout
    else:
        assert {r["sparsity"] for r in report["forward"]} == {0.5, 0.95}
        assert all(r["max_rel_diff"] < 1e-5 for r in report["forward"])
        assert all(r["round_trip_equal"] for r in report["disk"])
        assert "| 95% | 8 |" in stdout


def test_the_runner_hands_only_sparse_to_its_module(monkeypatch):
    from benchmarks import run

    calls = []
    monkeypatch.setattr(run.subprocess, "call", lambda argv, cwd: calls.append(argv) or 0)
    assert run.main(["--only", "sparse", "--quick", "--threads", "1", "--device", "cuda"]) == 0
    assert calls[0][1:] == ["-m", "benchmarks.sparse", "--quick", "--threads", "1", "--device", "cuda"]


def test_docs_decode_and_auto_figures_come_from_the_recorded_results():
    doc = DOC.read_text()
    decode = (ROOT / "benchmarks" / "results" / "sparse_decode.md").read_text()
    rows = [line for line in decode.splitlines() if line.startswith(("| GPT-2", "| Llama"))]
    assert rows and all(line in doc for line in rows)
    auto = (ROOT / "benchmarks" / "results" / "sparse_auto.md").read_text()
    verdicts = ("At 1 thread, auto at most", "At 2 threads, auto at most")
    worst = [line for line in auto.splitlines() if line.startswith(verdicts)]
    assert len(worst) == 2 and all(line in doc for line in worst)


def test_docs_bfloat16_decode_table_is_the_recorded_one():
    results = (ROOT / "benchmarks" / "results" / "sparse_decode_bfloat16.md").read_text()
    table = "\n".join(line for line in results.splitlines() if line.startswith("|"))
    doc = DOC.read_text()
    assert table and table in doc
    assert "python -m benchmarks.sparse --decode --dtype bfloat16 --crossover-threads 1 2" in doc
