"""The package's shape, read from its source with ``ast``: no import cycle, few top-level modules, and
imports that only go down (lessons never import what judges or drives them; serving talks to the
lessons through the shared types)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "solutions" / "specdec"
MAX_TOP_LEVEL_MODULES = 20
#: Folders whose modules judge, catalogue, drive or measure the lessons: nothing below them imports them.
UPPER = ("specdec.checks", "specdec.mistakes", "specdec.course", "specdec.bench", "specdec.drill")
#: The shared types and helpers every loop builds on: they import only each other and the model.
LOW = {"specdec.params", "specdec.validate", "specdec.sampling", "specdec.paths", "specdec.tables"}
LOW_MAY_IMPORT = LOW | {"specdec.models.model"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the specdec modules it imports (anywhere in its body, function bodies included)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(name: str) -> str | None:  # "specdec.a.b.Name" -> the longest prefix that is a module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.startswith("specdec")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec"):
                assert node.level == 0, f"{name}: use absolute imports"
                deps |= {resolve(f"{node.module}.{a.name}") for a in node.names}
        graph[name] = deps - {None, name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path a -> ... -> a, or None (depth-first search, colouring nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_few_modules_at_the_top():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules directly under specdec/: {top}; give them a folder"


def test_imports_only_go_down(graph):
    for module, deps in graph.items():
        if module.startswith(UPPER):
            continue
        upward = sorted(d for d in deps if d.startswith(UPPER))
        assert not upward, f"{module} imports {upward}: lessons and models never import checks, mistakes, course or bench"


def test_low_modules_import_nothing_above_them(graph):
    for module in LOW:
        assert graph[module] <= LOW_MAY_IMPORT, f"{module} imports {sorted(graph[module] - LOW_MAY_IMPORT)}"


def test_serving_reaches_the_lessons_through_shared_types(graph):
    loops = {"specdec.engine", "specdec.recording", "specdec.lookup", "specdec.tree"}
    for module, deps in graph.items():
        if module.startswith("specdec.serving"):
            assert not deps & loops, f"{module} imports {sorted(deps & loops)}: use specdec.params instead"


def test_lessons_do_not_import_their_recording_facade(graph):
    for lesson in ("specdec.engine", "specdec.lookup", "specdec.tree"):
        assert "specdec.recording" not in graph[lesson], f"{lesson} imports specdec.recording"
