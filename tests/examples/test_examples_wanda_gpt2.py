"""The Wanda 2:4 GPT-2 example (examples/wanda_gpt2.py), end to end on a tiny random model."""

import pytest
import torch

from tests.helpers import load_example

pytest.importorskip("transformers")

wg = load_example("wanda_gpt2")


def test_two_four_masks_and_wanda_beats_magnitude_with_outlier_features():
    plain = wg.run(calibration_batches=2, progress=None)  # asserts 2 of every 4 kept inside
    assert plain["layers pruned"] == 8 and plain["block weights pruned"] == 0.5
    outliers = wg.run(calibration_batches=2, outliers=4, progress=None)
    assert outliers["logit error, Wanda 2:4"] < 0.8 * outliers["logit error, magnitude 2:4"]


def test_two_four_groups_follow_the_input_features():
    scores = {"transformer.h.0.mlp.c_fc.weight": torch.arange(32.0).view(8, 4)}  # Conv1D: (in, out)
    masks = wg.two_four(scores)["transformer.h.0.mlp.c_fc.weight"]
    # Along dim 0 (inputs), groups of 4 keep their 2 highest: rows 2, 3, 6, 7.
    assert torch.equal(masks.all(1), torch.tensor([False, False, True, True] * 2))
