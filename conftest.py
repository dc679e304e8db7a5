"""Doctests in fprune/ run with one thread too (see tests/conftest.py)."""

import torch

torch.set_num_threads(1)
