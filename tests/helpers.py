"""Helpers shared by tests in several folders: ``from tests.helpers import close, load_example``.

Folder-local helpers (``structure/structure_cases.py``, ``sparse/sparse_helpers.py``, ...) stay
beside the tests that use them; what more than one folder needs is here, written once. The plain
references of the selection contract are in ``tests/reference.py`` and the hypothesis strategies
in ``tests/strategies.py``.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = pathlib.Path(__file__).resolve().parent.parent
"""The repository's root (the folder that holds ``fprune/``, ``examples/`` and ``README.md``)."""


def load_example(name: str, module_name: str | None = None) -> ModuleType:
    """Import ``examples/<name>.py`` (examples are scripts, not a package) as a fresh module.

    The module, named ``module_name`` (default ``name``), is registered in ``sys.modules`` before
    it runs: dataclasses look their module up by name.
    """
    spec = importlib.util.spec_from_file_location(module_name or name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6) -> bool:
    """Whether two float32 outputs of the same computation agree up to summation order.

    The rule: ``rtol=1e-5`` always; ``atol=1e-6`` by default (outputs of order 1: small models,
    attention and recurrent layers, gradients); ``atol=1e-5`` where a test compares outputs of
    transformers' models (GPT-2's logits, BERT's hidden states: sums of many terms whose entries
    near zero carry absolute errors above 1e-6), passed by the tests that run them
    (``zoo/test_zoo_transformers.py``, and ``zoo/test_zoo_compat.py`` for all of its cases).
    """
    return torch.allclose(a, b, rtol=1e-5, atol=atol)


def same(x: dict, y: dict) -> bool:
    """Whether two flat dicts of tensors have the same keys and exactly equal values."""
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``dict(model.named_parameters())``, detached (the functional parameters)."""
    return {name: p.detach() for name, p in model.named_parameters()}


def layer_params(seed: int = 0, shapes=((6, 5), (4, 6), (3, 4))) -> dict[str, torch.Tensor]:
    """Random ``l{j}.weight`` of each shape and its ``l{j}.bias`` (an MLP's params, no module)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for j, shape in enumerate(shapes):
        params[f"l{j}.weight"] = torch.randn(shape, generator=g)
        params[f"l{j}.bias"] = torch.randn(shape[0], generator=g)
    return params


def prior_of(params: dict[str, torch.Tensor], seed: int = 1) -> dict[str, torch.Tensor]:
    """Random prior keep-masks of the params' shapes, about 70% kept."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.rand(p.shape, generator=g) > 0.3 for name, p in params.items()}


SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
"""The aten ops that read a device tensor on the host (``.item()``, ``int(t)``, ``bool(t)`` are
``_local_scalar_dense``)."""


def count_syncs(fn) -> int:
    """How many host reads ``fn()`` makes: profiled ``SYNC_OPS`` plus ``Tensor.tolist`` calls.

    Counted on the CPU as a CUDA run would make them (``tolist`` on the CPU reads memory without
    an aten op, so it is counted by patching).
    """
    reads = []
    tolist = torch.Tensor.tolist

    def counted(self, *args, **kwargs):
        reads.append(self.numel())
        return tolist(self, *args, **kwargs)

    prof = profile(activities=[ProfilerActivity.CPU])
    with mock.patch.object(torch.Tensor, "tolist", counted):
        prof.start()
        try:
            fn()
        finally:
            prof.stop()
    # The raw event names (building prof.events() takes seconds at 100k events).
    names = [event.name() for event in prof.profiler.kineto_results.events()]
    return len(reads) + sum(name in SYNC_OPS for name in names)


def eager_and_aot_eager(gm, example_inputs):
    """A torch.compile backend that runs the graph dynamo traced both ways the backends "eager"
    (the graph as traced) and "aot_eager" (AOTAutograd's graph) run it, asserts that the two give
    equal outputs and returns them: one trace checks both backends."""
    aot = torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def run(*args):
        plain, lowered = gm(*args), aot(*args)
        assert len(plain) == len(lowered)
        for a, b in zip(plain, lowered, strict=True):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        return lowered

    return run
