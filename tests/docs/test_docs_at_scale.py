"""docs/posttrain.md's "At scale" figures are the committed results files' (and their commands')."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT

RESULTS = ROOT / "benchmarks" / "results"


def _section() -> str:
    page = (ROOT / "docs" / "posttrain.md").read_text()
    assert "\n## At scale\n" in page
    return page.split("\n## At scale\n", 1)[1]


def _table(name: str) -> list[str]:
    return [line for line in (RESULTS / name).read_text().splitlines() if line.startswith("|")]


def test_stream_table_and_summaries_are_the_results():
    from benchmarks.posttrain_stream import markdown, summary

    section = _section()
    record = json.loads((RESULTS / "posttrain_stream.json").read_text())
    assert (RESULTS / "posttrain_stream.md").read_text() == markdown(record) + "\n"
    table = _table("posttrain_stream.md")
    assert len(table) >= 3 and "\n".join(table) in section
    runs = [r for r in record["runs"] if r["shape"] == "13b"]
    assert {r["method"] for r in runs} == {"wanda", "sparsegpt"}
    for run in runs:
        assert f"* {summary(run)}" in section
        assert run["peak_rss_anon"] > 0 and run["blocks_done"] >= 1
    assert "python -m benchmarks.posttrain_stream --shape 13b" in section


def test_solve_tables_are_the_results():
    from benchmarks.solve_efficiency import markdown

    section = _section()
    for name in ("solve_efficiency", "solve_efficiency_baseline"):
        record = json.loads((RESULTS / f"{name}.json").read_text())
        assert (RESULTS / f"{name}.md").read_text() == markdown(record) + "\n"
        table = _table(f"{name}.md")
        if name.endswith("baseline"):  # its comparison table, the one the page shows
            table = table[next(i for i, line in enumerate(table) if "| baseline commit |" in line) :]
        rows = [line for line in table if not line.startswith(("| layer", "|---"))]
        assert rows and all(row in section for row in rows)
    block = next(
        line
        for line in (RESULTS / "solve_efficiency.md").read_text().splitlines()
        if line.startswith("One 13B block")
    )
    assert block in section
    assert "python -m benchmarks.solve_efficiency" in section


def test_gpu_estimate_is_the_operation_count():
    from benchmarks.solve_efficiency import GPU_FLOPS, flops, gpu_estimate_table, model_flops

    assert gpu_estimate_table() in _section()
    assert GPU_FLOPS == 50e12 and "50 TFLOP/s" in _section()
    # The count against a plain one: 13B's layers, their solves summed over the 40 blocks.
    h, inter = 5120, 13824
    shapes = [(h, h)] * 4 + [(inter, h)] * 2 + [(h, inter)]
    plain = 40 * sum(2 * c**3 / 3 + r * c * c + 3 * r * c + c for r, c in shapes)
    assert model_flops("13B")["solve"] == pytest.approx(plain, rel=1e-9)
    assert sum(flops(8, 256, blocksize=100).values()) == pytest.approx(
        2 * 256**3 / 3 + 8 * 256 * 256 + 3 * 8 * 256 + 256
    )


def test_gpt2_speed_table_is_the_results():
    from benchmarks.posttrain import markdown

    record = json.loads((RESULTS / "posttrain.json").read_text())
    assert (RESULTS / "posttrain.md").read_text().strip() == markdown(record).strip()
    page = (ROOT / "docs" / "posttrain.md").read_text()
    section = page.split("\n## Speed and memory: GPT-2 124M\n", 1)[1].split("\n## ", 1)[0]
    assert "\n".join(_table("posttrain.md")) in section
    assert f"load of {record['load_before']:.1f}-{record['load_after']:.1f}" in section
