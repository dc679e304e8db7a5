"""Deprecated module path: the mask functions live in :mod:`fprune.methods`.

Import them from ``fprune`` (``fprune.l1_unstructured``) or ``fprune.methods``; this module
re-exports them and warns when it is imported.
"""

import warnings as _warnings

from fprune.methods._unstructured import *  # noqa: F403
from fprune.methods._unstructured import __all__  # noqa: F401

_warnings.warn(
    "fprune.unstructured is deprecated: import its functions from fprune (fprune.l1_unstructured, ...) "
    "or fprune.methods.",
    FutureWarning,
    stacklevel=2,
)
