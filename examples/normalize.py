"""What ``global_unstructured(..., normalize=...)`` does, measured (the README's table comes from here).

``normalize="l1"`` / ``"l2"`` divides each leaf's scores by that leaf's L1 / L2 norm (over its
kept entries) before the one global ranking. Two consequences, both printed below:

* scale: a leaf multiplied by a constant is ranked as before, so a layer whose weights are all
  small is not pruned first for its scale alone (case "same size, 100x smaller");
* size: the normalized scores of a leaf of ``n`` similar entries are about ``1/n`` (L1) or
  ``1/sqrt(n)`` (L2), so larger leaves are pruned first and harder (case "100x larger"), and a
  small layer can still be pruned entirely at high sparsity (the LeNet's ``fc3.weight``).

Run: ``python examples/normalize.py`` (deterministic; prints a markdown table).
"""

from __future__ import annotations

import torch

import fprune


def cases():
    g = torch.Generator().manual_seed(0)
    params = {"small": torch.randn(100, generator=g), "big": torch.randn(10000, generator=g)}
    yield "100x larger, 50%", params, 0.5
    g = torch.Generator().manual_seed(0)
    params = {"small": 0.01 * torch.randn(1000, generator=g), "big": torch.randn(1000, generator=g)}
    yield "same size, 100x smaller, 50%", params, 0.5
    torch.manual_seed(0)
    lenet = torch.nn.ModuleDict(
        {
            "conv1": torch.nn.Conv2d(1, 6, 3),
            "conv2": torch.nn.Conv2d(6, 16, 3),
            "fc1": torch.nn.Linear(400, 120),
            "fc2": torch.nn.Linear(120, 84),
            "fc3": torch.nn.Linear(84, 10),
        }
    )
    weights = {k: v.detach() for k, v in lenet.named_parameters() if k.endswith("weight")}
    yield "LeNet weights, 90%", weights, 0.9


def table() -> str:
    lines = [
        '| case | leaf | entries | pruned: normalize=False | "l1" | "l2" |',
        "|---|---|---:|---:|---:|---:|",
    ]
    for title, params, amount in cases():
        sparsities = [
            fprune.sparsity(fprune.global_unstructured(params, amount, normalize=norm)).per_leaf
            for norm in (False, "l1", "l2")
        ]
        for name, p in params.items():
            cells = " | ".join(f"{100 * float(s[name]):.1f}%" for s in sparsities)
            lines.append(f"| {title} | {name} | {p.numel()} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(table())
