"""Shared by the fprune.compat tests: small models, custom methods for either library, and a
comparison of everything the torch.nn.utils.prune contract fixes (state, hooks, outputs)."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as compat_prune

LIBRARIES = {"torch": torch_prune, "compat": compat_prune}
TARGETS = [("conv", "weight"), ("conv", "bias"), ("lin", "weight"), ("lin", "bias")]


class Net(torch.nn.Module):
    """A conv and a linear layer with continuous random weights (no ties)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.lin = torch.nn.Linear(7, 5)

    def forward(self, x, y):
        return self.conv(x), self.lin(y)


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(2, 3, 5, 5, generator=g), torch.randn(2, 7, generator=g)


@functools.cache
def custom_methods(library: str):
    """Methods written the tutorial's way, subclassing ``library``'s BasePruningMethod."""
    base = LIBRARIES[library].BasePruningMethod

    class EveryOther(base):
        """Prune every other entry of what remains (unstructured)."""

        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask):
            mask = default_mask.clone()
            mask.flatten()[::2] = 0
            return mask

    class FirstChannel(base):
        """Prune the first remaining channel along ``dim`` (structured)."""

        PRUNING_TYPE = "structured"

        def __init__(self, dim=0):
            self.dim = dim

        def compute_mask(self, t, default_mask):
            mask = default_mask.clone()
            if t.shape[self.dim] > 0:
                mask.select(self.dim, 0).zero_()
            return mask

    class Failing(base):
        """Raises from compute_mask (for rollback tests)."""

        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask):
            raise ZeroDivisionError("this method always fails")

    return {"EveryOther": EveryOther, "FirstChannel": FirstChannel, "Failing": Failing}


def hook_summary(module: torch.nn.Module) -> list[tuple[str, str, tuple[str, ...]]]:
    """(tensor name, hook class name, container history) of each pruning hook, in hook order."""
    out = []
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, torch_prune.BasePruningMethod):
            history = (
                tuple(type(m).__name__ for m in hook)
                if isinstance(hook, torch_prune.PruningContainer)
                else ()
            )
            out.append((hook._tensor_name, type(hook).__name__, history))
    return out


def state(net: torch.nn.Module) -> dict[str, Any]:
    """Everything the contract says must match: names, values, dtypes, attributes, hooks, outputs."""
    out: dict[str, Any] = {
        "state_dict": [(k, v.dtype, v.detach().clone()) for k, v in net.state_dict().items()],
        "parameters": [n for n, _ in net.named_parameters()],
        "buffers": [n for n, _ in net.named_buffers()],
        "is_pruned": torch_prune.is_pruned(net),
    }
    for prefix, sub in net.named_children():
        out["hooks " + prefix] = hook_summary(sub)
        for name in ("weight", "bias"):
            value = getattr(sub, name)
            out[f"attr {prefix}.{name}"] = (value.dtype, value.detach().clone(), type(value).__name__)
    with torch.no_grad():
        out["outputs"] = [o.clone() for o in net(*inputs())]
    return out


def assert_same_state(expected: dict[str, Any], actual: dict[str, Any]) -> None:
    assert expected.keys() == actual.keys()
    for key in expected:
        assert _equal(expected[key], actual[key]), f"{key} differs:\n{expected[key]}\n{actual[key]}"


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b
