"""The PyTorch pruning tutorial's walk-through (LeNet), runnable with either pruning module.

    python examples/prune_tutorial.py            # import fprune.compat as prune
    python examples/prune_tutorial.py --torch    # import torch.nn.utils.prune as prune

Both print the same text (hook objects aside, whose class paths and addresses differ): the
same masks, parameters, buffers, hook history, state_dict keys and sparsity figures. The steps
follow the official tutorial (https://pytorch.org/tutorials/intermediate/pruning_tutorial.html):
random and L1 pruning of ``conv1``, iterative ``ln_structured`` pruning and the container
history, serialization, ``remove``, pruning many parameters, global pruning, and a custom
method that prunes every other entry.
"""

from __future__ import annotations

import argparse
import importlib

import torch
import torch.nn.functional as F
from torch import nn


class LeNet(nn.Module):
    """LeNet (LeCun et al., 1998) for 1x28x28 inputs, as in the tutorial."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(start_dim=1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def zero_fraction(tensor: torch.Tensor) -> float:
    return 100.0 * float(torch.sum(tensor == 0)) / float(tensor.nelement())


def main(prune, seed: int = 0) -> None:
    """Run every step of the tutorial with ``prune`` (a pruning module) and print what it shows."""
    torch.manual_seed(seed)
    model = LeNet()

    # A fresh layer: two parameters, no buffers.
    module = model.conv1
    print(list(module.named_parameters()))
    print(list(module.named_buffers()))

    # Prune 30% of conv1.weight at random: weight -> weight_orig + weight_mask + a hook.
    prune.random_unstructured(module, name="weight", amount=0.3)
    print(list(module.named_parameters()))
    print(list(module.named_buffers()))
    print(module.weight)
    print(module._forward_pre_hooks)

    # Prune the 3 smallest-magnitude entries of the bias too.
    prune.l1_unstructured(module, name="bias", amount=3)
    print(list(module.named_parameters()))
    print(list(module.named_buffers()))
    print(module.bias)
    print(module._forward_pre_hooks)

    # Iterative pruning: half of the output channels by L2 norm, on top of the random mask.
    prune.ln_structured(module, name="weight", amount=0.5, n=2, dim=0)
    print(module.weight)
    for hook in module._forward_pre_hooks.values():
        if hook._tensor_name == "weight":
            break
    print(list(hook))  # the container's history

    # Serialization: the masks and the original tensors are in the state_dict.
    print(model.state_dict().keys())

    # Make the pruning of conv1.weight permanent.
    print(list(module.named_parameters()))
    print(list(module.named_buffers()))
    print(module.weight)
    prune.remove(module, "weight")
    print(list(module.named_parameters()))
    print(list(module.named_buffers()))

    # Many parameters at once: 20% of every conv weight, 40% of every linear weight.
    new_model = LeNet()
    for _, layer in new_model.named_modules():
        if isinstance(layer, torch.nn.Conv2d):
            prune.l1_unstructured(layer, name="weight", amount=0.2)
        elif isinstance(layer, torch.nn.Linear):
            prune.l1_unstructured(layer, name="weight", amount=0.4)
    print(dict(new_model.named_buffers()).keys())

    # Global pruning: the lowest 20% of all five weights together.
    model = LeNet()
    parameters_to_prune = (
        (model.conv1, "weight"),
        (model.conv2, "weight"),
        (model.fc1, "weight"),
        (model.fc2, "weight"),
        (model.fc3, "weight"),
    )
    prune.global_unstructured(parameters_to_prune, pruning_method=prune.L1Unstructured, amount=0.2)
    for layer, name in parameters_to_prune:
        label = next(key for key, value in model.named_children() if value is layer)
        print(f"Sparsity in {label}.{name}: {zero_fraction(getattr(layer, name)):.2f}%")
    zeros = sum(float(torch.sum(getattr(layer, name) == 0)) for layer, name in parameters_to_prune)
    total = sum(float(getattr(layer, name).nelement()) for layer, name in parameters_to_prune)
    print(f"Global sparsity: {100.0 * zeros / total:.2f}%")

    # A custom method: prune every other remaining entry.
    class FooBarPruningMethod(prune.BasePruningMethod):
        """Prune every other entry in a tensor."""

        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask):
            mask = default_mask.clone()
            mask.flatten()[::2] = 0
            return mask

    def foobar_unstructured(layer, name):
        FooBarPruningMethod.apply(layer, name)
        return layer

    model = LeNet()
    foobar_unstructured(model.fc3, name="bias")
    print(model.fc3.bias_mask)
    # ... and again on the remaining half (the container hands it the unpruned entries).
    foobar_unstructured(model.fc3, name="bias")
    print(model.fc3.bias_mask)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="store_true", help="use torch.nn.utils.prune")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    main(importlib.import_module("torch.nn.utils.prune" if options.torch else "fprune.compat"), options.seed)
