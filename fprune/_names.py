"""Private: the flat names of a module's tensors (``"h.0.attn.c_attn.weight"``), resolved.

One lookup for every function that takes a dict keyed like ``module.named_parameters()`` and
reaches into the module: :func:`fprune.load_into`, :func:`fprune.masked_call`, the in-place
helpers of :mod:`fprune.training` and :func:`fprune.sparse.to_sparse`. Names include tied
aliases (``remove_duplicate=False``: GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``),
and an unknown name gets the same message everywhere, with the nearest real names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["Names", "near", "owner"]


def near(key: Any, names: Iterable[str]) -> str:
    """`` (nearest: 'fc.weight', 'fc.bias')``, or ``""`` when nothing is close (difflib)."""
    close = difflib.get_close_matches(str(key), sorted(names), n=3, cutoff=0.5)
    return f" (nearest: {', '.join(map(repr, close))})" if close else ""


def owner(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """The submodule of ``module`` that holds the tensor ``name``, and the attribute it holds it
    under (``AttributeError`` where no submodule has that path)."""
    path, _, attr = name.rpartition(".")
    return (module.get_submodule(path) if path else module), attr


class Names:
    """A module's parameters and buffers by flat name, aliases of tied tensors included.

    Args:
        module: the module whose names to resolve.
        parameters, buffers: which of the two kinds the names may name.
    """

    def __init__(self, module: torch.nn.Module, *, parameters: bool = True, buffers: bool = True) -> None:
        self.module = module
        self.parameters: dict[str, torch.Tensor] = (
            dict(module.named_parameters(remove_duplicate=False)) if parameters else {}
        )
        self.buffers: dict[str, torch.Tensor] = (
            dict(module.named_buffers(remove_duplicate=False)) if buffers else {}
        )
        self.tensors = {**self.parameters, **self.buffers}
        if parameters and buffers:
            self.kind = "parameter or buffer"
        else:
            self.kind = "parameter" if parameters else "buffer"

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def owner(self, name: str) -> tuple[torch.nn.Module, str]:
        """The submodule that holds ``name`` and the attribute it holds it under."""
        return owner(self.module, name)

    def aliases(self, name: str) -> list[str]:
        """The other names of the tensor ``name`` names (a tied weight's other uses)."""
        tensor = self.tensors[name]
        return [n for n, t in self.tensors.items() if t is tensor and n != name]

    def unknown(self, argname: str, key: Any, expected: str = "") -> ValueError:
        """The error for a key of ``argname`` that names nothing of this kind in the module."""
        expected = expected or f"module.named_{'parameter' if self.kind != 'buffer' else 'buffer'}s()"
        return ValueError(
            f"{argname}[{key!r}] names no {self.kind} of the {type(self.module).__name__} module"
            f"{near(key, self.tensors)}; expected keys of {expected}."
        )

    def resolve(self, argname: str, tree: Any) -> dict[str, torch.Tensor]:
        """``{key: the module's tensor}`` for each key of the flat dict ``tree``, each checked:
        a str key that names a tensor of this kind, a tensor value of that tensor's shape."""
        if not isinstance(tree, Mapping):
            raise TypeError(
                f"Expected {argname} to be a flat dict of name -> tensor (keyed like "
                f"module.named_parameters()), got {type(tree).__name__}."
            )
        found = {}
        for key, value in tree.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"Expected the keys of {argname} to be names (str) like "
                    f"module.named_parameters() gives, got {key!r} ({type(key).__name__})."
                )
            if key not in self.tensors:
                raise self.unknown(argname, key)
            target = self.tensors[key]
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"Expected {argname}[{key!r}] to be a torch.Tensor, got {type(value).__name__}."
                )
            if value.shape != target.shape:
                kind = "parameter" if key in self.parameters else "buffer"
                raise ValueError(
                    f"Expected {argname}[{key!r}] to have the shape of the module's {kind} "
                    f"{key!r}, {tuple(target.shape)}, got {tuple(value.shape)}."
                )
            found[key] = target
        return found
