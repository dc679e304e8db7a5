"""Writes docs/api.md, the API reference, from the docstrings of fprune's public names.

Usage: ``python scripts/api_reference.py`` prints it; ``--write`` writes docs/api.md;
``--check`` exits 1 when docs/api.md differs from what the docstrings give
(tests/docs/test_docs_api.py runs the check).

The public names are those in the ``__all__`` of each topic module listed in ``TOPICS``, in
that order; a name re-exported by ``fprune`` itself is listed once, under its topic.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import re
import sys
import typing
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's fprune, whatever is installed
OUT = ROOT / "docs" / "api.md"

#: (module, heading, one line on what it holds), in reading order.
TOPICS = [
    ("fprune", "fprune", "The package: every name a user imports, grouped by topic."),
    ("fprune.methods", "fprune.methods", "Mask functions: a score function over the selection layer each."),
    (
        "fprune.select",
        "fprune.select",
        "The selection layer: scores in, masks out, the scope as a parameter.",
    ),
    ("fprune.scores", "fprune.scores", "Saliency scores computed with torch.func."),
    ("fprune.calibration", "fprune.calibration", "Statistics of a layer's inputs over calibration data."),
    ("fprune.distributions", "fprune.distributions", "Per-leaf sparsities."),
    ("fprune.schedules", "fprune.schedules", "Sparsity as a function of the training step."),
    ("fprune.pruners", "fprune.pruners", "Sparse training: pruners as (init, update) pairs."),
    ("fprune.training", "fprune.training", "The bridge to torch.optim and modules."),
    ("fprune.structure", "fprune.structure", "Dependency groups, masks by group, physical shrinking."),
    ("fprune.reconstruct", "fprune.reconstruct", "Post-training pruning with weight reconstruction."),
    ("fprune.oneshot", "fprune.oneshot", "Layer-by-layer post-training pruning of a model."),
    ("fprune.sparse", "fprune.sparse", "Sparse execution of unstructured masks."),
    ("fprune.packed", "fprune.packed", "The bit-packed mask format."),
    ("fprune.distributed", "fprune.distributed", "Sharded models (DTensor, FSDP2)."),
    ("fprune.compat", "fprune.compat", "A drop-in torch.nn.utils.prune."),
]


def _public(module: Any) -> list[str]:
    return [n for n in getattr(module, "__all__", []) if not n.startswith("_")]


class _Raw:
    """An annotation string shown as written (no quotes)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""

    def raw(a: Any) -> Any:
        if isinstance(a, typing.ForwardRef):
            a = a.__forward_arg__
        return _Raw(a) if isinstance(a, str) else a

    def default(d: Any) -> Any:
        # A function or class as a default shows by name: its repr holds a memory address,
        # which would make the page differ from run to run.
        if d is not inspect.Parameter.empty and (
            inspect.isfunction(d) or inspect.isclass(d) or inspect.isbuiltin(d)
        ):
            return _Raw(d.__qualname__)
        return d

    params = [
        p.replace(annotation=raw(p.annotation), default=default(p.default)) for p in sig.parameters.values()
    ]
    return str(sig.replace(parameters=params, return_annotation=raw(sig.return_annotation)))


_SECTIONS = (
    "Args",
    "Arguments",
    "Attributes",
    "Returns",
    "Yields",
    "Raises",
    "Note",
    "Notes",
    "Warning",
    "Example",
    "Examples",
)


def _markdown(doc: str) -> str:
    """A Google-style docstring as markdown: sections in bold, arguments as a list, examples
    as code blocks."""
    out: list[str] = []
    section = None
    for line in doc.splitlines():
        head = line.strip().rstrip(":")
        if not line.startswith(" ") and line.endswith(":") and head in _SECTIONS:
            if section in ("Example", "Examples"):
                out.append("```")
            section = head
            out += ["", f"**{head}**", ""]
            if head in ("Example", "Examples"):
                out.append("```pycon")  # doctest sessions; run by --doctest-modules, not tests/docs
            continue
        if section in ("Example", "Examples"):
            out.append(line[4:] if line.startswith("    ") else line)
        elif section in ("Args", "Arguments", "Attributes", "Raises") and line.startswith("    "):
            text = line[4:]
            if not text.startswith(" ") and ":" in text:
                name, _, rest = text.partition(":")
                out.append(f"- `{name.strip()}`:{rest}")
            else:
                out.append("  " + text.strip())
        else:
            out.append(line[4:] if section and line.startswith("    ") else line)
    if section in ("Example", "Examples"):
        while out and not out[-1].strip():
            out.pop()
        out.append("```")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out).strip())


def _comment(module: Any, name: str) -> str:
    """The ``#:`` comment (one or more lines) above ``name = ...`` in ``module``'s source (or
    its ``_types``), joined into one line."""
    for source_module in (module, importlib.import_module("fprune._types")):
        try:
            lines = inspect.getsource(source_module).splitlines()
        except (OSError, TypeError):
            continue
        for i, line in enumerate(lines):
            if line.startswith(f"{name} ="):
                start = i
                while start and lines[start - 1].startswith("#:"):
                    start -= 1
                if start < i:
                    return " ".join(text[2:].strip() for text in lines[start:i])
    return ""


def _entry(module: Any, qualified: str, obj: Any) -> str:
    name = qualified.rpartition(".")[2]
    comment = _comment(module, name)
    if inspect.ismodule(obj):
        return ""  # a sub-topic: it has its own section
    if comment:
        return f"### `{qualified}`\n\n*alias or constant*\n\n{comment}\n"
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        kind = "class"
    elif callable(obj):
        kind = "function"
    else:
        kind = "constant"
        doc = doc if doc and doc != inspect.getdoc(type(obj)) else f"``{obj!r}``"
    title = f"### `{qualified}{_signature(obj) if kind != 'constant' else ''}`"
    return f"{title}\n\n*{kind}*\n\n{_markdown(doc)}\n"


def generate() -> str:
    """The text of docs/api.md."""
    seen: set[int] = set()
    parts = [
        "# API reference\n",
        (
            "Generated from the docstrings by `python scripts/api_reference.py --write`; do not edit by "
            "hand. Every function's example runs as a doctest.\n"
        ),
    ]
    modules = [(importlib.import_module(name), heading, line) for name, heading, line in TOPICS]
    # Names documented under their own topic are not repeated under fprune.
    owned = {id(getattr(m, n)) for m, h, _ in modules[1:] for n in _public(m)}
    parts.append("\n".join(f"- [`{h}`](#{h.replace('.', '')}): {line}" for _, h, line in modules) + "\n")
    for module, heading, line in modules:
        entries = []
        for n in _public(module):
            obj = getattr(module, n)
            if id(obj) in seen or (module.__name__ == "fprune" and id(obj) in owned):
                continue
            if not isinstance(obj, (int, float, str, tuple, frozenset)):
                seen.add(id(obj))
            text = _entry(module, f"{heading}.{n}", obj)
            if text:
                entries.append(text)
        if entries:
            parts.append(f"## {heading}\n\n{line}\n\n" + "\n".join(entries))
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/api.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/api.md is stale: run python scripts/api_reference.py --write", file=sys.stderr)
            return 1
        return 0
    if args.write:
        OUT.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
