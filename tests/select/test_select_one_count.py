"""The selection that replaces the per-row sort when every row prunes one count gives the masks
of a stable sort (ties to the first position), for every count, with heavy ties and the pruned
and protected keys of prior masks."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from fprune.select._groups import lowest_in_groups, lowest_in_groups_of_one_count


def stable_sort_reference(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Keep-mask: in each row, the k lowest keys pruned, equal keys in position order."""
    keep = torch.ones_like(keys, dtype=torch.bool)
    for r, row in enumerate(keys.tolist()):
        for position in sorted(range(len(row)), key=lambda j: (row[j], j))[:k]:
            keep[r, position] = False
    return keep


@given(
    rows=st.integers(1, 5),
    size=st.integers(1, 40),
    distinct=st.integers(1, 6),
    fraction=st.floats(0.0, 1.0),
    dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_one_count_equals_the_stable_sort(rows, size, distinct, fraction, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    values = torch.tensor([info.min, -3, 0, 7, 2**30, info.max], dtype=dtype)[:distinct]
    keys = values[torch.randint(0, len(values), (rows, size), generator=g)]
    k = round(fraction * size)
    keep = lowest_in_groups_of_one_count(keys, k)
    assert torch.equal(keep, stable_sort_reference(keys, k))
    assert torch.equal(keep, lowest_in_groups(keys, k))
    assert bool((keep.logical_not().sum(-1) == k).all())


def test_counts_outside_the_row_prune_nothing_or_everything():
    keys = torch.tensor([[3, 1, 2], [1, 1, 1]], dtype=torch.int32)
    assert bool(lowest_in_groups_of_one_count(keys, 0).all())
    assert not bool(lowest_in_groups_of_one_count(keys, 3).any())
    assert not bool(lowest_in_groups_of_one_count(keys, 5).any())
    assert lowest_in_groups_of_one_count(keys[:, :0], 1).shape == (2, 0)
