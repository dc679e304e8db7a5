"""The models the benchmarks prune: transformer-like stacks, a VGG-like conv net, LeNet, MLPs.

Parameters are created on the meta device and then filled in place (``normal_``), so building
a 1.5B-parameter model costs its 6 GB of float32 and no transient copies (the RSS high-water
after building is the baseline the extra memory is measured from).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

# Transformer-like sizes: (d_model, blocks). A block holds the Linear weights of attention
# (4 of d x d) and of the MLP (d x 4d and 4d x d): 12 d^2 weights. The sizes count those
# weights, which are what global magnitude pruning ranks.
TRANSFORMER_SIZES: dict[str, tuple[int, int]] = {
    "tiny": (64, 2),  # 98K, to warm the code paths up before the baseline is taken
    "1M": (128, 5),  # 0.98M, for --quick
    "10M": (384, 6),  # 10.6M
    "50M": (768, 7),  # 49.5M
    "100M": (768, 14),  # 99.1M
    "400M": (1024, 32),  # 402.7M
    "1.5B": (1600, 48),  # 1.47B (GPT-2 XL's d_model and depth)
}


class Block(nn.Module):
    """One transformer block's parameters: attention and MLP Linears, two LayerNorms."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)


class TransformerLike(nn.Module):
    """``blocks`` transformer blocks of width ``d`` (parameters only: nothing is run)."""

    def __init__(self, d: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))


def transformer_like(size: str, seed: int = 0) -> nn.Module:
    d, blocks = TRANSFORMER_SIZES[size]
    with torch.device("meta"):
        model = TransformerLike(d, blocks)
    return _fill(model, seed)


class VGGLike(nn.Module):
    """VGG-16's convolutions (14.7M weights) and a small classifier, for structured pruning."""

    def __init__(self) -> None:
        super().__init__()
        layers, channels = [], 3
        for width in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
            layers.append(nn.Conv2d(channels, width, 3, padding=1))
            channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 512), nn.Linear(512, 1000))


def vgg_like(seed: int = 0) -> nn.Module:
    with torch.device("meta"):
        model = VGGLike()
    return _fill(model, seed)


def _fill(model: nn.Module, seed: int) -> nn.Module:
    model = model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm weight
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model


def weight_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every Linear and Conv2d: the modules whose weights are pruned."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


class LeNet(nn.Module):
    """The pruning tutorial's LeNet for 1x28x28 inputs (as in ``examples/prune_tutorial.py``)."""

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


class MLP(nn.Module):
    """``depth`` hidden Linear layers of ``width`` with ReLU, then a 10-way head."""

    def __init__(self, inputs: int, width: int, depth: int) -> None:
        super().__init__()
        sizes = [inputs] + [width] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.head(x)
