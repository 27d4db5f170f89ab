"""hetsync's modules import one another in layers: no circle, not even through an import
inside a function (which only hides one)."""

import ast
from pathlib import Path

import hetsync

SRC = Path(hetsync.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the hetsync modules it imports anywhere in its text (a name imported from a
    package counts as its module where it is one, else as the package)."""
    modules = {_module(p): p for p in SRC.rglob("*.py")}

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {known(a.name) for a in node.names if a.name.startswith("hetsync")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if base.startswith("hetsync"):
                    edges |= {known(f"{base}.{a.name}") for a in node.names}
        graph[name] = edges - {name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_circle_finder_finds_one():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_hetsync_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert {"hetsync.config", "hetsync.algorithms.registry", "hetsync.cli"} <= set(graph)
    assert "hetsync.algorithms.registry" in graph["hetsync.config"]
    assert circle(graph) is None, " -> ".join(circle(graph))


#: Each package's floor (docs/design.md, "Layers"): a module imports only from its own package
#: and from packages on lower floors. A new package must be given one here.
FLOORS = {
    "hetsync._version": 0, "hetsync.options": 0, "hetsync.serving": 0, "hetsync.services": 0,
    "hetsync.clock": 0, "hetsync.data": 0, "hetsync.models": 0, "hetsync.compression": 0,
    "hetsync.comm": 1, "hetsync.telemetry": 1,
    "hetsync.state": 2,
    "hetsync.algorithms": 3,
    "hetsync.config": 4,
    "hetsync.command_line": 5,
    "hetsync.runtime": 6,
    "hetsync.bench": 7, "hetsync.distributed_optimizer": 7,
    "hetsync": 8,
    "hetsync.cli": 9,
    "hetsync.reference": 10, "hetsync.__main__": 10,
}


def room(module: str) -> str:
    """The package (or top-level module) of FLOORS that `module` belongs to."""
    return max((r for r in FLOORS if module == r or module.startswith(r + ".")), key=len)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of `graph` from a room into another on the same floor or a higher one."""
    return [f"{m} (floor {FLOORS[room(m)]}) imports {d} (floor {FLOORS[room(d)]})"
            for m, deps in sorted(graph.items()) for d in sorted(deps)
            if room(m) != room(d) and FLOORS[room(d)] >= FLOORS[room(m)]]


def test_the_floor_check_finds_an_import_up_or_across():
    graph = {"hetsync.comm.ps": {"hetsync.runtime.training", "hetsync.clock"},
             "hetsync.telemetry.live": {"hetsync.comm.wire"}}
    assert upward(graph) == [
        "hetsync.comm.ps (floor 1) imports hetsync.runtime.training (floor 6)",
        "hetsync.telemetry.live (floor 1) imports hetsync.comm.wire (floor 1)"]


def test_layers_only_import_downward():
    graph = import_graph()
    unplaced = sorted(m for m in graph if not any(m == r or m.startswith(r + ".")
                                                  for r in FLOORS if r != "hetsync"))
    assert unplaced == ["hetsync"], f"give these a floor in FLOORS: {unplaced}"
    assert upward(graph) == [], "\n".join(upward(graph))
