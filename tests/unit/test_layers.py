"""The import graph points one way: the library, then the services, then the load
generator, then the benchmarks, then the tests (docs/architecture.md).

Every module-level and function-level import of every package is read from the source
(nothing is imported), so an import hidden in a function counts too. The imports that
still run back up a layer are listed in ``KNOWN_UPWARD`` with why; the test fails on any
other, and on a listed one that is gone (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "switchyard": ROOT / "shared" / "switchyard",
    "services": ROOT / "services",
    "loadgen": ROOT / "loadgen",
    "bench": ROOT / "bench",
    "tests": ROOT / "tests",
}
LAYER = {name: rank for rank, name in enumerate(PACKAGES)}

KNOWN_UPWARD: dict[tuple[str, str], str] = {
    # The command line sits on top of everything but lives in the library; it imports
    # the services lazily, per command. To move: the CLI into a package of its own.
    ("switchyard.cli", "services"): "the CLI dispatches `service`, `up` and `demo`",
    ("switchyard.cli", "services.cli"): "the CLI dispatches `service`, `up` and `demo`",
    ("switchyard.cli", "services.demo"): "the CLI dispatches `service`, `up` and `demo`",
    # `make demo` replays a trace through the stack: a command, not a service.
    ("services.demo", "loadgen.mixes"): "the stack demo replays a plan",
    ("services.demo", "loadgen.replay"): "the stack demo replays a plan",
    ("services.demo", "loadgen.replay_report"): "the stack demo prints the replay's report",
    # The process-stack harness is shared by the integration tests and the benchmarks;
    # it belongs in the package, not under tests/.
    ("bench.agreement_bench", "tests.support.agreement"): "harness under tests/",
    ("bench.hot_path_bench", "tests.support.process_stack"): "harness under tests/",
    ("bench.recovery_bench", "tests.support.process_stack"): "harness under tests/",
    ("bench.recovery_bench", "tests.support.recovery"): "harness under tests/",
    ("bench.multimodel_policy_bench", "tests.support.multimodel"): "harness under tests/",
}


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def import_edges() -> set[tuple[str, str]]:
    """(importing module, imported module) for every absolute import in the packages."""
    edges: set[tuple[str, str]] = set()
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            module = _module_name(package, root, path)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    edges.update((module, alias.name) for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    edges.add((module, node.module))
    return edges


def upward(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges whose target is in a higher layer than their source."""
    found = set()
    for source, target in edges:
        source_layer = LAYER[source.split(".")[0]]
        target_layer = LAYER.get(target.split(".")[0])
        if target_layer is not None and target_layer > source_layer:
            found.add((source, target))
    return found


def test_no_import_runs_back_up_a_layer() -> None:
    found = upward(import_edges())
    new = sorted(found - KNOWN_UPWARD.keys())
    assert not new, f"imports that run back up a layer: {new}"
    gone = sorted(KNOWN_UPWARD.keys() - found)
    assert not gone, f"no longer imported, take them off KNOWN_UPWARD: {gone}"


def test_the_check_sees_an_upward_import() -> None:
    edges = {("switchyard.sim.command", "loadgen.mixes"), ("loadgen.replay", "switchyard.bus")}
    assert upward(edges) == {("switchyard.sim.command", "loadgen.mixes")}


def test_the_library_reads_traces_without_the_load_generator() -> None:
    library = {(s, t) for s, t in import_edges() if s.startswith("switchyard.")}
    assert not {t for _, t in library if t.split(".")[0] == "loadgen"}
