"""Arguments that would prune silently wrong, or fail in torch's words: refused by oneshot.prune
with an error naming the argument (the batch, the option) before anything is changed, and OWL's
clipping told in terms of the blocks it moved."""

from __future__ import annotations

import pytest
import torch

import fprune
from fprune.distributions import owl
from test_posttrain_errors import prune_refused
from test_posttrain_oneshot import VOCAB, calibration, gpt2

transformers = pytest.importorskip("transformers")


def test_options_that_zero_every_weight_are_refused():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    batches = calibration()
    prune_refused(model, params, batches, ValueError, r"sparsity=1\.0 zeroes every weight", sparsity=1.0)
    nothing_kept = r"n_m=\(0, 4\) keeps 0 of every 4"
    prune_refused(model, params, batches, ValueError, nothing_kept, sparsity=None, n_m=(0, 4))
    # on purpose, per layer: the way the messages give
    name = "transformer.h.0.mlp.c_fc.weight"
    new, masks = fprune.oneshot.prune(model, params, calibration(), {name: 1.0}, method="magnitude")
    assert not bool(masks[name].any()) and not bool(new[name].any())


@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        (
            {"input_ids": torch.ones(2, 12)},
            TypeError,
            (
                r"batches\[1\] gives the embedding 'transformer\.wte' \(64 entries\) torch\.float32 values; "
                r"expected integer token ids"
            ),
        ),
        (
            {"input_ids": torch.full((2, 12), VOCAB + 3)},
            ValueError,
            (
                r"batches\[1\] gives the embedding 'transformer\.wte' ids from 67 to 67; expected ids in "
                r"\[0, 64\)"
            ),
        ),
        (
            {"input_ids": torch.zeros(2, 40, dtype=torch.long)},  # longer than the 32 positions
            ValueError,
            r"batches\[1\] gives the embedding 'transformer\.wpe' ids from 0 to 39; expected .*\[0, 32\)",
        ),
        (
            {"input_id": torch.zeros(2, 12, dtype=torch.long)},
            ValueError,
            (
                r"batches\[1\] has the key 'input_id', which GPT2LMHeadModel\.forward does not take "
                r"\(did you mean 'input_ids'\?\)"
            ),
        ),
        (
            {"ids": torch.zeros(2, 12, dtype=torch.long)},
            ValueError,
            r"batches\[1\] has the keys 'ids', none of them an input GPT2LMHeadModel\.forward names",
        ),
    ],
)
def test_bad_calibration_batches_name_the_batch(batch, error, match):
    model, _ = gpt2()
    params = dict(model.named_parameters())
    batches = [calibration()[0], batch]
    prune_refused(model, params, batches, error, match)


def test_a_forward_error_of_a_batch_is_noted_with_the_batch():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    ids = torch.zeros(2, 12, dtype=torch.long)
    bad = {"input_ids": ids, "position_ids": ids[:, :5]}  # the wrong length
    with pytest.raises(Exception) as error:
        fprune.oneshot.prune(model, params, [calibration()[0], bad], 0.5)
    assert "raised by calibration batch 1 (batches[1])" in "\n".join(getattr(error.value, "__notes__", []))


def test_owl_arguments_are_checked_when_built():
    with pytest.raises(ValueError, match=r"Expected m > 0 .* got -1"):
        fprune.oneshot.OWL(m=-1)
    with pytest.raises(ValueError, match=r"Expected lam >= 0 .* got -0\.5"):
        fprune.oneshot.OWL(lam=-0.5)
    with pytest.raises(TypeError, match="Expected m to be a finite float"):
        fprune.oneshot.OWL(m=float("nan"))


def ladder():
    """Three blocks whose outlier ratios are 0, 1/8 and 1/4 (with m=2): OWL's shifts are then
    0, lam and 2 lam."""
    params = {f"h.{b}.w": torch.ones(2, 8) for b in range(3)}
    norms = {f"h.{b}.w": torch.tensor([[100.0] * b + [1.0] * (8 - b)]) for b in range(3)}
    return params, norms


def test_owl_clipping_says_which_blocks_moved_and_what_it_did_to_the_mean():
    params, norms = ladder()
    # 0.5 -+ 0.6: block 0 at 1.1 and block 2 at -0.1 are clipped, and the clips cancel out
    with pytest.warns(UserWarning) as record:
        got = owl(params, norms, 0.5, m=2.0, lam=0.6)
    assert got == {"h.0.w": 1.0, "h.1.w": 0.5, "h.2.w": 0.0}
    message = str(record[0].message)
    assert "2 of 3 block sparsities fell outside [0, 1]" in message
    assert "(block 0: 1.1 -> 1; block 2: -0.1 -> 0)" in message
    assert "the clips cancel out: the mean over blocks is still sparsity=0.5" in message
    assert "A lam of at most 0.25 keeps every block inside [0, 1]" in message
    # 0.05 with lam 0.08: block 2 at -0.03 is clipped, the model is pruned more than asked
    with pytest.warns(UserWarning, match=r"now 0\.06, not sparsity=0\.05: the model is pruned more than"):
        owl(params, norms, 0.05, m=2.0)
