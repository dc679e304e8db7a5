"""Test-suite settings: one intra-op thread (the 2 CI cores are shared), hypothesis budgets."""

import gc
import json
import os
import pathlib

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


# Each test's time (setup, call and teardown, seconds) on 2 quiet cores, as last recorded with
# ``python -m pytest -n auto --record-durations`` (tests under 0.05 s are left out). The tests
# of SLOW_SECONDS or more are marked ``slow`` (``-m "not slow"``, the fast lane, leaves them
# out; CI runs everything). Under pytest-xdist (``-n auto``, ``--dist worksteal``: each worker
# starts on a contiguous run of the collection, and an idle worker takes half of what another
# has left) the files are collected longest first, each file's tests in their own order (a
# module's fixtures are built once per worker), so the long tests start at once and the work
# left at the end is short.
DURATIONS = pathlib.Path(__file__).with_name("durations.json")
SLOW_SECONDS = 0.1


def _recorded() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each test's time (setup + call + teardown) to {DURATIONS.name}",
    )


class _Recorder:
    """Sums each test's phases as their reports arrive (from every worker under xdist)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        kept = {k: round(v, 2) for k, v in sorted(self.seconds.items()) if v >= 0.05}
        DURATIONS.write_text(json.dumps(kept, indent=0) + "\n")


def pytest_configure(config):
    if config.getoption("--record-durations") and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_Recorder(), "fprune-durations")


# Tests that empty whole leaves on purpose (amounts up to 1.0, or a ranking across leaves of very
# different scales, which is what they check): the LayerCollapseWarning is expected there, and is
# ignored in them alone (``filterwarnings`` on each), not in the rest of the suite.
COLLAPSING = (
    "tests/engine/test_engine_many_leaves.py::test_many_small_leaves_equal_a_few_large_ones",
    "tests/methods/test_methods_global.py::test_global_masks_nest_as_amount_grows",
    "tests/methods/test_methods_global.py::test_global_matches_reference_across_leaves_in_sorted_key_order",
    "tests/methods/test_methods_global.py::test_global_over_one_leaf_equals_local",
    "tests/methods/test_methods_global.py::test_global_unstructured_matches_torch",
    "tests/methods/test_methods_global.py::test_normalization_protects_a_small_scale_layer",
    "tests/methods/test_methods_global.py::test_normalized_ranking_ignores_a_leaf_scale",
    "tests/methods/test_methods_iterative.py::test_schedule_counts_and_calls",
    "tests/methods/test_methods_transform_properties.py::test_vmap_equals_eager",
    "tests/methods/test_methods_transforms.py::test_vmap_over_sparsity_levels_with_a_tensor_amount",
    "tests/select/test_select_amounts.py::test_compiled_mask_computation_takes_a_changing_float_without_recompiling_per_value",
    "tests/select/test_select_count_rules.py::test_what_a_count_rule_returns_is_checked",
    "tests/select/test_select_scopes.py::test_each_and_global_match_the_reference",
)


def _freeze_survivors(phase, info):
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def pytest_collection_finish(session):
    """Garbage collection: a test process holds about a million long-lived objects (torch,
    dynamo's and export's state, transformers, hypothesis), which every full collection used to
    scan again (over a tenth of a worker's time). The survivors of the collection after the
    tests are collected, and of each full collection after that, are frozen (``gc.freeze``):
    later collections scan only what was made since. Objects freed by reference counting are
    freed as before; only garbage cycles among frozen objects stay (a few tens of MB a worker).
    """
    gc.collect()
    gc.freeze()
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def pytest_collection_modifyitems(config, items):
    """Mark the tests recorded at ``SLOW_SECONDS`` or more ``slow``, and the ``COLLAPSING`` ones;
    under xdist, order the files longest first; skip ``zoo_full`` unless asked for."""
    recorded = _recorded()
    files: dict[str, float] = {}
    for item in items:
        if item.nodeid.startswith(COLLAPSING):
            item.add_marker(pytest.mark.filterwarnings("ignore::fprune.select.LayerCollapseWarning"))
        seconds = recorded.get(item.nodeid, 0.0)
        if seconds >= SLOW_SECONDS:
            item.add_marker(pytest.mark.slow)
        path = item.nodeid.split("::")[0]
        files[path] = files.get(path, 0.0) + seconds
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Every worker collects the same order, which the controller hands out; the sort is
        # stable, so each file's tests keep their order.
        items.sort(key=lambda item: -files[item.nodeid.split("::")[0]])
    if "zoo_full" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the full torchvision zoo runs with -m zoo_full")
    for item in items:
        if "zoo_full" in item.keywords:
            item.add_marker(skip)
