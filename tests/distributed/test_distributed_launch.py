"""tests/distributed/launch.py reports what went wrong on which rank: a rank's own error with its
traceback, and a hang with the Python stacks of the ranks that hung and where the ranks'
collectives parted (nothing can hang CI)."""

import time

import pytest
import torch
import torch.distributed as dist

from tests.distributed.launch import launch

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def _rank_one_sleeps(rank, world):
    dist.all_reduce(torch.ones(3))  # both ranks: the traces agree on this one
    if rank == 1:
        time.sleep(600)
    return rank


def _rank_zero_raises(rank, world):
    if rank == 0:
        raise ValueError("rank zero's own error")
    return rank


def _ranks(rank, world):
    return (rank, world, dist.get_rank())


def test_every_rank_returns_its_result_in_rank_order():
    assert launch(2, _ranks) == [(0, 2, 0), (1, 2, 1)]


def test_a_hang_names_the_ranks_and_shows_where_they_waited():
    # The timeout counts from when both ranks joined the process group: 3 s is time enough for
    # one all_reduce and the closing barrier, whatever the load on the machine while they started.
    with pytest.raises(TimeoutError) as error:
        launch(2, _rank_one_sleeps, timeout=3)
    message = str(error.value)
    # Rank 1 sleeps in the target; rank 0 waits for it in the closing barrier.
    assert "_rank_one_sleeps on 2 gloo processes: ranks [0, 1] did not finish within 3 s" in message
    assert "in _rank_one_sleeps" in message and "in end_process_group" in message
    # The trace of collectives: both entered the first all_reduce, then only rank 0 the barrier.
    assert "the ranks agree on the first 1 ---" in message
    assert "rank 0 (2 in all), from collective 1:\n  barrier  | launch.py" in message
    assert "rank 1 (1 in all), from collective 1:\n  (none after those)" in message


def test_a_rank_error_reaches_the_test_with_its_traceback():
    with pytest.raises(AssertionError, match="rank 0 failed:") as error:
        launch(2, _rank_zero_raises, timeout=120)
    assert "ValueError: rank zero's own error" in str(error.value)
