"""The README's examples run, its commands stay what CI runs, and the demo does what it says."""

import re
import runpy
import sys
import warnings

import torch

import fprune
from fprune.select import LayerCollapseWarning
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_readme_python_examples_run_in_order():
    namespace = {"__name__": "readme"}
    blocks = _blocks("python")
    assert len(blocks) >= 2  # the quick start and the compat example
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerCollapseWarning)
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)


def test_readme_quick_start_prunes_no_layer_whole_at_any_seed(capsys):
    # What the quick start's prose says: no LayerCollapseWarning, the output layer at its 10%
    # floor (13 of 128), exactly 80% then 90% of the 640 weights pruned.
    quick_start = compile(_blocks("python")[0], "README.md (quick start)", "exec")
    for seed in range(10):
        torch.manual_seed(seed)
        namespace = {"__name__": "readme"}
        with warnings.catch_warnings():
            warnings.simplefilter("error", LayerCollapseWarning)
            exec(quick_start, namespace)
        masks = namespace["masks"]
        assert int(masks["2.weight"].sum()) == 13, seed
        assert sum(int((~masks[k]).sum()) for k in ("0.weight", "2.weight")) == 576, seed
        assert all(masks[k].all() for k in ("0.bias", "2.bias"))
    assert "| 2.weight | (4, 32) | 13 | 115 | 89.84% |" in capsys.readouterr().out


def test_ci_runs_the_readme_test_command():
    commands = [b.strip() for b in _blocks("bash")]
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()
    assert any("torch==2.13.0" in c and "examples/" in c for c in commands), "the main job command"
    for command in (c for c in commands if "pip install" in c):
        assert command.index("torch==2.13.0") < command.index("-e "), "torch must be installed first"


def test_demo_prints_tables_and_runs_masked_call(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["demo.py"])
    demo = runpy.run_path(str(ROOT / "examples" / "demo.py"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerCollapseWarning)  # the demo empties no layer
        masks = demo["main"]()
    out = capsys.readouterr().out
    assert "Step 1" in out and "Step 2" in out and "| **total** |" in out
    assert "| parameter | shape | kept | pruned | sparsity |" in out
    assert "forward with masked_call: output (1, 10)" in out
    weights = [m for k, m in masks.items() if k.endswith("weight")]
    pruned = sum(int((~m).sum()) for m in weights)
    total = sum(m.numel() for m in weights)
    assert f"all weights: {pruned} of {total} pruned" in out
    assert str(fprune.report(masks)) in out
    assert 0.36 <= pruned / total <= 0.37  # 1 - 0.8 * 0.8 plus half of conv1's remaining channels
    assert all(m.all() for k, m in masks.items() if k.endswith("bias"))
