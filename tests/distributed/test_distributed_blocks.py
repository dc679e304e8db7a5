"""The Blocks scope on DTensors (2 gloo processes) gives each rank its part of the masks of the
same call on the full tensors in one process: tiles whole on a rank or split across ranks
(Shard(0) with uneven shards, Shard(1), Replicate), prior masks, >2-d leaves. Nothing of the
scope is written in fprune/distributed: the scope's own sharded form runs there."""

import pytest
import torch
import torch.distributed as dist

from tests.distributed.launch import launch

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def blocks_cases(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from fprune.select import Blocks, select

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    # Integer-valued scores: the tile sums are exact whatever the order they are summed in.
    params = {
        "a": torch.randint(-3, 4, (9, 10), generator=g).float(),
        "b": torch.randint(-3, 4, (6, 2, 5), generator=g).float(),
        "c": torch.randint(-3, 4, (4, 7), generator=g).float(),
    }
    prior = {k: torch.rand(v.shape, generator=g) > 0.3 for k, v in params.items()}
    out = {}
    for placement in (Shard(0), Shard(1), Replicate()):
        for tile in ((2, 3), (4, 4)):
            for masks in (None, prior):
                for amount in (0.5, 1):
                    want = select(params, amount, scope=Blocks(tile), masks=masks)
                    sharded = {
                        k: distribute_tensor(v, mesh, [placement], src_data_rank=None)
                        for k, v in params.items()
                    }
                    prior_d = None
                    if masks is not None:
                        prior_d = {
                            k: distribute_tensor(v, mesh, [placement], src_data_rank=None)
                            for k, v in masks.items()
                        }
                    got = select(sharded, amount, scope=Blocks(tile), masks=prior_d)
                    key = f"{placement}/{tile}/{masks is not None}/{amount}"
                    out[key] = all(torch.equal(got[k].full_tensor(), want[k]) for k in params)
    return out


def test_blocks_on_two_ranks_match_one_process():
    results = launch(2, blocks_cases, timeout=120.0)
    for rank in results:
        assert rank and all(rank.values()), {k: v for k, v in rank.items() if not v}
