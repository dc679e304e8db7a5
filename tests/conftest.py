"""Test-suite settings: one intra-op thread (the 2 CI cores are shared), hypothesis budgets."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("FPRUNE_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    # CI replays a fixed sequence of examples, so a run's verdict does not depend on luck;
    # local runs keep exploring new examples.
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("default")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``zoo_full`` run only when asked for (``-m zoo_full``)."""
    if "zoo_full" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the full torchvision zoo runs with -m zoo_full")
    for item in items:
        if "zoo_full" in item.keywords:
            item.add_marker(skip)
