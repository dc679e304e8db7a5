"""Lottery tickets on real data: iterative magnitude pruning with rewinding, trained with torch.func.

The experiment of Frankle & Carbin (2019), "The Lottery Ticket Hypothesis", on scikit-learn's
bundled digits dataset (1,797 real 8x8 images of handwritten digits; it ships inside
scikit-learn, nothing is downloaded):

1. Initialise an MLP (64-128-64-10) for several seeds at once, as one stacked model
   (``torch.func.stack_module_state``), and keep those initial weights.
2. Train every seed at once: ``torch.func.vmap`` of ``torch.func.grad`` of a loss computed
   through ``fprune.masked_call``, with a small functional Adam. Gradients are zero at pruned
   entries, so pruned weights never come back.
3. Prune 20% of the remaining weights (biases are never pruned: ``where=``), rewind the
   surviving weights to their initial values, and train again. Repeat down to about 1.4% of the
   weights.

Three ways of choosing what to prune are compared, all with the same seeds and data:

* ``global magnitude``: ``fprune.global_unstructured`` - one ranking across all layers;
* ``layer-wise magnitude``: ``fprune.l1_unstructured`` - 20% of each layer;
* ``random``: ``fprune.random_unstructured`` - 20% of each layer, chosen at random with a
  stateless seed, batched under ``vmap``.

The three methods' models are trained together as one stacked model too (methods x seeds).

Run (about 40 s on one thread of a 2-core machine; prints a line per round, then a markdown table):

    python examples/lottery_ticket.py --plot lottery.png

``--quick`` runs a short configuration (the one the tests use). Needs the ``examples`` extra:
``pip install "fprune[examples]"`` (scikit-learn, matplotlib).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch.func import grad, stack_module_state, vmap

import fprune

METHODS = ("global magnitude", "layer-wise magnitude", "random")

Params = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that determines a run (the results are a function of it and the thread count)."""

    hidden: Sequence[int] = (128, 64)
    seeds: int = 5
    rounds: int = 19  # 0.8 ** 19 = 1.4% of the weights remain after the last round
    rate: float = 0.2  # fraction of the remaining weights pruned per round
    epochs: int = 20
    batch_size: int = 128
    lr: float = 2e-3
    test_size: float = 0.25
    data_seed: int = 0

    @classmethod
    def quick(cls) -> Config:
        """A short run for tests: 2 seeds, 6 rounds of 50% (down to 1.6%), fewer epochs."""
        return cls(seeds=2, rounds=6, rate=0.5, epochs=10)


@dataclasses.dataclass
class Result:
    """Test accuracy and weights remaining, per method: tensors of shape ``[rounds + 1, seeds]``."""

    config: Config
    total_weights: int
    accuracy: dict[str, torch.Tensor]
    remaining: dict[str, torch.Tensor]  # count of unpruned weights (biases excluded)
    seconds: float

    def fraction(self, method: str) -> torch.Tensor:
        """Fraction of weights remaining per round (the same for every seed): shape ``[rounds + 1]``."""
        return self.remaining[method][:, 0].double() / self.total_weights


def is_weight(name: str, tensor: torch.Tensor) -> bool:
    """The ``where=`` predicate: prune the weight matrices, never the biases."""
    return name.endswith("weight")


def load_digits_split(config: Config):
    """Digits scaled to [0, 1], split (stratified, fixed seed) into train and test tensors."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=config.test_size, random_state=config.data_seed, stratify=y
    )
    return x_train, y_train, x_test, y_test


def make_mlp(hidden: Sequence[int]) -> torch.nn.Sequential:
    """The network: 64 inputs, ReLU hidden layers, 10 classes."""
    sizes = [64, *hidden]
    layers: list[torch.nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(sizes[-1], 10))
    return torch.nn.Sequential(*layers)


def initial_models(config: Config):
    """One MLP per seed, stacked: a parameter-less ``meta`` copy to call, and ``{name: [seeds, ...]}``."""
    models = []
    for seed in range(config.seeds):
        torch.manual_seed(seed)
        models.append(make_mlp(config.hidden))
    params, _ = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    return base, {name: p.detach() for name, p in params.items()}


def train(base, init: Params, masks: Params, data, config: Config, round_: int) -> Params:
    """Train a stack of models (leading dim) at once from ``init``; pruned entries stay put.

    Every model sees the same mini-batches, in an order fixed by the round number.
    """
    x_train, y_train = data

    def loss(params, masks, x, y):
        logits = fprune.masked_call(base, params, masks, (x,))
        return torch.nn.functional.cross_entropy(logits, y)

    grads_of = vmap(grad(loss), in_dims=(0, 0, None, None))
    params = dict(init)
    first = {name: torch.zeros_like(p) for name, p in params.items()}
    second = {name: torch.zeros_like(p) for name, p in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    order = torch.Generator().manual_seed(1000 + round_)
    n, step = x_train.shape[0], 0
    for _ in range(config.epochs):
        permutation = torch.randperm(n, generator=order)
        for start in range(0, n, config.batch_size):
            batch = permutation[start : start + config.batch_size]
            grads = grads_of(params, masks, x_train[batch], y_train[batch])
            step += 1
            correction1, correction2 = 1 - beta1**step, 1 - beta2**step
            for name, g in grads.items():
                first[name].mul_(beta1).add_(g, alpha=1 - beta1)
                second[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                update = (first[name] / correction1) / ((second[name] / correction2).sqrt() + eps)
                params[name] = params[name] - config.lr * update
    return params


def accuracy(base, params: Params, masks: Params, x, y) -> torch.Tensor:
    """Test accuracy of every model of the stack: shape ``[models]``."""
    logits = vmap(lambda p, m: fprune.masked_call(base, p, m, (x,)))(params, masks)
    return (logits.argmax(-1) == y).double().mean(-1)


def prune(method: str, params: Params, masks: Params, rate: float, seeds: torch.Tensor) -> Params:
    """One round of pruning of a stack of models (vmapped over the leading dim)."""
    if method == "global magnitude":
        fn = lambda p, m, s: fprune.global_unstructured(p, rate, masks=m, where=is_weight)
    elif method == "layer-wise magnitude":
        fn = lambda p, m, s: fprune.l1_unstructured(p, rate, masks=m, where=is_weight)
    elif method == "random":
        fn = lambda p, m, s: fprune.random_unstructured(p, rate, generator=s, masks=m, where=is_weight)
    else:
        raise ValueError(f"Expected method to be one of {METHODS}, got {method!r}.")
    return vmap(fn)(params, masks, seeds)


def _stack(trees: Sequence[Params]) -> Params:
    return {name: torch.cat([tree[name] for tree in trees]) for name in trees[0]}


def _split(tree: Params, parts: int) -> list[Params]:
    chunks = {name: t.chunk(parts) for name, t in tree.items()}
    return [{name: c[i] for name, c in chunks.items()} for i in range(parts)]


def run(config: Config = Config(), progress: Callable[[str], None] | None = print) -> Result:
    """The whole sweep: every method, every round, every seed. Deterministic for a thread count."""
    started = time.perf_counter()
    x_train, y_train, x_test, y_test = load_digits_split(config)
    base, init = initial_models(config)
    n_methods = len(METHODS)
    all_true = {name: torch.ones_like(p, dtype=torch.bool) for name, p in init.items()}
    masks = dict.fromkeys(METHODS, all_true)
    total = sum(p[0].numel() for name, p in init.items() if is_weight(name, p))
    accuracy_log = {method: [] for method in METHODS}
    remaining_log = {method: [] for method in METHODS}
    for round_ in range(config.rounds + 1):
        if round_ == 0:  # all methods start from the same dense network: train it once
            trained = train(base, init, all_true, (x_train, y_train), config, round_)
            per_method = [trained] * n_methods
        else:
            stacked_masks = _stack([masks[m] for m in METHODS])
            stacked_init = _stack([init] * n_methods)
            trained = train(base, stacked_init, stacked_masks, (x_train, y_train), config, round_)
            per_method = _split(trained, n_methods)
        for method, params in zip(METHODS, per_method, strict=True):
            accuracy_log[method].append(accuracy(base, params, masks[method], x_test, y_test))
            kept = [m.flatten(1).sum(1) for name, m in masks[method].items() if is_weight(name, m)]
            remaining_log[method].append(torch.stack(kept).sum(0))
        if progress is not None:
            fraction = float(remaining_log[METHODS[0]][-1][0]) / total
            scores = "  ".join(
                f"{method} {100 * float(accuracy_log[method][-1].mean()):5.1f}%" for method in METHODS
            )
            progress(
                f"round {round_:2d}/{config.rounds}  weights {100 * fraction:6.2f}%  {scores}"
                f"  [{time.perf_counter() - started:5.1f} s]"
            )
        if round_ == config.rounds:
            break
        # Prune the trained weights; the next round rewinds the survivors to their initial values.
        random_seeds = torch.arange(config.seeds) * 1000 + round_
        for method, params in zip(METHODS, per_method, strict=True):
            masks[method] = prune(method, params, masks[method], config.rate, random_seeds)
    return Result(
        config=config,
        total_weights=total,
        accuracy={m: torch.stack(accuracy_log[m]) for m in METHODS},
        remaining={m: torch.stack(remaining_log[m]) for m in METHODS},
        seconds=time.perf_counter() - started,
    )


def markdown_table(result: Result) -> str:
    """Test accuracy (mean +- std over seeds, in %) against the weights remaining, per method."""
    seeds = result.config.seeds
    header = "| weights remaining | " + " | ".join(METHODS) + " |"
    lines = [header, "|" + "---:|" * (len(METHODS) + 1)]
    fraction = result.fraction(METHODS[0])
    for r in range(result.config.rounds + 1):
        cells = []
        for method in METHODS:
            acc = 100 * result.accuracy[method][r]
            spread = f" ± {float(acc.std()):.1f}" if seeds > 1 else ""
            cells.append(f"{float(acc.mean()):.1f}{spread}")
        lines.append(f"| {100 * float(fraction[r]):.2f}% | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: Result, path: str) -> None:
    """Accuracy against weights remaining (log scale, densest on the left) as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for method, marker in zip(METHODS, "osv", strict=True):
        x = 100 * result.fraction(method).numpy()
        acc = 100 * result.accuracy[method]
        mean, std = acc.mean(1).numpy(), (acc.std(1) if result.config.seeds > 1 else 0 * acc.mean(1)).numpy()
        ax.plot(x, mean, marker=marker, markersize=4, label=method)
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.axhline(10, color="grey", linestyle=":", linewidth=1, label="chance (10 classes)")
    ax.set_xscale("log")
    ticks = [t for t in (100, 50, 20, 10, 5, 2, 1) if t >= 100 * float(result.fraction(METHODS[0])[-1]) * 0.9]
    ax.set_xticks(ticks, [f"{t}" for t in ticks])
    ax.minorticks_off()
    ax.invert_xaxis()
    ax.set_xlabel("weights remaining (%)")
    ax.set_ylabel("test accuracy (%)")
    c = result.config
    ax.set_title(
        f"Iterative magnitude pruning with rewinding, digits MLP {'-'.join(map(str, [64, *c.hidden, 10]))}\n"
        f"{c.rate:.0%} of remaining weights per round, mean ± std over {c.seeds} seeds",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", metavar="PATH", help="write the accuracy plot (PNG) here")
    parser.add_argument("--table", metavar="PATH", help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="short configuration (for tests)")
    parser.add_argument("--seeds", type=int, help="models trained at once per method")
    parser.add_argument("--rounds", type=int, help="rounds of pruning")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1: the ops are small, one thread is fastest here)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = Config.quick() if args.quick else Config()
    overrides = {k: v for k, v in (("seeds", args.seeds), ("rounds", args.rounds)) if v is not None}
    config = dataclasses.replace(config, **overrides)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {config}", flush=True)
    result = run(config, progress=lambda line: print(line, flush=True))
    table = markdown_table(result)
    print()
    print(table)
    print(f"\n{result.seconds:.1f} s")
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    if args.plot:
        plot(result, args.plot)
        print(f"plot written to {args.plot}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
