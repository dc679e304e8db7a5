"""Benchmarks: fprune against ``torch.nn.utils.prune``, side by side in one run.

Run ``python -m benchmarks`` (or ``python benchmarks/run.py``) from the repository root;
``--quick`` (small sizes, one process) finishes in under 20 seconds. See ``docs/benchmarks.md``.
"""
