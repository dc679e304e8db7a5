"""Prune an FSDP2-sharded transformer globally, without gathering its weights, and train a step.

Run on CPU with two processes (gloo)::

    torchrun --nproc-per-node 2 examples/distributed_prune.py

Every rank builds the same small transformer language model (fixed seed), shards it with
``fully_shard`` (FSDP2: each parameter is a ``DTensor`` sharded on dim 0), and computes one
global magnitude ranking over all its weight matrices with ``fprune.global_unstructured``:
each rank ranks its own shards and only histograms and counts cross the network. The example
then checks that the masks equal the single-process masks of the full model (each rank holds
an unsharded copy for this check only), runs a training step with ``fprune.masked_call`` on
the sharded model and on the copy, compares the losses and weights, and prints the bytes the
selection handed to collectives next to the size of the weights.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import fprune


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, width: int, layers: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--amount", type=float, default=0.8)
    args = parser.parse_args()

    if "RANK" not in os.environ:
        raise SystemExit("Run me with torchrun: torchrun --nproc-per-node 2 examples/distributed_prune.py")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.width, args.layers)
    reference = copy.deepcopy(model)  # the unsharded model, for the checks only

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def weights(name, p):
        return p.dim() > 1

    params = dict(model.named_parameters())  # DTensors, Shard(0), this rank's rows only
    start = time.perf_counter()
    masks = fprune.global_unstructured(params, args.amount, where=weights)
    seconds = time.perf_counter() - start
    sent = fprune.distributed.last_communication()

    ref_params = dict(reference.named_parameters())
    ref_masks = fprune.global_unstructured(ref_params, args.amount, where=weights)
    same = all(torch.equal(masks[k].full_tensor(), ref_masks[k]) for k in masks)
    pruned = sum(int((~m.full_tensor()).sum()) for m in masks.values())
    matrices = [name for name, p in ref_params.items() if weights(name, p)]
    total = sum(ref_params[name].numel() for name in matrices)
    weight_bytes = sum(p.numel() * p.element_size() for p in ref_params.values())

    # One SGD step, the same batch on every rank, sharded and unsharded.
    tokens = torch.randint(0, args.vocab, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for m, p, k in ((model, params, masks), (reference, ref_params, ref_masks)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        logits = fprune.masked_call(m, p, k, (tokens[:, :-1],))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    max_diff = max(
        float((p.detach().full_tensor() - ref_params[k].detach()).abs().max())
        for k, p in model.named_parameters()
    )
    pruned_stay_zero = all(
        not fprune.apply_masks({k: params[k].detach()}, {k: masks[k]})[k]
        .full_tensor()[~masks[k].full_tensor()]
        .any()
        for k in masks
    )
    if rank == 0:
        print(
            f"{world} ranks (gloo, CPU), {total:,} weights in {len(matrices)} matrices, amount {args.amount}"
        )
        print(
            f"global_unstructured over the shards: {seconds * 1e3:.1f} ms"
            f", pruned {pruned:,} ({pruned / total:.1%})"
        )
        print(f"masks equal the single-process masks of the full model: {same}")
        print(
            f"handed to collectives by this rank: {sent.bytes:,} bytes in {sent.collectives} collectives "
            f"({sent.passes} histogram passes, digits of {sent.digit_bits} bits); "
            f"the parameters are {weight_bytes:,} bytes"
        )
        print(
            f"training step: loss {losses[0]:.6f} sharded, {losses[1]:.6f} in one process; "
            f"weights differ by at most {max_diff:.2e}; pruned entries still zero: {pruned_stay_zero}"
        )
    ok = same and losses[0] == losses[1] and max_diff <= 1e-6 and pruned_stay_zero
    # Every rank done with its collectives before any tears gloo down: without the barrier a rank
    # that exits first can abort the other's pending gloo threads ("terminate called ...", SIGABRT).
    dist.barrier()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
    # Leave without finalizing the interpreter: torch keeps gloo's threads running after
    # destroy_process_group once DTensors were made, and the teardown under them can abort
    # ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
