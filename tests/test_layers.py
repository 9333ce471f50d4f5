"""codeckv's subpackages are layers that import downward only, with no import circle, and a tier is resolved at
the edge: read from the source (every import, those inside functions included) and from a real chat turn."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Lowest first: a module may import its own layer and the layers before it, never one after it.
LAYERS = [
    ("codeckv", "codeckv.paths", "codeckv.loaded", "codeckv.corpus"),  # leaves (the package's lazy __init__)
    ("codeckv.codecs", "codeckv.presses"),  # how a layer stores its tokens; which tokens it keeps
    ("codeckv.tiers", "codeckv.custom_tier"),
    ("codeckv.cache",),
    ("codeckv.models",),
    ("codeckv.measure",),
    ("codeckv.figures",),
    ("codeckv.serve",),
    ("codeckv.cli", "codeckv.__main__"),
]


def _layer(module: str) -> int:
    """The index in LAYERS of the longest prefix naming `module`."""
    best = max((len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + "."))
    return best[1]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "codeckv").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (never executed)."""
    blocks = [s for s in ast.walk(tree) if isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test)]
    return {id(node) for block in blocks for node in ast.walk(block)}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The codeckv modules a file imports anywhere (inside functions too), except under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: codeckv imports absolutely"
            for alias in node.names:  # `from codeckv.cache import calibration` imports a module
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return {name for name in found if name == "codeckv" or name.startswith("codeckv.")}


def test_every_import_points_down_the_layers():
    modules = _modules()
    upward = [f"{module} (layer {_layer(module)}) imports {name} (layer {_layer(name)})"
              for module, path in modules.items() for name in _imports(path, modules) if _layer(name) > _layer(module)]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    modules = _modules()
    graph = {m: {n for n in _imports(p, modules) if n in modules and n != m} for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*trail, node])):
                return cycle
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [])):
            pytest.fail("import circle: " + " -> ".join(cycle))


def test_the_codecs_import_nothing_above_them():
    code = "import sys, codeckv.codecs; print(sorted({m for m in sys.modules if m.startswith('codeckv.')}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert all(m.startswith("codeckv.codecs") for m in eval(done.stdout)), done.stdout


def test_a_tier_is_resolved_in_few_places():
    """`as_tier(` appears in at most 6 places (its definition included): the public entry points that take a name."""
    places = [f"{path.relative_to(ROOT)}:{n}" for path in (ROOT / "codeckv").rglob("*.py")
              for n, line in enumerate(path.read_text().splitlines(), 1) if "as_tier(" in line.split("#")[0]
              and not line.lstrip().startswith(('"', "'"))]
    assert len(places) <= 6, places
