"""examples/distributed_prune.py runs under torchrun (2 gloo processes) and its checks pass.

``--standalone`` lets torchrun's rendezvous bind a free port itself (no port chosen here that
another test process could take first); a hang fails the test with the output so far."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch.distributed as dist

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def test_distributed_example_matches_one_process_under_torchrun():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        str(ROOT / "examples" / "distributed_prune.py"),
        "--width",
        "32",
        "--layers",
        "1",
        "--vocab",
        "64",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as hung:
        output = [
            o.decode(errors="replace") if isinstance(o, bytes) else o or ""
            for o in (hung.stdout, hung.stderr)
        ]
        raise AssertionError(
            "torchrun examples/distributed_prune.py (2 processes) did not end within 300 s; its output:\n"
            + "\n".join(output)
        ) from None
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "masks equal the single-process masks of the full model: True" in done.stdout
    assert "pruned entries still zero: True" in done.stdout
    assert "handed to collectives by this rank" in done.stdout
