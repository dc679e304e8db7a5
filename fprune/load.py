"""Putting pruned params back into a module: :func:`load_into`.

fprune's functions return new tensors and leave the module as it was; :func:`load_into` is the
one step that writes them into the module, so that the module's own methods (``generate``,
``save_pretrained``, ``state_dict``, a plain forward) see the pruned weights. It writes dense
values (copied into the module's parameters and buffers) and :mod:`fprune.sparse`'s sparse
weights (installed in place of the parameters); ``fprune.sparse.load_into`` is the same function.
"""

from __future__ import annotations

from fprune.sparse._module import load_into

__all__ = ["load_into"]
