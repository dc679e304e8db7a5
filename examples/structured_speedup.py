"""Structured pruning that makes a model faster: prune channels by dependency group, then compact.

A small ResNet-like CNN (BatchNorm, residual adds, a strided stage with a 1x1 projection) is
trained briefly on scikit-learn's bundled digits (1,797 real 8x8 images; nothing is downloaded).
Then, for 25%, 50% and 75% of the channels of every prunable group:

1. ``fprune.structure.groups`` traces the model once (``torch.export``) and finds which
   (parameter, dim, channel) slices must go together: a conv's output channels with its bias,
   the BatchNorm after it (affine and running statistics) and the input columns of every layer
   that reads them, across residual adds;
2. ``fprune.group_structured`` picks the channels of lowest squared L2 norm in each group
   (local scope), as masks;
3. the masked model is fine-tuned through ``fprune.masked_call`` (pruned channels stay zero);
4. ``fprune.compact`` returns a smaller copy of the model (the same ``ResNet`` class), and
   ``fprune.compact_graph`` a smaller exported graph; both equal the masked model.

It prints, for the dense model and each level: test accuracy, parameter count, FLOPs per image
(``torch.utils.flop_counter``) and the forward time of a batch of 256 (best of N repeats, every
model measured side by side in the same run, on ``--threads`` threads; training runs on one),
and the ratios to the dense model; then the forward times of both routes at batch 1, 64 and 256
and at another image size (16x16). Run (about a minute):

    python examples/structured_speedup.py            # --quick, --threads, --clock, --table PATH
    python examples/structured_speedup.py --gpt2     # GPT-2 124M: groups time, both routes,
                                                     # 20 greedy tokens, compact vs masked

Needs the ``examples`` extra (scikit-learn); ``--gpt2`` the ``zoo`` extra (transformers).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
import warnings
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import fprune


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 32  # channels of the first stage; the second has twice as many
    epochs: int = 12
    finetune: int = 4
    amounts: Sequence[float] = (0.25, 0.5, 0.75)
    batch: int = 256  # forward-time batch of the first table
    batches: Sequence[int] = (1, 64, 256)  # forward-time batches of the route table
    other_size: int = 16  # and a batch of 64 images of this size (the digits are 8x8)
    repeats: int = 15
    seed: int = 0

    @classmethod
    def quick(cls) -> Config:
        return cls(
            width=16,
            epochs=2,
            finetune=1,
            amounts=(0.5,),
            batch=64,
            batches=(1, 64),
            other_size=12,
            repeats=2,
        )


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.proj = None
        if stride != 1 or c_in != c_out:
            self.proj = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.proj is None else self.proj(x)))


class ResNet(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stage1 = nn.Sequential(Block(width, width), Block(width, width))
        self.stage2 = nn.Sequential(Block(width, 2 * width, stride=2), Block(2 * width, 2 * width))
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def load_digits(seed: int):
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    data = sk_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=450, random_state=seed, stratify=y)
    return x_tr, y_tr, x_te, y_te


def train(model, params, masks, x, y, epochs: int, lr: float, seed: int) -> dict[str, torch.Tensor]:
    """Adam through masked_call; returns the trained params (BatchNorm statistics update in place)."""
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.Adam(params.values(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 64):
            idx = order[i : i + 64]
            out = fprune.masked_call(model, params, masks, (x[idx],))
            loss = nn.functional.cross_entropy(out, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    # Pruned entries got zero gradients but Adam's state never moves them: bake the zeros in.
    return {k: v.detach() for k, v in fprune.apply_masks(params, masks).items()}


def accuracy(fn, x, y) -> float:
    with torch.no_grad():
        return float((fn(x).argmax(1) == y).float().mean()) * 100


def flops(fn, x) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn(x)
    return counter.get_total_flops() // len(x)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def best_times(fns: dict[object, object], x, repeats: int, clock: str = "wall") -> dict[object, float]:
    """Best forward time of each model, measured round-robin (side by side) to share the noise.

    Each measurement is the mean of enough calls to take about 2 ms (one call for big batches).
    ``clock="cpu"`` measures the calling thread's CPU time (``time.thread_time``): with one
    thread, the forward's own compute, which other processes on a shared machine do not
    lengthen; ``"wall"`` is elapsed time."""
    now = CLOCKS[clock]
    best = {name: float("inf") for name in fns}
    with torch.no_grad():
        calls = {}
        for name, fn in fns.items():
            fn(x)  # warm up
            start = time.perf_counter()
            fn(x)
            calls[name] = max(1, min(50, int(2e-3 / max(time.perf_counter() - start, 1e-6))))
        for _ in range(repeats):
            for name, fn in fns.items():
                start = now()
                for _ in range(calls[name]):
                    fn(x)
                best[name] = min(best[name], (now() - start) / calls[name])
    return best


def run(config: Config, threads: int = 2, progress=print, clock: str = "wall") -> list[dict]:
    """Train, prune, fine-tune and compact on one thread; time the forwards on ``threads``.

    Returns one row per level (the dense model first); each pruned row holds its module-route
    model (``compact``) and graph-route model (``compact_graph``) timings under ``routes``."""
    torch.set_num_threads(1)  # small convs: a second thread mostly waits (and the box is shared)
    torch.manual_seed(config.seed)
    x_tr, y_tr, x_te, y_te = load_digits(config.seed)
    model = ResNet(config.width)
    dense = {k: v.detach() for k, v in model.named_parameters()}
    dense = train(model, dense, {}, x_tr, y_tr, config.epochs, 3e-3, config.seed)
    example = (x_te[:2],)
    start = time.perf_counter()
    structure = fprune.structure.groups(model, example)
    analysis_s = time.perf_counter() - start
    if progress:
        progress(f"dense: trained {config.epochs} epochs; groups in {analysis_s:.2f} s: {structure}")
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    dense_fn = lambda x: fprune.masked_call(model, dense, {}, (x,))
    rows = [
        dict(
            amount=0.0,
            acc=accuracy(dense_fn, x_te, y_te),
            params=sum(p.numel() for p in dense.values()),
            flops=flops(dense_fn, x_te[:8]),
            pruned_acc=None,
            masked_max_diff=0.0,
            graph_max_diff=0.0,
            same_class=True,
        )
    ]
    fns = {(0.0, "dense"): copy.deepcopy(model)}
    for amount in config.amounts:
        model.load_state_dict({**dense, **buffers})
        masks = fprune.group_structured(dense, amount, structure)
        pruned_acc = accuracy(
            lambda x, *, masks=masks: fprune.masked_call(model, dense, masks, (x,)), x_te, y_te
        )
        tuned = train(model, dense, masks, x_tr, y_tr, config.finetune, 1e-3, config.seed + 1)
        small = fprune.compact(model, tuned, masks, structure, example)  # a smaller ResNet
        graph = fprune.compact_graph(model, tuned, masks, structure, example)  # a GraphModule
        masked_out = fprune.masked_call(model, tuned, masks, (x_te,))
        with torch.no_grad():
            diff = float((small(x_te) - masked_out).abs().max())
            graph_diff = float((graph(x_te) - masked_out).abs().max())
        rows.append(
            dict(
                amount=amount,
                acc=accuracy(small, x_te, y_te),
                params=sum(p.numel() for p in small.parameters()),
                flops=flops(small, x_te[:8]),
                pruned_acc=pruned_acc,
                masked_max_diff=diff,
                graph_max_diff=graph_diff,
                same_class=type(small) is ResNet,
            )
        )
        fns[(amount, "module")] = small
        fns[(amount, "graph")] = graph
        if progress:
            progress(
                f"{amount:.0%}: accuracy {pruned_acc:.1f}% after pruning, {rows[-1]['acc']:.1f}% "
                f"after {config.finetune} epochs of fine-tuning; compact vs masked max diff "
                f"{diff:.1e} (compact_graph: {graph_diff:.1e})"
            )
        model.load_state_dict({**dense, **buffers})
    torch.set_num_threads(threads)
    inputs = {f"batch {b}": x_tr[:b] for b in config.batches}
    if config.batch not in config.batches:
        inputs[f"batch {config.batch}"] = x_tr[: config.batch]
    size = config.other_size
    bigger = nn.functional.interpolate(x_tr[:64], size=(size, size), mode="bilinear")
    inputs[f"batch 64, {size}x{size}"] = bigger
    times = {name: best_times(fns, x, config.repeats, clock) for name, x in inputs.items()}
    for row in rows:
        route = "dense" if row["amount"] == 0.0 else "module"
        row["time"] = times[f"batch {config.batch}"][(row["amount"], route)]
        row["routes"] = {
            r: {name: t[(row["amount"], r)] for name, t in times.items()}
            for r in ("dense", "module", "graph")
            if (row["amount"], r) in fns
        }
    return rows


def gpt2_check(
    layers: int = 12,
    width: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    tokens: int = 20,
    repeats: int = 5,
    progress=print,
    clock: str = "wall",
) -> dict:
    """GPT-2 (124M with the default 12 layers; random init from a config, nothing downloaded):
    time of ``groups``; both compacted models vs the masked one with half the heads and MLP
    widths pruned; ``tokens`` greedy tokens (KV cache) from the compacted and the masked model;
    forward times of both routes at two input sizes."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        vocab_size=vocab,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    kwargs = {"input_ids": torch.randint(0, config.vocab_size, (2, 8))}
    start, cpu = time.perf_counter(), time.process_time()
    structure = fprune.structure.groups(model, (), kwargs)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.group_structured(params, 0.5, structure)
    build = {}
    start, cpu_start = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:  # GPT2Config cannot describe fewer heads
        warnings.simplefilter("always")
        small = fprune.compact(model, params, masks, structure, (), kwargs)
    build["compact"] = (time.perf_counter() - start, time.process_time() - cpu_start)
    config_note = "; ".join(str(w.message).split(" (")[0] for w in caught)
    start, cpu_start = time.perf_counter(), time.process_time()
    graph = fprune.compact_graph(model, params, masks, structure, (), kwargs)
    build["compact_graph"] = (time.perf_counter() - start, time.process_time() - cpu_start)
    masked = copy.deepcopy(model)  # the masked model, for generate: pruned entries zeroed
    masked.load_state_dict(fprune.apply_masks(params, masks), strict=False)
    other = torch.randint(0, config.vocab_size, (3, 11))  # another batch and sequence length
    with torch.no_grad():
        want = masked(input_ids=other).logits
        diff = float((small(input_ids=other).logits - want).abs().max())
        graph_diff = float((graph(input_ids=other).logits - want).abs().max())
    prompt = torch.randint(0, config.vocab_size, (1, 5))
    generate = dict(
        max_new_tokens=tokens,
        do_sample=False,
        use_cache=True,
        attention_mask=torch.ones_like(prompt),
        pad_token_id=0,
    )
    small_tokens = small.generate(prompt, **generate)[0, prompt.shape[1] :].tolist()
    masked_tokens = masked.generate(prompt, **generate)[0, prompt.shape[1] :].tolist()
    fns = {
        "dense": lambda ids: model(input_ids=ids).logits,
        "module": lambda ids: small(input_ids=ids).logits,
        "graph": lambda ids: graph(input_ids=ids).logits,
    }
    times = {}
    for b, t in ((1, 32), (8, 128)):
        ids = torch.randint(0, config.vocab_size, (b, t))
        times[f"batch {b} x {t} tokens"] = best_times(fns, ids, repeats, clock)
    result = dict(
        groups_s=seconds,
        groups_cpu_s=cpu,
        groups=len(structure.groups),
        prunable=sum(g.prunable for g in structure.groups),
        max_diff=diff,
        graph_max_diff=graph_diff,
        params=sum(p.numel() for p in params.values()),
        small_params=sum(p.numel() for p in small.parameters()),
        small_tokens=small_tokens,
        masked_tokens=masked_tokens,
        times=times,
        config_note=config_note,
        build=build,
        same_class=type(small) is type(model),
    )
    if progress:
        progress(
            f"GPT-2 ({layers} layers): groups in {seconds:.1f} s wall, {cpu:.1f} s CPU "
            f"({torch.get_num_threads()} threads; {result['groups']} groups, "
            f"{result['prunable']} prunable); 50% of heads and MLP widths: "
            f"{result['params']:,} -> {result['small_params']:,} parameters "
            f"({type(small).__name__}); at batch 3 x 11 tokens, compact vs masked logits max "
            f"diff {diff:.1e} (compact_graph: {graph_diff:.1e})"
        )
        progress(
            "  built in: "
            + ", ".join(f"{name} {w:.1f} s wall, {c:.1f} s CPU" for name, (w, c) in build.items())
        )
        progress(f"  {tokens} greedy tokens, compact: {small_tokens}")
        progress(
            f"  {tokens} greedy tokens, masked:  {masked_tokens} "
            f"({'equal' if small_tokens == masked_tokens else 'DIFFERENT'})"
        )
        for name, t in times.items():
            progress(
                f"  forward ({clock} time), {name}: dense {t['dense'] * 1e3:.1f} ms, compact "
                f"{t['module'] * 1e3:.1f} ms, compact_graph {t['graph'] * 1e3:.1f} ms "
                f"(module / graph {t['module'] / t['graph']:.2f}x)"
            )
        if config_note:
            progress(f"  {config_note}")
    return result


def table(rows: list[dict], threads: int, batch: int, clock: str = "wall") -> str:
    dense = rows[0]
    how = f"{threads} threads" + (", CPU time" if clock == "cpu" else "")
    lines = [
        (
            f"| channels pruned | test accuracy "
            f"| after pruning, before fine-tuning | parameters | FLOPs / image "
            f"| forward, batch {batch} ({how}) | time vs dense | FLOPs vs dense |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        before = "-" if r["pruned_acc"] is None else f"{r['pruned_acc']:.1f}%"
        lines.append(
            f"| {r['amount']:.0%} | {r['acc']:.1f}% | {before} "
            f"| {r['params']:,} | {r['flops'] / 1e6:.2f} M | "
            f"{r['time'] * 1e3:.2f} ms "
            f"| {r['time'] / dense['time']:.2f}x | {r['flops'] / dense['flops']:.2f}x |"
        )
    return "\n".join(lines)


def route_table(rows: list[dict], threads: int, clock: str = "wall") -> str:
    """Forward times of the dense model and of both routes, at every input measured."""
    names = list(rows[0]["routes"]["dense"])
    lines = [
        f"| channels pruned | model | {' | '.join(names)} |",
        "|---:|---|" + "---:|" * len(names),
    ]
    label = {
        "dense": "dense (the trained model)",
        "module": "`compact` (a `ResNet`)",
        "graph": "`compact_graph` (a `GraphModule`)",
    }
    for r in rows:
        for route, t in r["routes"].items():
            cells = " | ".join(f"{t[n] * 1e3:.2f} ms" for n in names)
            lines.append(f"| {r['amount']:.0%} | {label[route]} | {cells} |")
        if "graph" in r["routes"]:
            m, g = r["routes"]["module"], r["routes"]["graph"]
            cells = " | ".join(f"{m[n] / g[n]:.2f}x" for n in names)
            lines.append(f"| {r['amount']:.0%} | module / graph | {cells} |")
    what = "CPU time of the calling thread" if clock == "cpu" else "wall time"
    return "\n".join(lines) + f"\n\n({what}, {threads} threads; best of the repeats, all models side by side)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short configuration (for tests)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--table", help="also write the markdown table to this file")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: the calling thread's CPU time (with --threads 1, "
        "the forward's own compute, steady on a loaded machine)",
    )
    parser.add_argument(
        "--gpt2",
        action="store_true",
        help="only the GPT-2 check: groups time, compact == masked, generate, route "
        "timings (needs transformers)",
    )
    args = parser.parse_args(argv)
    if args.gpt2:
        torch.set_num_threads(args.threads)
        gpt2_check(
            **(dict(layers=2, width=64, heads=4, vocab=128, repeats=2) if args.quick else {}),
            clock=args.clock,
        )
        return 0
    config = Config.quick() if args.quick else Config()
    start = time.perf_counter()
    rows = run(config, args.threads, clock=args.clock)
    text = table(rows, args.threads, config.batch, args.clock)
    text += "\n\n" + route_table(rows, args.threads, args.clock)
    print(text)
    print(f"(total {time.perf_counter() - start:.0f} s)")
    if args.table:
        with open(args.table, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
