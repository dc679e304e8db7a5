"""DTensor masks on 2 and 4 gloo processes equal the single-process masks of the full tensors.

Each test starts its processes once and runs many cases in them (tests/distributed/cases.py):
global_unstructured, l1_unstructured and ln_structured (every norm, channels along a sharded
dim or not), n_m (groups split by shard boundaries or not), rowwise_unstructured (rows whole
on a rank or split across ranks), random_structured, with Shard(0) with uneven and empty shards,
Shard(1) and Shard(2) (positions interleave across
ranks), Replicate (counted once), a 2-D mesh, ties across shard boundaries and leaves, NaN, inf
and -0.0, prior masks, importance scores, where=, normalize=, float64; the budget of bytes
handed to collectives; and the errors (mixed plain tensors, Partial, two meshes, ranks whose
inputs disagree), which must reach every rank instead of hanging; fprune.select.select with
every scope (EACH, Global with normalize= and min_keep=, Channels with a norm, a callable or
given per-channel scores, Rows, NM; count rules as amounts); methods written for one process
(a saliency over select, a score function over select_inputs, a callable channel reduce), which
are sharded as they are; and training steps with masked_call and with the pruners' updates on
an FSDP2 (fully_shard) model, compared with the same steps in one process.
"""

import pytest
import torch.distributed as dist

from tests.distributed import cases
from tests.distributed.launch import launch

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def _failures(results: dict) -> dict:
    return {k: v for k, v in results.items() if isinstance(v, str)}


def test_two_ranks_match_one_process_and_errors_reach_every_rank():
    results = launch(2, cases.suite, False, (0.3, 0.5, 0.9, 11, 0, 1.0), True)
    for rank in results:
        assert not _failures(rank), _failures(rank)
    assert len(results[0]) > 300
    # masked_call on a fully_shard model: two SGD steps equal one process's, bit for bit.
    assert "fsdp/masks" in results[0] and "fsdp/other tensors" in results[0]
    # The pruners (gradual_magnitude global and layerwise, set_, rigl) on a fully_shard model:
    # three training steps with the pruner's update equal one process's, bit for bit.
    assert {"pruners/gradual/global", "pruners/set", "pruners/rigl", "pruners/custom"} <= set(results[0])
    # fprune.select.select with every scope, and new methods written for one process.
    scopes = {"/".join(k.split("/")[3:-2]) for k in results[0] if k.startswith("scopes/1d/")}
    assert {"each", "global", "global/min_keep", "channels0", "rows1", "nm-1", "each/rule"} <= scopes
    assert {"toy/randn/taylor", "toy/ties/cubed", "toy/ties/peak", "toy/peak/split"} <= set(results[0])
    # The per-leaf ranking of 300 leaves stays within the collective budget.
    assert results[0]["many/l1/bytes"] <= cases.BUDGET
    assert results[0]["many/global/bytes"] <= 1 << 20
    assert results[0]["many/replicated/bytes"] == 16  # Replicate-only leaves: the fingerprint only


def test_four_ranks_one_and_two_d_meshes_match_one_process():
    # Also trains a fully_shard model over 4 ranks (weights equal to 1e-6: FSDP averages).
    results = launch(4, cases.suite, True, (0.3, 11, 1.0), False)
    for rank in results:
        assert not _failures(rank), _failures(rank)
    assert any(k.startswith("2d/") for k in results[0])
    assert any(k.startswith("scopes/2d/") for k in results[0])
