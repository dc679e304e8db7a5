"""oneshot.prune over ranks (group=, 2 and 3 gloo processes on the CPU): each rank passes its own
share of the calibration batches (uneven shares, an empty one included) and every rank ends with
the result of one process on all the batches: the same masks, the weights within float32
tolerance (the statistics are summed in another order). An error on one rank (a bad batch, NaN
statistics, a failed solve) raises the same error on every rank, naming the rank; ranks given
different options are refused before anything runs.

The ranks run a small decoder written here in plain torch (no transformers to import in each
process): an embedding, then blocks of query/key/value projections fed one input (their
statistics share one table) and an MLP. Each launch runs every case of its world size in turn
(a launch starts the processes and a process group), and the tests read their parts.
"""

from __future__ import annotations

import functools
import pathlib
import tempfile

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import fprune
from fprune._observe import Layer
from fprune.oneshot._ranks import assign, cost
from tests.distributed.launch import launch

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

VOCAB, WIDTH, BATCHES = 40, 16, 6


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.up, self.down = torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        attention = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / WIDTH**0.5, -1)
        x = x + attention @ self.v(x)
        return x + self.down(torch.relu(self.up(x)))


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, ids, scale=None):
        x = self.embed(ids)
        if scale is not None:
            x = x * scale
        for block in self.blocks:
            x = block(x)
        return x


def model():
    torch.manual_seed(0)
    return Decoder().eval()


def batches():
    g = torch.Generator().manual_seed(1)
    return [{"ids": torch.randint(0, VOCAB, (2, 8), generator=g)} for _ in range(BATCHES)]


# The batches of each rank, by world size: uneven, and one rank with none at 3.
SHARES = {2: [[0, 1, 2, 3], [4, 5]], 3: [[0, 1, 2], [3, 4, 5], []]}

# name -> keyword arguments of prune (beside the batches).
CASES = {
    "sparsegpt": {"sparsity": 0.5, "method": fprune.oneshot.SparseGPT(blocksize=8)},
    "wanda 2:4": {"sparsity": None, "n_m": (2, 4), "method": "wanda"},
    "owl": {"sparsity": 0.6, "method": "wanda", "profile": fprune.oneshot.OWL(m=2.0, lam=0.1)},
    "inplace": {"sparsity": 0.5, "method": fprune.oneshot.SparseGPT(blocksize=8), "inplace": True},
}


class FailsOn(fprune.oneshot.LayerMethod):
    """Wanda that fails to solve the MLP's up projection (on whichever rank owns it), as a
    factorization would."""

    statistic = "norms"

    def __repr__(self):
        return "FailsOn()"

    def prune_layer(self, weight, statistic, amount=None, *, n_m=None):
        if weight.shape == (2 * WIDTH, WIDTH):
            raise torch.linalg.LinAlgError("the factorization failed (a stand-in)")
        return fprune.oneshot.Wanda().prune_layer(weight, statistic, amount, n_m=n_m)


def pruned(group, **kwargs):
    """One case on this rank: (the pruned weights of the blocks, the masks), or the error."""
    net = model()
    params = dict(net.named_parameters())
    try:
        new, masks = fprune.oneshot.prune(net, params, kwargs.pop("batches"), group=group, **kwargs)
    except Exception as error:  # the error is the result of the case
        return f"{type(error).__name__}: {error}"
    if kwargs.get("inplace"):
        assert all(new[k] is p for k, p in net.named_parameters())
    return {k: new[k].detach().clone() for k in masks}, masks


def cases(rank, world, group):
    """Every case on this rank of ``group`` (``world`` ranks), in the same order on every rank;
    a case that fails on every rank leaves the ranks in step for the next one."""
    everything = batches()
    mine = [everything[i] for i in SHARES[world][rank]]
    out = {name: pruned(group, batches=mine, **kwargs) for name, kwargs in CASES.items()}
    if world == 2:
        bad = [dict(b) for b in mine]
        if rank == 1:
            bad[1]["ids"] = bad[1]["ids"].float()
        out["bad batch"] = pruned(group, batches=bad, sparsity=0.5, method="wanda")
        nan = [dict(b) for b in mine]
        if rank == 1:
            nan[0]["scale"] = torch.tensor(float("nan"))
        out["nan"] = pruned(group, batches=nan, sparsity=0.5, method="wanda")
        out["failed solve"] = pruned(group, batches=mine, sparsity=0.5, method=FailsOn())
        sparsity = 0.5 if rank == 0 else 0.6
        out["sparsity differs"] = pruned(group, batches=mine, sparsity=sparsity, method="wanda")
        method = "wanda" if rank == 0 else "magnitude"
        out["method and blocks differ"] = pruned(
            group, batches=mine, sparsity=0.5, method=method, blocks=["blocks.0", "blocks.1"][: 2 - rank]
        )
        out["after the errors"] = pruned(group, batches=mine, **CASES["sparsegpt"])
    return out


def sums_shared_apart(rank):
    """Partial sums whose tables are shared differently on each rank (q and k share one on rank
    0 only; v has none on rank 2), added up by the reduce of the pipeline's ranks."""
    from fprune.oneshot._ranks import Ranks

    def table(value):
        return {"sum": torch.full((2,), float(value)), "rows": torch.tensor(rank + 1)}

    sums = {"k": table(rank), "v": table(10 * rank)}
    sums["q"] = sums["k"] if rank == 0 else table(rank)
    if rank == 2:
        del sums["v"]
    Ranks(dist.group.WORLD, "test").reduce(sums)
    return {name: (t["sum"].tolist(), int(t["rows"])) for name, t in sorted(sums.items())}


def checkpoint_ids():
    g = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, VOCAB, (2, 8), generator=g)} for _ in range(3)]


def pretrained(rank, group, folder):
    """prune_pretrained on ranks 0 and 1 (shares of 2 and 1 batches): rank 0 writes the output;
    rank 1 names another folder, which stays unwritten."""
    mine = checkpoint_ids()[:2] if rank == 0 else checkpoint_ids()[2:]
    output = f"{folder}/ranks" if rank == 0 else f"{folder}/rank1"
    method = fprune.oneshot.SparseGPT(blocksize=8)
    return str(
        fprune.oneshot.prune_pretrained(f"{folder}/dense", output, mine, 0.5, method=method, group=group)
    )


def both(rank, world, folder):
    """The cases of 2 ranks on a group of ranks 0 and 1 (not the whole world: its ranks' global
    ranks are what broadcasts name), then those of 3 ranks on the world."""
    pair = dist.new_group([0, 1])
    two = cases(rank, 2, pair) if rank < 2 else None
    written = pretrained(rank, pair, folder) if rank < 2 else None
    return two, cases(rank, 3, dist.group.WORLD), sums_shared_apart(rank), written


@functools.cache
def folder():
    """A tiny Llama checkpoint, saved in two shards (transformers imported here only)."""
    transformers = pytest.importorskip("transformers")
    path = pathlib.Path(tempfile.mkdtemp())
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=32,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path / "dense", max_shard_size="20KB")
    return path


@functools.cache
def launched():
    return launch(3, both, str(folder()))


def results(world):
    """Each rank's results of the cases of ``world`` ranks."""
    return [ranks[world - 2] for ranks in launched()][:world]


def alone(name):
    """The case in one process on all the batches."""
    kwargs = {k: v for k, v in CASES[name].items() if k != "inplace"}
    net = model()
    new, masks = fprune.oneshot.prune(net, dict(net.named_parameters()), batches(), **kwargs)
    return {k: new[k].detach() for k in masks}, masks


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_ends_with_one_process_result(world, name):
    weights, masks = alone(name)
    ranks = results(world)
    for rank, got in enumerate(ranks):
        assert not isinstance(got[name], str), f"rank {rank}: {got[name]}"
        got_weights, got_masks = got[name]
        assert sorted(got_masks) == sorted(masks)
        for key in masks:
            # the same zeros; the weights up to the order of the float additions
            assert torch.equal(got_masks[key], masks[key]), (rank, key)
            torch.testing.assert_close(got_weights[key], weights[key], rtol=1e-4, atol=1e-5)
            # and every rank the same, byte for byte (broadcast from the layer's owner)
            assert torch.equal(got_weights[key], ranks[0][name][0][key])
    if name == "wanda 2:4":
        assert all(int(m.sum()) * 2 == m.numel() for m in masks.values())


def test_an_error_on_one_rank_is_the_same_error_on_every_rank():
    ranks = results(2)
    for name, match in (
        ("bad batch", "ValueError|TypeError"),
        ("nan", "ValueError"),
        ("failed solve", "RuntimeError"),
    ):
        assert ranks[0][name] == ranks[1][name], name
        assert ranks[0][name].split(":")[0] in match, ranks[0][name]
    assert ranks[0]["bad batch"] == (
        "TypeError: oneshot.prune over 2 ranks: rank 1 failed reading its calibration batches: "
        "TypeError: oneshot.prune: batches[1] gives the embedding 'embed' (40 entries) torch.float32 "
        "values; expected integer token ids (torch.long, as a tokenizer returns them): convert them "
        "with .long()."
    )
    assert ranks[0]["nan"].startswith(
        "ValueError: oneshot.prune over 2 ranks: rank 1 failed collecting the statistics of block "
        "'blocks.0': ValueError: oneshot.prune: the inputs of 'blocks.0.down.weight', "
        "'blocks.0.k.weight', 'blocks.0.q.weight', 'blocks.0.up.weight', 'blocks.0.v.weight' in "
        "block 'blocks.0' hold NaN or inf"
    )
    # the costliest layers, blocks.0.down and blocks.0.up (512 each), go to rank 0 and rank 1
    # (ties by name), then each layer to the rank with the least work so far
    assert ranks[0]["failed solve"].startswith(
        "RuntimeError: oneshot.prune over 2 ranks: rank 1 failed pruning the layers of block 'blocks.0': "
    )
    assert ranks[0]["failed solve"].endswith("LinAlgError: the factorization failed (a stand-in)")
    # the ranks stay in step after errors: the next run is as without them
    for rank in ranks:
        assert all(torch.equal(rank["after the errors"][1][k], m) for k, m in rank["sparsegpt"][1].items())


def test_ranks_given_different_options_are_refused():
    ranks = results(2)
    for name in ("sparsity differs", "method and blocks differ"):
        assert ranks[0][name] == ranks[1][name], name
    assert ranks[0]["sparsity differs"] == (
        "ValueError: oneshot.prune over 2 ranks: the ranks were given different options, which would "
        "prune different models; expected the same on every rank (only the batches differ). "
        "sparsity: 0.5 on rank 0; 0.6 on rank 1"
    )
    message = ranks[0]["method and blocks differ"]
    assert "method: Wanda() on rank 0; Magnitude() on rank 1" in message
    assert "blocks: ['blocks.0', 'blocks.1'] on rank 0; ['blocks.0'] on rank 1" in message


def test_a_group_that_is_no_process_group():
    net = model()
    params = dict(net.named_parameters())
    assert not dist.is_initialized()
    # torch.distributed.group.WORLD is None before init_process_group
    with pytest.raises(ValueError, match=r"group=None names no process group.*init_process_group"):
        fprune.oneshot.prune(net, params, batches(), 0.5, group=dist.group.WORLD)
    with pytest.raises(TypeError, match=r"Expected group to be a torch.distributed process group .*got str"):
        fprune.oneshot.prune(net, params, batches(), 0.5, group="world")
    # left out: one process
    fprune.oneshot.prune(net, params, batches(), 0.5)


def test_partial_sums_shared_differently_on_each_rank_add_up_per_layer():
    # q: 0 + 1 + 2, rows 1 + 2 + 3; v: 0 + 10 (rank 2 has no table: zeros)
    want = {"k": ([3.0, 3.0], 6), "q": ([3.0, 3.0], 6), "v": ([10.0, 10.0], 3)}
    assert [ranks[2] for ranks in launched()] == [want] * 3


@settings(max_examples=60)
@given(
    costs=st.dictionaries(st.text("abc", min_size=1, max_size=3), st.floats(0, 1e6), max_size=12),
    world=st.integers(1, 5),
)
def test_each_layer_has_one_owner_and_the_loads_differ_by_at_most_one_layer(costs, world):
    owner = assign(costs, world)
    assert sorted(owner) == sorted(costs) and all(0 <= r < world for r in owner.values())
    assert assign(dict(reversed(list(costs.items()))), world) == owner  # whatever the order given
    load = [sum(c for n, c in costs.items() if owner[n] == r) for r in range(world)]
    assert max(load) - min(load) <= max(costs.values(), default=0.0)


def test_costs_follow_the_solve():
    from fprune.calibration import Hessian, InputNorms

    wide = Layer(None, "w", torch.empty(8, 64), False)
    conv1d = Layer(None, "c", torch.empty(64, 8), True)  # stored (in, out): the same layer
    assert cost(Hessian(), wide) == cost(Hessian(), conv1d) == 8 * 64**2 + 64**3
    assert cost(InputNorms(), wide) == 8 * 64
    assert cost(fprune.oneshot.Refine("wanda").statistic, wide) == cost(Hessian(), wide)


def tensors(directory):
    from safetensors.torch import load_file

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def test_prune_pretrained_over_ranks_writes_one_process_checkpoint_from_rank_0():
    path = folder()
    written = [ranks[3] for ranks in launched()]
    assert written == [str(path / "ranks"), str(path / "rank1"), None]
    assert not (path / "rank1").exists()  # rank 1 wrote nothing
    method = fprune.oneshot.SparseGPT(blocksize=8)
    fprune.oneshot.prune_pretrained(path / "dense", path / "alone", checkpoint_ids(), 0.5, method=method)
    ranks, alone = tensors(path / "ranks"), tensors(path / "alone")
    assert sorted(ranks) == sorted(alone)
    assert sorted(p.name for p in (path / "ranks").iterdir()) == sorted(
        p.name for p in (path / "alone").iterdir()
    )
    pruned = [k for k in alone if ".layers." in k and k.endswith("proj.weight")]
    assert len(pruned) == 14
    for key, tensor in alone.items():
        assert torch.equal(ranks[key] == 0, tensor == 0), key
        torch.testing.assert_close(ranks[key], tensor, rtol=1e-4, atol=1e-5)
