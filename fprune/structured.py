"""Deprecated module path: the mask functions live in :mod:`fprune.methods`.

Import them from ``fprune`` (``fprune.l1_unstructured``) or ``fprune.methods``. The names this
module had still resolve, each with a ``FutureWarning``.
"""

from fprune import methods as _methods
from fprune.methods import _structured
from fprune.methods._moved import moved_names

__all__ = list(_structured.__all__)
__getattr__ = moved_names(__name__, __all__, _methods)
