"""benchmarks/suite_timeline.py: the plugin's hooks write one line per test event per worker, and
the summary sums each file's wall and CPU time and counts its tests."""

import json

from benchmarks import suite_timeline


def test_hooks_record_and_the_summary_sums_by_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FPRUNE_TIMELINE", str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setattr(suite_timeline, "_OUT", [])
    clock = iter([100.0, 101.0, 103.0, 103.0, 104.0])
    cpu = iter([0.0, 1.5, 1.5, 2.0])
    monkeypatch.setattr(suite_timeline.time, "time", lambda: next(clock))
    monkeypatch.setattr(suite_timeline.time, "process_time", lambda: next(cpu))
    suite_timeline.pytest_sessionstart(None)
    for nodeid in ("tests/a/test_x.py::test_one", "tests/a/test_x.py::test_two"):
        suite_timeline.pytest_runtest_logstart(nodeid, None)
        suite_timeline.pytest_runtest_logfinish(nodeid, None)
    suite_timeline._OUT[0].close()
    events = [json.loads(line) for line in (tmp_path / "gw0.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "test", "done", "test", "done"]
    text = suite_timeline.summary(tmp_path)
    assert "| tests/a/test_x.py | 3.0 | 2.0 | 2 |" in text  # (103-101) + (104-103) s; 1.5 + 0.5 s CPU
    assert "| gw0 | 1.0 | 4.0 | 2 |" in text


def test_without_the_folder_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("FPRUNE_TIMELINE", raising=False)
    monkeypatch.setattr(suite_timeline, "_OUT", [])
    suite_timeline.pytest_runtest_logstart("t::x", None)
    assert suite_timeline._OUT == [] and not list(tmp_path.iterdir())
