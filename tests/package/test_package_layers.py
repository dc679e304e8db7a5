"""The layering written in fprune's package docstring holds for every module: imports point
down the layers (lazy imports inside functions included), and no two modules import each other
through any chain."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "fprune"

# Lowest first. A module may import modules of its own layer or of lower ones.
LAYERS = [
    ("helpers", ["fprune._*", "fprune.packed"]),
    ("selection", ["fprune.select", "fprune.select.*", "fprune.distributed", "fprune.distributed.*"]),
    (
        "methods",
        [
            "fprune.methods",
            "fprune.methods.*",
            "fprune.stats",
            "fprune.scores",
            "fprune.calibration",
            "fprune.distributions",
            "fprune.schedules",
            "fprune.pruners",
            "fprune.pruners.*",
            "fprune.reconstruct",
            "fprune.structure._types",
            "fprune.structure._labels",
            "fprune.structure._ops",
            "fprune.structure._ops.*",
            "fprune.structure._atoms",
            "fprune.structure._propagate",
            "fprune.structure._boxes",
            "fprune.structure._build",
            "fprune.structure._exports",
            "fprune.structure._trace",
            "fprune.structure._masks",
        ],
    ),
    (
        "application",
        [
            "fprune.apply",
            "fprune.training",
            "fprune.sparse",
            "fprune.sparse.*",
            "fprune.oneshot",
            "fprune.oneshot.*",
            "fprune.load",
            "fprune.structure",
            "fprune.structure.*",
        ],
    ),
    ("package", ["fprune"]),
    ("compat", ["fprune.compat", "fprune.compat.*"]),
]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer_of(name: str) -> int:
    best = None
    for rank, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            exact = pattern == name
            prefix = pattern.endswith("*") and name.startswith(pattern[:-1])
            # The most specific pattern wins (an exact name over a wildcard).
            score = (2 if exact else 1 if prefix else 0, len(pattern))
            if score[0] and (best is None or score > best[0]):
                best = (score, rank)
    assert best is not None, f"{name} is in no layer: add it to LAYERS in {__file__}"
    return best[1]


def imports(name: str) -> set[str]:
    """The fprune modules ``name`` imports, anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: not an import at run time
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                full = f"{base}.{a.name}"
                found.add(full if full in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down_the_layers(name):
    mine = layer_of(name)
    for other in sorted(imports(name)):
        if other == "fprune" and name.startswith("fprune."):
            # `import fprune.x` also runs fprune/__init__; only compat may use the package itself.
            continue
        assert layer_of(other) <= mine, (
            f"{name} ({LAYERS[mine][0]}) imports {other} ({LAYERS[layer_of(other)][0]}), a higher layer"
        )


def test_no_import_cycles():
    graph = {name: imports(name) - {"fprune"} for name in MODULES}
    # Sub-package __init__ files re-export their private modules: an edge from a module to its
    # own package's __init__ would be the cycle we look for, so it stays in.
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def private_names_used(name: str) -> list[str]:
    """``module._name`` reads and ``from module import _name`` imports of another fprune module's
    private names (private *modules* are fine: the package's own helpers)."""
    tree = ast.parse(MODULES[name].read_text())
    aliases: dict[str, str] = {}  # local name -> fprune module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fprune"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif a.name.startswith("_") and not a.name.startswith("__") and node.module != name:
                    found.append(f"from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fprune") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and f"{aliases[node.value.id]}.{node.attr}" not in MODULES
        ):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return sorted(set(found))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_names_across_modules(name):
    assert private_names_used(name) == [], (
        f"{name} uses private names of other modules; give them a package-internal public name"
    )


def test_import_leaves_dynamo_and_the_optional_packages_unloaded():
    """``import fprune`` loads torch and optree only: dynamo (a second of start-up, paid by every
    process a user or a launcher starts) loads when something compiles, and transformers,
    safetensors and torch.distributed when a function that needs them is called."""
    import subprocess
    import sys

    code = (
        "import sys, fprune, fprune.compat, fprune.oneshot, fprune.sparse, fprune.structure;"
        "print(sorted(m for m in ('torch._dynamo', 'transformers', 'safetensors', 'torch.distributed.tensor')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
