"""Device rules, on the CPU with the ``meta`` device standing in for a second device.

Temporaries are made on the params' device, ``vmap`` over a tensor amount works whatever the
params' device, ``vmap`` over a seed tensor alone works, and a generator on another device
than the params raises a clear error.
"""

import pytest
import torch
from torch.func import vmap

import fprune
from fprune import _random, packed
from fprune.select import _engine
from tests.helpers import ROOT


def test_vmap_over_amounts_with_params_on_another_device():
    params = {"a": torch.empty(4, 5, device="meta"), "b": torch.empty(6, device="meta")}
    levels = torch.tensor([0.2, 0.5, 0.9])  # on the CPU
    for fn in (fprune.global_unstructured, fprune.l1_unstructured):
        masks = vmap(lambda a, *, fn=fn: fn(params, a))(levels)
        assert all(
            m.device.type == "meta" and m.shape[0] == 3 and m.dtype == torch.bool for m in masks.values()
        )
    masks = vmap(lambda a: fprune.ln_structured({"a": params["a"]}, a, 2, 0))(levels)
    assert masks["a"].shape == (3, 4, 5) and masks["a"].device.type == "meta"


@pytest.mark.parametrize("fn", ["random_unstructured", "random_structured"])
def test_vmap_over_a_seed_tensor_alone(fn):
    params = {"a": torch.randn(6, 5), "b": torch.randn(4, 3)}
    call = {
        "random_unstructured": lambda s: fprune.random_unstructured(params, 0.5, generator=s),
        "random_structured": lambda s: fprune.random_structured(params, 0.5, 0, generator=s),
    }[fn]
    seeds = torch.tensor([1, 2, 3, 40])
    batched = vmap(call)(seeds)
    for i, seed in enumerate(seeds.tolist()):
        for by in (seed, seeds[i]):  # an int seed and a tensor seed give the same masks
            one = call(by)
            assert all(torch.equal(one[k], batched[k][i]) for k in one)


def test_integer_seed_scores_are_made_on_the_device():
    scores = _random.uniform((3, 4), 7, 2, torch.device("meta"))
    assert scores.device.type == "meta"
    cpu = _random.uniform((3, 4), 7, 2, torch.device("cpu"))
    assert torch.equal(cpu, _random.uniform((3, 4), torch.tensor(7), 2, torch.device("cpu")))


def test_generator_on_another_device_raises_naming_the_leaf():
    with pytest.raises(ValueError, match="leaf number 3"):
        _random.uniform((3,), torch.Generator(), 3, torch.device("meta"))


def test_packed_bit_weights_are_made_on_the_device():
    weights = packed._weights(torch.device("meta"))
    assert weights.device.type == "meta" and weights.dtype == torch.uint8
    assert packed._weights(torch.device("cpu")).tolist() == [1, 2, 4, 8, 16, 32, 64, 128]


def test_one_global_selection_needs_one_device():
    scores = [torch.randn(4), torch.randn(3, device="meta")]
    sources = [(s.numel(), _engine.keys(s, None, torch.int32, _engine.MAGNITUDE)) for s in scores]
    with pytest.raises(ValueError, match="on one device"):
        _engine.prune_lowest(sources, 2, traced=False, device=torch.device("cpu"))


@pytest.mark.parametrize("what", ["importance_scores", "masks"])
def test_scores_and_masks_on_another_device_raise_naming_the_leaf(what):
    params = {"a": torch.randn(4), "b": torch.randn(3)}
    other = {"a": torch.ones(4, dtype=torch.bool), "b": torch.ones(3, dtype=torch.bool, device="meta")}
    if what == "importance_scores":
        other = {k: v.float() for k, v in other.items()}
    for fn in (fprune.global_unstructured, fprune.l1_unstructured):
        with pytest.raises(ValueError, match=rf"{what} of params\['b'\] on its device \(cpu\), got meta"):
            fn(params, 0.5, **{what: other})


# ---------------------------------------------------------------------------------------------
# The GPU runner (benchmarks/gpu.py), checked on the CPU so that a typo cannot wait for a GPU.


def test_gpu_runner_without_cuda_says_so_in_one_line(capsys):
    from benchmarks import gpu

    if torch.cuda.is_available():
        pytest.skip("CUDA is available; this checks the behaviour without it")
    assert gpu.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err and "nothing was run" in err
    assert gpu.unavailable("cpu") is None and "not a torch device" in gpu.unavailable("nonsense")


def test_benchmarks_device_cuda_command_without_cuda_fails_in_one_line():
    """``python -m benchmarks --device cuda``, the documented command, as a user runs it."""
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("CUDA is available; this checks the behaviour without it")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--device", "cuda"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "needs a CUDA GPU" in done.stderr


def test_gpu_runner_main_runs_on_the_cpu(tmp_path, capsys):
    """``python -m benchmarks.gpu --device cpu --quick``: the whole runner, tiny sizes, files out."""
    from benchmarks import gpu

    json_path, md_path = tmp_path / "cpu.json", tmp_path / "cpu.md"
    args = [
        "--device",
        "cpu",
        "--quick",
        "--sizes",
        "tiny",
        "--json",
        str(json_path),
        "--markdown",
        str(md_path),
    ]
    assert gpu.main(args) == 0
    import json

    report = json.loads(json_path.read_text())
    assert report["device"] == "cpu" and set(report) >= {"global", "training", "ensemble", "threads"}
    assert "| tiny | 0.5 |" in md_path.read_text() and "| tiny | 0.5 |" in capsys.readouterr().out


def test_gpu_runner_cuda_helpers_with_a_stand_in_for_torch_cuda(monkeypatch):
    """The CUDA-only helpers (sync counting, peak memory, device name), run against stand-ins."""
    from benchmarks import gpu

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: calls.append(mode))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 164)
    cuda = torch.device("cuda")

    def call_that_syncs():
        import warnings

        warnings.warn("called a synchronizing CUDA operation", stacklevel=2)
        return 1

    assert gpu.host_syncs(call_that_syncs, cuda) == 1
    assert calls[-2:] == ["warn", "default"]
    assert gpu.peak_bytes(lambda: 1, cuda) == 64
    assert gpu.timed(lambda: 1, cuda, 2)["median_s"] >= 0 and "sync" in calls
