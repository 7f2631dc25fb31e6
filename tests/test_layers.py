"""The package imports downward only: each module sits on a layer, and no import
(at module level or inside a function) reaches a layer above its own. The layer
list is docs/architecture.md's picture, checked."""

from __future__ import annotations

import ast
from pathlib import Path

import speclm

PACKAGE = Path(speclm.__file__).parent

# Bottom to top. A module belongs to the longest prefix that names it.
LAYERS = [
    ("foundations", ["speclm.errors", "speclm.machine", "speclm.options", "speclm.metrics"]),
    ("arithmetic and the llama.cpp library", ["speclm.sampling", "speclm.constraints", "speclm.costs",
                                               "speclm.llama_lib", "speclm.native",
                                               "speclm.grammar_bounds", "speclm.grammar_safety",
                                               "speclm.grammar_worker"]),
    ("model files", ["speclm.models"]),
    ("backends", ["speclm.backends"]),
    ("request parts", ["speclm.stops", "speclm.prefix_cache", "speclm.heads"]),
    ("speculation", ["speclm.speculative"]),
    ("the engine", ["speclm.api", "speclm.engine"]),
    ("services", ["speclm.server", "speclm.bench", "speclm.loadgen"]),
    ("distribution", ["speclm.distributed"]),
    ("commands", ["speclm.commands", "speclm.__main__", "speclm"]),
]


def layer_of(module: str) -> int:
    best = max(((i, len(p)) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or module.startswith(p + ".")), key=lambda x: x[1])
    return best[0]


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported speclm module, line) for every import statement in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            names = [f"{name}.{a.name}" for a in node.names]
            target = next((n for n in names if n in known and not known[n].name == "__init__.py"), name)
            found.append((target, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
    return [(t, line) for t, line in found if t.startswith("speclm") and t != "speclm"]


def test_every_module_has_a_layer():
    for module in modules():
        assert layer_of(module) is not None, module


def test_no_module_imports_from_a_layer_above_its_own():
    known = modules()
    upward = []
    for module, path in sorted(known.items()):
        for target, line in imports(module, path, known):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]}) at line {line}")
    assert upward == [], "\n".join(upward)
