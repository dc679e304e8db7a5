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


# The tests that take longest (several seconds or more on 2 quiet cores; see
# `python -m pytest --durations=60`), by node id prefix: marked ``slow`` (``-m "not slow"`` leaves
# them out of a quick local run; CI runs everything). Under pytest-xdist (``-n auto``, with
# ``--dist worksteal``: runs of the collection handed out in order, idle workers steal) every
# worker collects the files that hold them first, so that they start at once on different workers
# instead of leaving one worker busy at the end.
SLOW = (
    "tests/zoo/test_zoo_torchvision.py::test_every_prunable_group_compacts[swin_t]",
    "tests/perf/test_perf_benchmarks.py::test_quick_run_writes_every_section_as_a_well_formed_table",
    "tests/distributed/test_dtensor_select.py",
    "tests/distributed/test_compat_dtensor.py",
    "tests/distributed/test_example.py",
    "tests/distributed/test_distributed_launch.py",
    "tests/apply/test_apply_bool_masks_compiled.py::test_compiled_bool_masks_give_torchs_values_and_gradients",
    "tests/apply/test_apply_bool_masks_compiled.py::test_vmap_of_masked_call_with_bool_masks_compiles",
    "tests/devices/test_devices_meta.py::test_benchmarks_device_cuda_command_without_cuda_fails_in_one_line",
    "tests/compat/test_compat_differential.py::test_random_call_sequences_match_torch",
    "tests/compat/test_compat_copying.py::test_deepcopy_after_a_compiled_forward",
    "tests/posttrain/test_posttrain_pretrained.py::test_memory_does_not_grow_with_depth",
    "tests/posttrain/test_posttrain_ranks.py",
)


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


def pytest_collection_modifyitems(config, items):
    """Mark the ``SLOW`` tests (their files first, in an xdist worker) and the ``COLLAPSING`` ones; skip
    ``zoo_full`` unless asked for."""
    for item in items:
        if item.nodeid.startswith(COLLAPSING):
            item.add_marker(pytest.mark.filterwarnings("ignore::fprune.select.LayerCollapseWarning"))
    slow_files = {}
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
            slow_files.setdefault(item.nodeid.split("::")[0], len(slow_files))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Every worker collects the same order, which the controller hands out file by file;
        # the sort is stable, so each file's tests keep their order.
        items.sort(key=lambda item: slow_files.get(item.nodeid.split("::")[0], len(slow_files)))
    if "zoo_full" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the full torchvision zoo runs with -m zoo_full")
    for item in items:
        if "zoo_full" in item.keywords:
            item.add_marker(skip)
