"""Sparse training on real data: static sparse, SET, RigL, gradual magnitude and lottery tickets.

The digits MLP of ``examples/lottery_ticket.py`` (64-128-64-10 on scikit-learn's bundled 8x8
digits; nothing is downloaded), trained for several seeds at once in one ``torch.func.vmap``,
at 90% and 98% of the weights pruned (biases stay dense), by:

* ``dense``: no pruning (the reference);
* ``static (ERK)``: random masks at ERK's per-layer sparsities, fixed for the whole run;
* ``SET``: the same start, every ``every`` steps each layer drops its smallest weights and
  regrows as many at random (``fprune.sparse_evolutionary``);
* ``RigL``: the same, regrowing where the dense gradient is largest (``fprune.rigl``);
* ``gradual magnitude``: dense at first, pruned by global magnitude along Zhu & Gupta's cubic
  schedule (``fprune.gradual_magnitude``);
* ``lottery ticket``: iterative global magnitude pruning with rewinding to the initial
  weights (the existing example's functions), in ``--lt-rounds`` rounds.

Every pruner is a pure ``(init, update)`` pair; its state is ``vmap``-ped over the seeds like
the parameters. One training step: the dense gradient through ``masked_call(...,
straight_through=True)`` feeds the pruner's ``update``; the optimizer (a small functional
Adam) gets the gradient masked by the new masks; regrown weights and their Adam moments start
at zero (``fprune.zero_regrown``); the weights are stored pruned.

Run (about 50 s on one thread of a 2-core machine; prints a markdown table):

    python examples/sparse_training.py --plot sparse_training.png

Needs the ``examples`` extra (scikit-learn, matplotlib).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import pathlib
import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch.func import grad, vmap

import fprune
from fprune import schedules

_LT_PATH = pathlib.Path(__file__).resolve().parent / "lottery_ticket.py"
_spec = importlib.util.spec_from_file_location("lottery_ticket", _LT_PATH)
lt = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("lottery_ticket", lt)
_spec.loader.exec_module(lt)

METHODS = ("dense", "static (ERK)", "SET", "RigL", "gradual magnitude", "lottery ticket")
Params = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that determines a run (the results are a function of it and the thread count)."""

    hidden: Sequence[int] = (128, 64)
    seeds: int = 5
    sparsities: Sequence[float] = (0.9, 0.98)
    epochs: int = 40
    batch_size: int = 128
    lr: float = 3e-3
    every: int = 10  # mask updates (SET, RigL, gradual magnitude) every `every` steps
    drop_fraction: float = 0.3  # RigL/SET initial drop fraction, cosine-decayed to 0 at `end`
    update_end: float = 0.75  # fraction of the steps after which masks stop changing
    lt_rounds: int = 5
    eval_every: int = 20
    test_size: float = 0.25
    data_seed: int = 0

    @classmethod
    def quick(cls) -> Config:
        """A short run for tests."""
        return cls(seeds=3, epochs=12, lt_rounds=2, eval_every=20)

    def lt_config(self):
        return lt.Config(
            hidden=tuple(self.hidden),
            seeds=self.seeds,
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            test_size=self.test_size,
            data_seed=self.data_seed,
        )


@dataclasses.dataclass
class Result:
    """Final test accuracy ``[seeds]`` and accuracy curves ``[evals, seeds]`` per (sparsity, method)."""

    config: Config
    accuracy: dict[tuple, torch.Tensor]
    curves: dict[tuple, torch.Tensor]
    eval_steps: list[int]
    sparsity: dict[tuple, float]  # measured fraction of weights pruned (seed 0)
    layer_counts: dict[tuple, list[dict[str, int]]]  # kept weights per layer at every eval, seed 0
    seconds: float


def is_weight(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith("weight")


def make_pruner(method: str, sparsity: float, total_steps: int, config: Config, seed):
    end = max(1, int(config.update_end * total_steps))
    drop = functools.partial(schedules.cosine_decay, initial=config.drop_fraction, end=end)
    if method == "static (ERK)":
        return fprune.sparse_evolutionary(
            sparsity, distribution="erk", drop_fraction=0.0, every=1, end=1, seed=seed
        )
    if method == "SET":
        return fprune.sparse_evolutionary(
            sparsity, distribution="erk", drop_fraction=drop, every=config.every, end=end, seed=seed
        )
    if method == "RigL":
        return fprune.rigl(
            sparsity, distribution="erk", drop_fraction=drop, every=config.every, end=end, seed=seed
        )
    if method == "gradual magnitude":
        schedule = functools.partial(schedules.polynomial, final=sparsity, end=max(1, int(0.6 * total_steps)))
        return fprune.gradual_magnitude(schedule, every=config.every)
    raise ValueError(f"Expected a sparse-training method, got {method!r}.")


def train(base, init: Params, pruner, state, data, config: Config, record=None):
    """Train a stack of models (one per seed) from ``init``.

    ``pruner`` is None for dense training; otherwise ``state`` is its state stacked over the
    seeds. Returns the trained params, the final masks and the test accuracy every
    ``eval_every`` steps (``[evals, seeds]``); ``record`` collects seed 0's kept weights per
    layer at every evaluation.
    """
    x_train, y_train, x_test, y_test = data

    def loss(params, masks, x, y):
        logits = fprune.masked_call(base, params, masks, (x,), straight_through=True)
        return torch.nn.functional.cross_entropy(logits, y)

    grads_of = vmap(grad(loss), in_dims=(0, 0, None, None))
    if pruner is None:
        masks = {k: torch.ones_like(v, dtype=torch.bool) for k, v in init.items()}
    else:
        # all seeds step together: an unbatched state.step lets update skip non-update steps
        dims = type(state)(**{f: None if f == "step" else 0 for f in state._fields})
        update = vmap(
            lambda p, st, g: pruner.update(p, st, grads=g), in_dims=(0, dims, 0), out_dims=(0, dims)
        )
        state = state._replace(step=state.step[0])
        masks = state.masks
    params = {k: v * masks[k] for k, v in init.items()}
    first = {k: torch.zeros_like(p) for k, p in params.items()}
    second = {k: torch.zeros_like(p) for k, p in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    order = torch.Generator().manual_seed(1000)
    n, step, curve = x_train.shape[0], 0, []
    for _ in range(config.epochs):
        permutation = torch.randperm(n, generator=order)
        for start in range(0, n, config.batch_size):
            batch = permutation[start : start + config.batch_size]
            # the dense gradient (straight-through): RigL grows where it is large
            grads = grads_of(params, masks, x_train[batch], y_train[batch])
            if pruner is not None:
                masks, state = update(params, state, grads)
                # regrown connections start at zero, with fresh Adam moments
                params = fprune.zero_regrown(params, state)
                first = fprune.zero_regrown(first, state)
                second = fprune.zero_regrown(second, state)
            step += 1
            c1, c2 = 1 - beta1**step, 1 - beta2**step
            for k, g in grads.items():
                g = g * masks[k]  # the optimizer gets the masked gradient
                first[k] = first[k] * beta1 + (1 - beta1) * g
                second[k] = second[k] * beta2 + (1 - beta2) * g * g
                step_k = (first[k] / c1) / ((second[k] / c2).sqrt() + eps)
                params[k] = (params[k] - config.lr * step_k) * masks[k]  # stored pruned
            if step % config.eval_every == 0:
                curve.append(lt.accuracy(base, params, masks, x_test, y_test))
                if record is not None:
                    record.append({k: int(m[0].sum()) for k, m in masks.items() if is_weight(k, m)})
    return params, masks, torch.stack(curve)


def lottery_ticket(base, init: Params, sparsity: float, data, config: Config):
    """Iterative global magnitude pruning with rewinding (the lottery-ticket example's functions),
    ``lt_rounds`` rounds of an equal rate; returns (test accuracy [seeds], fraction pruned)."""
    x_train, y_train, x_test, y_test = data
    lt_config = config.lt_config()
    rate = 1 - (1 - sparsity) ** (1 / config.lt_rounds)
    masks = {k: torch.ones_like(v, dtype=torch.bool) for k, v in init.items()}
    seeds = torch.arange(config.seeds)
    trained = lt.train(base, init, masks, (x_train, y_train), lt_config, 0)
    for round_ in range(1, config.lt_rounds + 1):
        masks = lt.prune("global magnitude", trained, masks, rate, seeds)
        trained = lt.train(base, init, masks, (x_train, y_train), lt_config, round_)
    return lt.accuracy(base, trained, masks, x_test, y_test), _pruned_fraction(masks)


def _pruned_fraction(masks: Params) -> float:
    kept = sum(int(m[0].sum()) for k, m in masks.items() if is_weight(k, m))
    total = sum(m[0].numel() for k, m in masks.items() if is_weight(k, m))
    return 1 - kept / total


def _report(progress, key, acc, pruned, started) -> None:
    if progress is not None:
        progress(
            f"sparsity {key[0]:.0%}  {key[1]:<18} accuracy {100 * float(acc.mean()):5.1f} "
            f"± {100 * float(acc.std()):.1f}%  (pruned {100 * pruned:.2f}%)"
            f"  [{time.perf_counter() - started:5.1f} s]"
        )


def run(config: Config = Config(), progress: Callable[[str], None] | None = print) -> Result:
    """Every method at every sparsity, every seed at once. Deterministic for a thread count."""
    started = time.perf_counter()
    x_train, y_train, x_test, y_test = lt.load_digits_split(config.lt_config())
    data = (x_train, y_train, x_test, y_test)
    base, init = lt.initial_models(config.lt_config())
    total_steps = config.epochs * -(-x_train.shape[0] // config.batch_size)
    seeds = torch.arange(config.seeds)
    accuracy, curves, sparsity, layer_counts = {}, {}, {}, {}
    eval_steps = list(range(config.eval_every, total_steps + 1, config.eval_every))
    dense_params, dense_masks, dense_curve = train(base, init, None, None, data, config)
    dense_acc = lt.accuracy(base, dense_params, dense_masks, x_test, y_test)
    _report(progress, (0.0, "dense"), dense_acc, 0.0, started)
    for s in config.sparsities:
        accuracy[(s, "dense")], curves[(s, "dense")], sparsity[(s, "dense")] = dense_acc, dense_curve, 0.0
        for method in METHODS[1:-1]:
            # one pruner per seed; they differ only in the seed, which lives in the state, so
            # the first one's update serves them all under vmap
            states = vmap(
                lambda p, seed, *, method=method, s=s: make_pruner(method, s, total_steps, config, seed).init(
                    p
                )
            )(init, seeds)
            record: list[dict[str, int]] = []
            pruner = make_pruner(method, s, total_steps, config, 0)
            params, masks, curve = train(base, init, pruner, states, data, config, record)
            key = (s, method)
            accuracy[key] = lt.accuracy(base, params, masks, x_test, y_test)
            curves[key], layer_counts[key] = curve, record
            sparsity[key] = _pruned_fraction(masks)
            _report(progress, key, accuracy[key], sparsity[key], started)
        key = (s, "lottery ticket")
        accuracy[key], sparsity[key] = lottery_ticket(base, init, s, data, config)
        _report(progress, key, accuracy[key], sparsity[key], started)
    return Result(config, accuracy, curves, eval_steps, sparsity, layer_counts, time.perf_counter() - started)


def markdown_table(result: Result) -> str:
    """Final test accuracy (mean ± std over seeds, %) per method and sparsity."""
    sparsities = result.config.sparsities
    lines = [
        "| method | " + " | ".join(f"{s:.0%} pruned" for s in sparsities) + " |",
        "|---|" + "---:|" * len(sparsities),
    ]
    for method in METHODS:
        cells = []
        for s in sparsities:
            acc = 100 * result.accuracy[(s, method)]
            cells.append(f"{float(acc.mean()):.1f} ± {float(acc.std()):.1f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: Result, path: str) -> None:
    """Test accuracy against training step, one panel per sparsity, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sparsities = result.config.sparsities
    fig, axes = plt.subplots(1, len(sparsities), figsize=(5.2 * len(sparsities), 4.0), dpi=110, sharey=True)
    axes = list(axes) if len(sparsities) > 1 else [axes]
    for ax, s in zip(axes, sparsities, strict=True):
        for method in METHODS[:-1]:
            acc = 100 * result.curves[(s, method)]
            mean, std = acc.mean(1).numpy(), acc.std(1).numpy()
            ax.plot(result.eval_steps, mean, label=method)
            ax.fill_between(result.eval_steps, mean - std, mean + std, alpha=0.2)
        lt_acc = 100 * result.accuracy[(s, "lottery ticket")]
        ax.axhline(
            float(lt_acc.mean()), color="grey", linestyle="--", linewidth=1, label="lottery ticket (final)"
        )
        ax.set_title(f"{s:.0%} of weights pruned", fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[0].set_ylim(bottom=max(0.0, float(axes[0].get_ylim()[0])))
    axes[-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Sparse training, digits MLP, mean ± std over {result.config.seeds} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", metavar="PATH", help="write the accuracy plot (PNG) here")
    parser.add_argument("--table", metavar="PATH", help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="short configuration (for tests)")
    parser.add_argument("--seeds", type=int, help="models trained at once per method")
    parser.add_argument("--epochs", type=int, help="training epochs of every run")
    parser.add_argument(
        "--sparsities", type=float, nargs="+", help="fractions of weights pruned (default 0.9 0.98)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = Config.quick() if args.quick else Config()
    for name in ("seeds", "epochs", "sparsities"):
        if getattr(args, name):
            config = dataclasses.replace(config, **{name: getattr(args, name)})
    result = run(config)
    table = markdown_table(result)
    print(f"\n{table}\n\n({result.seconds:.1f} s, {torch.get_num_threads()} thread(s))")
    if args.table:
        pathlib.Path(args.table).write_text(table + "\n")
    if args.plot:
        plot(result, args.plot)
        print(f"plot written to {args.plot}")
    return result


if __name__ == "__main__":
    main()
