"""Pruning at initialization and one-shot pruning after training, with fprune.scores, on real data.

The MLP (64-128-64-10) and the data of ``examples/lottery_ticket.py`` (scikit-learn's bundled
digits, nothing downloaded), 5 seeds stacked into one model and trained at once with
``vmap(grad(...))``. Two experiments, at compressions 2x, 10x, 100x and 1000x (1/2, 1/10,
1/100 and 1/1000 of the 17,024 weights kept; biases are never pruned):

* **At initialization, then trained**: the weights to keep are chosen before any training by

  - ``random``: a global ranking of uniform random scores;
  - ``magnitude``: global magnitude (``fprune.global_unstructured``);
  - ``SNIP``: ``|g * p|`` (``fprune.scores.snip``), one global ranking;
  - ``GraSP``: ``p * (H g)`` (``fprune.scores.grasp``), the lowest *values* pruned (``signed=True``);
  - ``SynFlow``: data-free, 100 rounds on an exponential schedule (``fprune.iterative`` over
    ``fprune.scores.synflow``);

  then every sparse network is trained from its initial weights (the 100 models of 5 methods x
  4 compressions x 5 seeds as one stacked model).
* **After training, one shot, no retraining**: the dense networks are trained, then pruned by

  - ``magnitude``: global magnitude;
  - ``OBD``: ``0.5 * F * p**2`` with the empirical Fisher ``F`` (``fprune.scores.obd``), global;
  - ``Wanda``: ``|W| * ||X_j||`` (``fprune.calibration.input_norms`` on the training inputs,
    ``fprune.scores.wanda``), compared within each output row (``fprune.rowwise_unstructured``:
    each row keeps ``round(n / compression)`` of its ``n`` weights, so the total is close to,
    not exactly, the target; the table shows what it kept).

The table gives the test accuracy (mean ± std over seeds) and the fraction of layers left with
no weight at all (*layer collapse*: the network then outputs a constant). Run (about a minute on
one thread of a 2-core machine)::

    python examples/pruning_at_init.py --plot pruning_at_init.png

``--quick`` runs a short configuration (the one the tests use). Needs the ``examples`` extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

import fprune

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import lottery_ticket as lt

AT_INIT = ("random", "magnitude", "SNIP", "GraSP", "SynFlow")
POST_TRAINING = ("magnitude", "OBD", "Wanda (per row)")

Params = dict[str, torch.Tensor]
is_weight = lt.is_weight


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that determines a run (the results are a function of it and the thread count)."""

    hidden: Sequence[int] = (128, 64)
    seeds: int = 5
    compressions: Sequence[int] = (2, 10, 100, 1000)
    synflow_rounds: int = 100
    score_examples: int = 256  # training examples the SNIP and GraSP scores see (one batch)
    epochs: int = 20
    batch_size: int = 128
    lr: float = 2e-3

    @classmethod
    def quick(cls) -> Config:
        """A short run for tests: 2 seeds, 20 SynFlow rounds, fewer epochs."""
        return cls(seeds=2, synflow_rounds=20, epochs=8)

    def training(self) -> lt.Config:
        return lt.Config(
            hidden=tuple(self.hidden),
            seeds=self.seeds,
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
        )


@dataclasses.dataclass
class Result:
    """Per (phase, method): tensors of shape ``[compressions, seeds]``."""

    config: Config
    total_weights: int
    dense_accuracy: torch.Tensor  # [seeds]
    accuracy: dict[tuple, torch.Tensor]
    collapsed: dict[tuple, torch.Tensor]  # fraction of weight layers with no weight left
    kept: dict[tuple, torch.Tensor]  # weights kept
    seconds: float


def _loss_fn(base):
    def loss_fn(params, batch):
        x, y = batch
        return F.cross_entropy(functional_call(base, params, (x,)), y)

    return loss_fn


def masks_at_init(method: str, base, init: Params, amount: float, data, config: Config) -> Params:
    """Masks of every seed (leading dim) for one method and one amount, before any training."""
    x_train, y_train = data
    batch = (x_train[: config.score_examples], y_train[: config.score_examples])
    loss_fn = _loss_fn(base)
    prune = lambda p, s, signed=False: fprune.global_unstructured(
        p, amount, importance_scores=s, where=is_weight, signed=signed
    )
    if method == "random":
        g = torch.Generator().manual_seed(12345)
        draws = {k: torch.rand(v.shape, generator=g) for k, v in init.items()}
        return vmap(prune)(init, draws)
    if method == "magnitude":
        return vmap(lambda p: fprune.global_unstructured(p, amount, where=is_weight))(init)
    if method == "SNIP":
        scores = vmap(lambda p: fprune.scores.snip(loss_fn, p, [batch]))(init)
        return vmap(prune)(init, scores)
    if method == "GraSP":
        scores = vmap(lambda p: fprune.scores.grasp(loss_fn, p, [batch]))(init)
        return vmap(lambda p, s: prune(p, s, signed=True))(init, scores)
    if method == "SynFlow":  # iterative counts in eager code: one seed at a time
        ones = torch.ones(1, 64)
        per_seed = []
        for i in range(config.seeds):
            p = {k: v[i] for k, v in init.items()}
            per_seed.append(
                fprune.iterative(
                    lambda m, *, p=p: fprune.scores.synflow(base, p, ones, masks=m),
                    p,
                    amount,
                    rounds=config.synflow_rounds,
                    where=is_weight,
                )
            )
        return {k: torch.stack([m[k] for m in per_seed]) for k in init}
    raise ValueError(f"Expected method to be one of {AT_INIT}, got {method!r}.")


def masks_after_training(method: str, base, trained: Params, amount: float, data) -> Params:
    """One-shot masks of every seed (leading dim) for one method and one amount."""
    x_train, y_train = data
    if method == "magnitude":
        return vmap(lambda p: fprune.global_unstructured(p, amount, where=is_weight))(trained)
    if method == "OBD":
        batches = list(zip(x_train.split(256), y_train.split(256), strict=True))
        scores = vmap(lambda p: fprune.scores.obd(_loss_fn(base), p, batches))(trained)
        return vmap(lambda p, s: fprune.global_unstructured(p, amount, importance_scores=s, where=is_weight))(
            trained, scores
        )
    if method == "Wanda (per row)":  # calibration runs hooks: one seed at a time
        per_seed = []
        for i in range(trained["0.weight"].shape[0]):
            p = {k: v[i] for k, v in trained.items()}
            norms = fprune.calibration.input_norms(base, p, [x_train])
            scores = fprune.scores.wanda(p, norms)
            per_seed.append(fprune.rowwise_unstructured(p, amount, importance_scores=scores, where=is_weight))
        return {k: torch.stack([m[k] for m in per_seed]) for k in trained}
    raise ValueError(f"Expected method to be one of {POST_TRAINING}, got {method!r}.")


def layer_stats(masks: Params):
    """Weights kept and fraction of weight layers with none left, per model: ``[models]`` each."""
    per_layer = torch.stack([m.flatten(1).sum(1) for k, m in masks.items() if is_weight(k, m)])
    return per_layer.sum(0), (per_layer == 0).double().mean(0)


def _stack(trees: Sequence[Params]) -> Params:
    return {k: torch.cat([t[k] for t in trees]) for k in trees[0]}


def _split(tree: Params, parts: int) -> list[Params]:
    chunks = {k: t.chunk(parts) for k, t in tree.items()}
    return [{k: c[i] for k, c in chunks.items()} for i in range(parts)]


def run(config: Config = Config(), progress: Callable[[str], None] | None = print) -> Result:
    """Both experiments, every method, compression and seed. Deterministic for a thread count."""
    started = time.perf_counter()
    say = progress or (lambda line: None)
    training = config.training()
    x_train, y_train, x_test, y_test = lt.load_digits_split(training)
    base, init = lt.initial_models(training)
    base = lt.make_mlp(config.hidden)  # a real module for the hooks of calibration (params are passed in)
    total = sum(v[0].numel() for k, v in init.items() if is_weight(k, v))
    amounts = [1.0 - 1.0 / c for c in config.compressions]
    accuracy, collapsed, kept = {}, {}, {}

    # 1. At initialization: choose the masks, then train all sparse networks as one stack.
    keys, stacks = [], []
    for method in AT_INIT:
        for c, amount in zip(config.compressions, amounts, strict=True):
            keys.append((method, c))
            stacks.append(masks_at_init(method, base, init, amount, (x_train, y_train), config))
        say(f"at init: {method} masks  [{time.perf_counter() - started:5.1f} s]")
    all_masks = _stack(stacks)
    trained = lt.train(base, _stack([init] * len(stacks)), all_masks, (x_train, y_train), training, 0)
    say(
        f"at init: {len(stacks) * config.seeds}"
        f" sparse models trained  [{time.perf_counter() - started:5.1f} s]"
    )
    acc = lt.accuracy(base, trained, all_masks, x_test, y_test).view(len(stacks), config.seeds)
    n_kept, gone = (t.view(len(stacks), config.seeds) for t in layer_stats(all_masks))
    for i, (method, _c) in enumerate(keys):
        accuracy.setdefault(("at init", method), []).append(acc[i])
        collapsed.setdefault(("at init", method), []).append(gone[i])
        kept.setdefault(("at init", method), []).append(n_kept[i])

    # 2. After training: the dense networks, pruned once, not retrained.
    all_true = {k: torch.ones_like(v, dtype=torch.bool) for k, v in init.items()}
    dense = lt.train(base, init, all_true, (x_train, y_train), training, 0)
    dense_accuracy = lt.accuracy(base, dense, all_true, x_test, y_test)
    for method in POST_TRAINING:
        for amount in amounts:
            masks = masks_after_training(method, base, dense, amount, (x_train, y_train))
            n_kept, gone = layer_stats(masks)
            accuracy.setdefault(("after training", method), []).append(
                lt.accuracy(base, dense, masks, x_test, y_test)
            )
            collapsed.setdefault(("after training", method), []).append(gone)
            kept.setdefault(("after training", method), []).append(n_kept)
        say(f"after training: {method}  [{time.perf_counter() - started:5.1f} s]")
    stack = lambda d: {k: torch.stack(v) for k, v in d.items()}
    return Result(
        config,
        total,
        dense_accuracy,
        stack(accuracy),
        stack(collapsed),
        stack(kept),
        time.perf_counter() - started,
    )


def markdown_table(result: Result) -> str:
    """Accuracy (mean ± std, %) and layer collapse per phase, method and compression."""
    comps = result.config.compressions
    head = "| pruned | method | " + " | ".join(f"{c}x: accuracy | {c}x: collapsed" for c in comps) + " |"
    lines = [head, "|---|---|" + "---:|---:|" * len(comps)]
    for (phase, method), acc in result.accuracy.items():
        cells = []
        for j, c in enumerate(comps):
            a = 100 * acc[j]
            spread = f" ± {float(a.std()):.1f}" if a.numel() > 1 else ""
            kept = result.kept[(phase, method)][j].double().mean()
            note = (
                "" if abs(float(kept) - round(result.total_weights / c)) < 1 else f" ({float(kept):.0f} kept)"
            )
            cells.append(f"{float(a.mean()):.1f}{spread}{note}")
            cells.append(f"{100 * float(result.collapsed[(phase, method)][j].mean()):.0f}%")
        lines.append(f"| {phase} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: Result, path: str) -> None:
    """Accuracy against compression, one panel per phase; collapsed runs marked with a cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = list(result.config.compressions)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=110, sharey=True)
    for ax, phase, title in zip(
        axes,
        ("at init", "after training"),
        ("pruned at initialization, then trained", "pruned after training, no retraining"),
        strict=True,
    ):
        for (ph, method), acc in result.accuracy.items():
            if ph != phase:
                continue
            a = 100 * acc
            mean = a.mean(1).numpy()
            std = a.std(1).numpy() if a.shape[1] > 1 else 0 * mean
            line = ax.errorbar(comps, mean, yerr=std, marker="o", markersize=4, capsize=3, label=method)
            gone = result.collapsed[(ph, method)].mean(1).numpy() > 0
            if gone.any():
                ax.scatter(
                    [c for c, g in zip(comps, gone, strict=True) if g],
                    mean[gone],
                    marker="x",
                    s=80,
                    color=line[0].get_color(),
                    zorder=5,
                )
        ax.axhline(
            100 * float(result.dense_accuracy.mean()),
            color="black",
            linewidth=1,
            linestyle="--",
            label="dense, trained",
        )
        ax.axhline(10, color="grey", linestyle=":", linewidth=1, label="chance")
        ax.set_xscale("log")
        ax.set_xticks(comps, [f"{c}x" for c in comps])
        ax.minorticks_off()
        ax.set_xlabel("compression (weights / weights kept)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("test accuracy (%)")
    fig.suptitle(
        f"digits MLP {'-'.join(map(str, [64, *result.config.hidden, 10]))}, mean ± std over "
        f"{result.config.seeds} seeds; x: some layer left with no weight (layer collapse)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", metavar="PATH", help="write the accuracy plot (PNG) here")
    parser.add_argument("--table", metavar="PATH", help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="short configuration (for tests)")
    parser.add_argument("--seeds", type=int, help="models per method and compression")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = Config.quick() if args.quick else Config()
    if args.seeds is not None:
        config = dataclasses.replace(config, seeds=args.seeds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {config}", flush=True)
    result = run(config, progress=lambda line: print(line, flush=True))
    table = markdown_table(result)
    dense = 100 * result.dense_accuracy
    print(f"\ndense, trained: {float(dense.mean()):.1f} ± {float(dense.std()):.1f}%\n")
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
