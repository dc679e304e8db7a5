"""Private: fprune's warnings, shown at the caller's line and silenced without touching Python's
warning machinery.

Every warning fprune gives goes through :func:`warn`, which points it at the first frame outside
fprune and torch (the user's line, whatever the depth of the call inside fprune), so Python's
"once per location" rule (the default filter) works per user call site.

fprune's own callers that must not show a warning, or that gather the warnings of a nested call
to give one of their own (``fprune.compat``, ``fprune.iterative``), use :func:`suppressed` and
:func:`collected`. Neither uses ``warnings.catch_warnings``: that resets the record Python keeps
of the warnings a program has already seen (every ``__warningregistry__``), so under the default
filter warnings already shown would appear again.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import types
import warnings
from collections.abc import Iterator

import torch

# Frames in these directories are fprune's or torch's (its decorators: torch.no_grad's wrapper):
# a warning is shown at the first frame outside them.
_SKIPPED = tuple(
    os.path.dirname(os.path.abspath(module.__file__)) + os.sep
    for module in (sys.modules[__package__ or "fprune"], torch)
    if module.__file__
)

# The categories silenced in this context, and the list warnings are collected into (or None).
_SILENCED: contextvars.ContextVar[tuple[type, ...]] = contextvars.ContextVar("fprune_silenced", default=())
_COLLECTING: contextvars.ContextVar[list[tuple[str, type]] | None] = contextvars.ContextVar(
    "fprune_collecting", default=None
)


class NaNScoresWarning(RuntimeWarning):
    """An eager selection ranked scores that hold NaN (see :func:`fprune.select.select`).

    A NaN score ranks above ``+inf``: its entry is pruned last (kept unless the count reaches
    it), and among NaN scores the entry that comes first is pruned first, so scores that are all
    NaN give a purely positional mask. Replace NaN before pruning (``torch.nan_to_num``) when that
    is not what is wanted; silence it with
    ``warnings.filterwarnings("ignore", category=fprune.select.NaNScoresWarning)``.
    """


def caller_stacklevel() -> int:
    """The ``stacklevel`` that points ``warnings.warn``, called by the caller of this function,
    at the first frame outside fprune and torch."""
    frame: types.FrameType | None = sys._getframe(1)  # the function about to call warnings.warn
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame = frame.f_back
        level += 1
    return level


def warn(message: str, category: type[Warning]) -> None:
    """Warn at the caller's line (the first frame outside fprune and torch), unless
    :func:`suppressed` silences ``category`` here or :func:`collected` gathers the warnings."""
    if issubclass(category, _SILENCED.get()):
        return
    sink = _COLLECTING.get()
    if sink is not None:
        sink.append((message, category))
        return
    warnings.warn(message, category, stacklevel=caller_stacklevel())


@contextlib.contextmanager
def suppressed(*categories: type) -> Iterator[None]:
    """fprune's warnings of these categories are not given inside the block (this thread or task
    only; Python's filters and the record of warnings already shown are left alone)."""
    token = _SILENCED.set(_SILENCED.get() + tuple(categories))
    try:
        yield
    finally:
        _SILENCED.reset(token)


@contextlib.contextmanager
def collected() -> Iterator[list[tuple[str, type]]]:
    """fprune's warnings inside the block are gathered, as ``(message, category)`` pairs, into
    the list the block gets, instead of being shown."""
    sink: list[tuple[str, type]] = []
    token = _COLLECTING.set(sink)
    try:
        yield sink
    finally:
        _COLLECTING.reset(token)
