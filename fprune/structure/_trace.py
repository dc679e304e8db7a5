"""The tracing core: export a module once, propagate channel atoms, build the :class:`Structure`.

Every channel of every parameter dim, and every element of every activation that comes from one,
carries the id of an *atom*. :class:`Analysis` is the three jobs in order:
:mod:`~fprune.structure._propagate` walks the exported ATen graph, asking the op rules
(:mod:`fprune.structure._ops`) for each node's output label, and records in
:mod:`~fprune.structure._atoms` what they learn (atoms to merge, pinned, inexact, heads);
:mod:`~fprune.structure._boxes` couples or pins channels until every value stays a box; at the
end every set of merged atoms is one channel, and :mod:`~fprune.structure._build` groups them by
the (parameter, dim, positions) they cover.
"""

from __future__ import annotations

from typing import Any

import torch

from fprune.structure._boxes import rectangular
from fprune.structure._build import build
from fprune.structure._exports import exported
from fprune.structure._labels import ParamRef
from fprune.structure._ops import PASS_PARAMETER, pass_parameter, rule_of
from fprune.structure._propagate import Propagation
from fprune.structure._types import Structure

__all__ = ["Analysis", "analyse", "groups", "check_call"]


def groups(
    module: torch.nn.Module,
    args: Any = (),
    kwargs: dict | None = None,
    *,
    dynamic_shapes: Any = None,
) -> Structure:
    """Trace ``module`` once with ``torch.export`` and return its dependency groups.

    The module is exported in eval mode (every submodule's training flag is restored afterwards)
    on the example inputs ``args`` / ``kwargs``; use small inputs with batch (and sequence) sizes
    of at least 2.
    Hugging Face models need ``use_cache=False`` (their cache object is not an exportable output).
    The module's last exported program is kept (weakly, sharing the module's tensors) and reused
    by the next call of ``groups`` or :func:`~fprune.compact_graph` on the same module, inputs of
    the same shapes and the same ``dynamic_shapes``, while the module's submodules, parameters,
    buffers, hooks and plain attributes are unchanged (their values may change); see
    :mod:`fprune.structure._exports` for exactly what is compared.

    Args:
        module: the model.
        args: a tuple of example positional inputs.
        kwargs: example keyword inputs.
        dynamic_shapes: passed to ``torch.export.export``.

    Returns:
        A :class:`Structure`.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``, ``args`` not a tuple.
        RuntimeError: ``torch.export`` failed on the model (its error is chained).

    Example:
        >>> import torch, fprune
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
        ...                           torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
        >>> s = fprune.structure.groups(net, (torch.randn(2, 3, 8, 8),))
        >>> g = s.groups[0]
        >>> members = [(m.param, m.dim) for m in g.members]
        >>> g.name, g.size, g.prunable, members  # doctest: +NORMALIZE_WHITESPACE
        ('0.weight:0', 8, True, [('0.weight', 0), ('0.bias', 0), ('1.weight', 0), ('1.bias', 0),
         ('3.weight', 1), ('1.running_mean', 0), ('1.running_var', 0)])
    """
    return analyse(module, args, kwargs, dynamic_shapes)[0]


def check_call(module: Any, args: Any, kwargs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` after checking the kinds of a module call's arguments."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected module to be a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(args, tuple):
        raise TypeError(
            f"Expected args to be a tuple of example inputs, got {type(args).__name__}; "
            f"wrap a single input as (x,)."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"Expected kwargs to be None or a dict, got {type(kwargs).__name__}.")
    return args, dict(kwargs or {})


def _export(module: torch.nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any) -> Any:
    was_training = {m: m.training for m in module.modules()}
    module.eval()
    try:
        return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as error:  # export errors come in many types; say where they come from
        raise RuntimeError(
            f"torch.export could not trace {type(module).__name__}: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}. fprune.structure needs an "
            f"exportable model (Hugging Face models: pass use_cache=False)."
        ) from error
    finally:
        for m, training in was_training.items():
            m.training = training


def _aliases(module: torch.nn.Module) -> dict[str, str]:
    """Every parameter/buffer name -> the first name of the same tensor (what dedup keeps)."""
    first: dict[int, str] = {}
    names: dict[str, str] = {}
    for named in (
        module.named_parameters(remove_duplicate=False),
        module.named_buffers(remove_duplicate=False),
    ):
        for name, t in named:
            names[name] = first.setdefault(id(t), name)
    return names


def analyse(module: Any, args: Any, kwargs: Any, dynamic_shapes: Any) -> tuple[Structure, Analysis, Any]:
    """``(structure, analysis, exported_program)`` of one module call."""
    args, kwargs = check_call(module, args, kwargs)
    ep = exported(module, args, kwargs, dynamic_shapes, _export)
    analysis = Analysis(ep, _aliases(module))
    analysis.run()
    return analysis.structure(), analysis, ep


class Analysis(Propagation):
    """Channel-atom propagation over an ExportedProgram, then the box checks (see the module
    docstring). :meth:`run` fills the labels and :attr:`roots`; :meth:`structure` builds the
    result. The op rules' vocabulary is that of
    :class:`~fprune.structure._propagate.Propagation` and :class:`~fprune.structure._atoms.Atoms`.
    """

    def run(self) -> None:
        self.propagate()
        self.roots = rectangular(self)

    def apply_rule(self, node: torch.fx.Node, op: str, args: list, kwargs: dict) -> Any:
        if op in PASS_PARAMETER and isinstance(args[0], ParamRef):
            return pass_parameter(args[0], op, args)
        rule = rule_of(op)
        if rule is None:
            return self.unknown(node, op, args, kwargs)
        return rule(self, node, op, args, kwargs)

    def structure(self) -> Structure:
        return build(self)
