"""The module-level ``__getattr__`` of a deprecated module path whose names moved to
:mod:`fprune.methods`: each old name still resolves, with a ``FutureWarning``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def moved_names(old: str, names: list[str], target: ModuleType) -> Callable[[str], Any]:
    """``__getattr__`` for the module ``old``, whose ``names`` now live in ``target``
    (``fprune.methods``)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            warnings.warn(
                f"{old}.{name} is deprecated: use fprune.{name} (or fprune.methods.{name}).",
                FutureWarning,
                stacklevel=2,
            )
            return getattr(target, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__
