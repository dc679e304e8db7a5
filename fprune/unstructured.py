"""Deprecated module path: the mask functions live in :mod:`fprune.methods`.

Import them from ``fprune`` (``fprune.l1_unstructured``) or ``fprune.methods``. The names this
module had still resolve, each with a ``FutureWarning``.
"""

from __future__ import annotations

import warnings as _warnings
from typing import Any as _Any

from fprune import methods as _methods
from fprune.methods import _unstructured

__all__ = list(_unstructured.__all__)


def __getattr__(name: str) -> _Any:
    if name in __all__:
        _warnings.warn(
            f"fprune.unstructured.{name} is deprecated: use fprune.{name} (or fprune.methods.{name}).",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(_methods, name)
    raise AttributeError(f"module 'fprune.unstructured' has no attribute {name!r}")
