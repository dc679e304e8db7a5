"""docs/distributed.md: its Python blocks run in order (in a fresh process with a hard timeout:
they start a process group)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "distributed.md"

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def test_distributed_page_runs_in_order():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert blocks
    program = "torch_threads = __import__('torch').set_num_threads(1)\n" + "\n".join(blocks)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Communication(" in done.stdout
