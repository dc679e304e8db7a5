"""The pruning tutorial's walk-through prints the same text under both imports."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import pathlib
import re
import runpy
import sys

import pytest
import torch.nn.utils.prune as torch_prune

import fprune.compat as compat_prune

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "prune_tutorial.py"


def _load_tutorial():
    spec = importlib.util.spec_from_file_location("prune_tutorial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _printed(prune, seed: int) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _load_tutorial().main(prune, seed)
    return out.getvalue()


def _normalized(text: str) -> str:
    # Hook objects print their class path and address; the hook ids come from a global counter.
    text = re.sub(r"<[\w.]+\.(\w+) object at 0x[0-9a-f]+>", r"<\1>", text)
    return re.sub(r"\((\d+), <", "(#, <", text)


@pytest.mark.parametrize("seed", [0, 1])
def test_tutorial_prints_what_torch_prints(seed):
    expected = _normalized(_printed(torch_prune, seed))
    actual = _normalized(_printed(compat_prune, seed))
    assert actual == expected
    # The run did prune: the figures the tutorial is about are there, and 20% globally.
    assert "Global sparsity: 20.00%" in actual
    assert "<PruningContainer>" not in actual  # hooks print as objects, the history as a list
    assert "[<RandomUnstructured>, <LnStructured>]" in actual


def test_tutorial_hooks_are_fprune_objects():
    text = _printed(compat_prune, 0)
    assert "fprune.compat.methods.RandomUnstructured object" in text
    assert "torch.nn.utils.prune" not in text


@pytest.mark.parametrize("flag, library", [([], compat_prune), (["--torch"], torch_prune)])
def test_script_runs_standalone(flag, library, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *flag])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    printed = capsys.readouterr().out
    assert _normalized(printed) == _normalized(_printed(library, 0))
