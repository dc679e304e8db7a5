"""fprune's main demo: the LeNet of the PyTorch pruning tutorial, pruned with the functional API.

1. global magnitude pruning of all weights at 20% (one ranking across every layer);
2. an iterative second step: 20% more of what remains, plus structured L2 pruning of half of
   conv1's remaining output channels;
3. a per-layer and global sparsity table (``fprune.report``), and a forward pass with ``masked_call``;
4. the same masks computed for an ensemble of 4 LeNets in one ``vmap`` call.

Run: ``python examples/demo.py``
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import fprune


class LeNet(nn.Module):
    """The LeNet of https://pytorch.org/tutorials/intermediate/pruning_tutorial.html."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)  # 1 input image channel, 6 output channels, 3x3 kernel
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)  # 5x5 image dimension
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(-1, int(x.nelement() / x.shape[0]))
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def is_weight(name: str, p: torch.Tensor) -> bool:
    return name.endswith("weight")


def sparsity_table(masks) -> str:
    """The per-layer table of every parameter (``fprune.report``), and a line for the weights only."""
    weights = fprune.report(masks, where=is_weight).total
    return (
        f"{fprune.report(masks)}\n\n"
        f"all weights: {weights.pruned} of {weights.numel} pruned ({weights.sparsity:.2%})"
    )


def main() -> dict:
    torch.manual_seed(0)
    model = LeNet()
    params = {name: p.detach() for name, p in model.named_parameters()}

    # Step 1: one global ranking over every weight (biases are left alone).
    masks = fprune.global_unstructured(params, 0.2, where=is_weight)
    print("## Step 1: global magnitude pruning of all weights, 20%\n")
    print(sparsity_table(masks))

    # Step 2: iterate on top of the step-1 masks; nothing pruned comes back.
    masks = fprune.global_unstructured(params, 0.2, masks=masks, where=is_weight)
    masks = fprune.ln_structured(params, 0.5, 2, 0, masks=masks, where=lambda n, p: n == "conv1.weight")
    print("\n## Step 2: 20% more of the remaining weights, then half of conv1's channels (L2)\n")
    print(sparsity_table(masks))

    x = torch.randn(1, 1, 28, 28)  # the tutorial's LeNet fits 28x28 inputs (16 * 5 * 5 after conv2)
    with torch.no_grad():
        out = fprune.masked_call(model, params, masks, (x,))
        dense = model(x)
    print(
        f"\nforward with masked_call: output {tuple(out.shape)}, "
        f"max |pruned - dense| = {float((out - dense).abs().max()):.4f}"
    )

    # The same pipeline over an ensemble of 4 LeNets, as one vmap call.
    ensemble = [LeNet() for _ in range(4)]
    stacked, _ = torch.func.stack_module_state(ensemble)
    stacked = {k: v.detach() for k, v in stacked.items()}
    ensemble_masks = torch.func.vmap(lambda p: fprune.global_unstructured(p, 0.2, where=is_weight))(stacked)
    outs = torch.func.vmap(lambda p, m: fprune.masked_call(model, p, m, (x,)))(stacked, ensemble_masks)
    overall = torch.func.vmap(lambda m: fprune.sparsity(m).overall)(
        {k: v for k, v in ensemble_masks.items() if k.endswith("weight")}
    )
    print(
        f"ensemble of 4 with vmap: outputs {tuple(outs.shape)}, weight sparsity per member "
        f"{[round(float(s), 4) for s in overall]}"
    )
    return masks


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
