"""Benchmarks: fprune against ``torch.nn.utils.prune``, side by side in one run.

Run ``python -m benchmarks`` (or ``python benchmarks/run.py``) from the repository root;
``--quick`` finishes in under a minute. See ``docs/benchmarks.md``.
"""
