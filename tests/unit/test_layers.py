"""The import graph points one way and has no cycle (docs/architecture.md, "Layers").

Every module-level, function-level and type-checking import of every package is read
from the source (nothing is imported), so an import hidden in a function counts too.
The layers, bottom first:

1. the library (``switchyard``), itself in four tiers: the base (contracts, errors,
   configuration), the pure models and policies, the infrastructure over the bus and
   the store, and the service runtime;
2. the services; 3. the load generator; 4. the research tools; 5. the command line;
6. the benchmarks; 7. the tests.

A module may import its own tier or any below it, never above. Two packages of one tier
must not import each other (a package cycle), and no module may reach itself through
its imports (a module cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "switchyard": ROOT / "shared" / "switchyard",
    "services": ROOT / "services",
    "loadgen": ROOT / "loadgen",
    "research": ROOT / "research",
    "cli": ROOT / "cli",
    "bench": ROOT / "bench",
    "tests": ROOT / "tests",
}

# The library's tiers, by its top-level packages and modules (a name missing here is an
# error, so a new package must be placed).
LIBRARY_TIERS: tuple[frozenset[str], ...] = (
    frozenset(
        {
            "",
            "errors",
            "config",
            "contracts",
            "stats",
            "slo",
            "progress",
            "figures",
            "heap",
            "native",
        }
    ),
    frozenset(
        {
            "policies",
            "selection",
            "multimodel",
            "prediction",
            "perf",
            "apps",
            "estimation",
            "traces",
            "serving",
            "torch_training",
        }
    ),
    frozenset({"bus", "state", "telemetry", "cluster", "lifecycle"}),
    frozenset({"runtime"}),
)


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def _modules() -> dict[str, Path]:
    return {
        _module_name(package, root, path): path
        for package, root in PACKAGES.items()
        for path in root.rglob("*.py")
    }


def _resolve(target: str, known: Iterable[str]) -> str | None:
    """The module an import names: ``a.b.c`` or, for ``from a.b import c`` of a name,
    the longest known prefix."""
    names = set(known)
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in names:
            return candidate
    return None


def import_edges() -> set[tuple[str, str]]:
    """(importing module, imported module) for every absolute import in the packages;
    ``from package import module`` counts as importing that module."""
    modules = _modules()
    edges: set[tuple[str, str]] = set()
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update((module, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    edges.add((module, submodule if submodule in modules else node.module))
    return edges


def rank(module: str) -> tuple[int, int]:
    """(layer, tier within the library) of a module; tier 0 outside the library."""
    top, _, rest = module.partition(".")
    layer = list(PACKAGES).index(top)
    if top != "switchyard":
        return layer, 0
    first = rest.split(".")[0]
    for tier, names in enumerate(LIBRARY_TIERS):
        if first in names:
            return layer, tier
    raise AssertionError(f"switchyard.{first} is in no tier of LIBRARY_TIERS: place it")


def upward(edges: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges whose target sits in a higher layer or library tier than their source."""
    return {
        (source, target)
        for source, target in edges
        if target.split(".")[0] in PACKAGES and rank(target) > rank(source)
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _graph(edges: Iterable[tuple[str, str]], depth: int | None) -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        resolved = _resolve(target, modules)
        if resolved is None:
            continue
        a = ".".join(source.split(".")[:depth]) if depth else source
        b = ".".join(resolved.split(".")[:depth]) if depth else resolved
        if a != b:
            graph.setdefault(a, set()).add(b)
    return graph


def test_no_import_runs_back_up_a_layer() -> None:
    found = sorted(upward(import_edges()))
    assert not found, f"imports that run back up a layer: {found}"


def test_no_package_cycle() -> None:
    """Packages one level down (``switchyard.bus``, ``research.llm``, ``services.ingress``)."""
    assert not cycles(_graph(import_edges(), depth=2))


def test_no_module_cycle() -> None:
    assert not cycles(_graph(import_edges(), depth=None))


def test_the_check_sees_an_upward_import() -> None:
    edges = {
        ("switchyard.policies.gaps", "loadgen.mixes"),
        ("switchyard.policies.gaps", "switchyard.state.keys"),
        ("loadgen.replay", "switchyard.bus"),
        ("switchyard.runtime.loop", "switchyard.bus.codec"),
    }
    assert upward(edges) == {
        ("switchyard.policies.gaps", "loadgen.mixes"),
        ("switchyard.policies.gaps", "switchyard.state.keys"),
    }


def test_the_check_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_service_imports_the_research_tools_or_the_command_line() -> None:
    """What the service image leaves out (deploy/docker/Dockerfile copies neither)."""
    shipped = {"switchyard", "services", "loadgen"}
    reached = {
        target.split(".")[0] for source, target in import_edges() if source.split(".")[0] in shipped
    }
    assert not reached & {"research", "cli", "bench", "tests"}
