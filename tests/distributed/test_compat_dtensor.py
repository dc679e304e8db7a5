"""fprune.compat.global_unstructured on modules whose weights are DTensors gives torch's masks."""

from __future__ import annotations

import torch

from tests.distributed.launch import launch


def _prune_sharded_and_plain(rank, world):
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    import fprune.compat as prune

    mesh = DeviceMesh("cpu", list(range(world)))
    torch.manual_seed(0)
    sharded = [torch.nn.Linear(300, 301), torch.nn.Linear(301, 4)]  # 90,300 entries: uneven shards
    plain = [torch.nn.Linear(300, 301), torch.nn.Linear(301, 4)]
    for s, p in zip(sharded, plain, strict=True):
        p.load_state_dict(s.state_dict())
        s.weight = torch.nn.Parameter(distribute_tensor(s.weight.detach(), mesh, [Shard(0)]))
    for modules in (sharded, plain):
        prune.global_unstructured(
            [(m, "weight") for m in modules], pruning_method=prune.L1Unstructured, amount=0.7
        )
    return [
        (type(s.weight_mask).__name__, torch.equal(s.weight_mask.full_tensor(), p.weight_mask))
        for s, p in zip(sharded, plain, strict=True)
    ]


def test_compat_global_unstructured_on_dtensor_weights():
    for rank_result in launch(2, _prune_sharded_and_plain):
        assert rank_result == [("DTensor", True), ("DTensor", True)]
