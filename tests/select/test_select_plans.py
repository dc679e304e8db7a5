"""A scope written once against an executor (``Scope.masks``): a new scope defined here, in a
few lines, with a ``Grouped`` plan, selects as the built-in scope that ranks the same groups."""

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from fprune.select import Channels, Scope, select
from fprune.select._executor import Grouped


class _Rows:
    """Each index along dim 0 of a leaf is a group (a Grouping)."""

    def __init__(self, shape: torch.Size) -> None:
        self.shape, self.n = shape, shape[0]
        self.width = shape[1:].numel()

    def sum(self, terms):
        return terms.reshape(self.n, -1).sum(1)

    def any(self, keep):
        return keep.reshape(self.n, -1).any(1)

    def ids(self, positions):
        return positions // self.width

    def expand(self, keep):
        return keep.view(-1, *[1] * (len(self.shape) - 1)).expand(self.shape)


class RowL1(Scope):
    """Whole rows of lowest L1 norm, per leaf: the whole scope."""

    reduces = True

    def masks(self, ex):
        leaves = ex.pruned()
        rows = [_Rows(ex.inputs.params.leaves[i].shape) for i in leaves]
        # Channels ranks a channel by the norm of all its scores, those of entries the prior masks
        # pruned included (they are pruned already and stay so): the same term here.
        term = lambda v, keep: v.abs().double()
        return ex.grouped(Grouped(leaves, rows, term, "channels"))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 7),
    cols=st.integers(1, 5),
    amount=st.one_of(st.floats(0, 1), st.integers(0, 3)),
    seed=st.integers(0, 2**16),
    with_prior=st.booleans(),
)
def test_a_grouped_scope_selects_as_channels_of_the_same_norm(rows, cols, amount, seed, with_prior):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-3, 4, (rows, cols), generator=g).float()  # small integers: exact sums, ties
    prior = torch.rand(rows, cols, generator=g) > 0.3 if with_prior else None
    if isinstance(amount, int) and prior is not None:
        amount = min(amount, int(prior.any(1).sum()))
    amount = min(amount, rows) if isinstance(amount, int) else amount
    masks = None if prior is None else {"w": prior}
    want = select({"w": w}, amount, scope=Channels(0, reduce=1), masks=masks)["w"]
    got = select({"w": w}, amount, scope=RowL1(), masks=masks)["w"]
    assert torch.equal(got, want)
