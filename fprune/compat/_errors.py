"""Private: the exceptions fprune.compat raises where torch.nn.utils.prune raises bare ones.

Each class derives from the exception type torch raises in the same situation (so
``except AssertionError`` in legacy code still catches it) and from the type that describes the
mistake (``ValueError`` for a bad value), and its message names the argument, the value and
what was expected.
"""

from __future__ import annotations


class ImportanceScoresShapeError(AssertionError, ValueError, IndexError):
    """``importance_scores`` does not have the shape of the parameter it ranks.

    torch raises ``AssertionError`` here in ``apply``/``prune`` and an ``IndexError`` (a mask
    that does not fit) in ``global_unstructured``; this class is both, and a ``ValueError``.
    """


class MultiplePruningHooksError(AssertionError, RuntimeError):
    """Two pruning hooks act on the same tensor of one module (torch: ``AssertionError``)."""


class NotPrunedError(AssertionError, AttributeError):
    """A pruning method was used on a module before ``apply`` told it which tensor it acts on."""


class MaskShapeError(AssertionError, ValueError):
    """A mask (``custom_from_mask``, ``CustomFromMask``) does not have the parameter's shape."""


class InvalidNormError(RuntimeError, ValueError):
    """``n`` of ``ln_structured`` is not an order ``torch.norm`` knows (torch: ``RuntimeError``)."""


class DeviceMismatchError(TypeError, RuntimeError):
    """The tensors of ``global_unstructured`` lie on different devices.

    torch raises ``TypeError`` (two CUDA devices, or CUDA and CPU) or, from ``torch.cat``,
    ``RuntimeError`` (CPU and another non-CUDA device); this class is both.
    """
