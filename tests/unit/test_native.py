"""The compiled hot modules (``switchyard.native``, built by ``research.native``): used
when a build of the very sources exists, never when they changed since, all or none of
them, and the same outcomes as the pure-Python modules."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from switchyard import native
from switchyard.policies.base import DecisionContext
from switchyard.selection.registry import make_window_scheduler

import research.llm
from research import native as native_build
from tests.unit import test_grouped_search as windows
from tests.unit import test_simulator_golden as golden

REPO = Path(__file__).resolve().parents[2]
# Cases of every kind the golden tests pin: a rebalancer, a mixed cluster, prefixes,
# chunked prefill, prefill/decode pools, decisions on heartbeats.
CASES = (
    "gaps-conv-x6",
    "llumnix-mixed",
    "switchyard-mooncake",
    "switchyard-chunked",
    "switchyard-disaggregated",
    "switchyard-heartbeats",
)
WINDOW_SCHEDULERS = ("grouped", "grouped-da", "sneakpeek")


def window_plans() -> dict[str, list[str]]:
    """Every window scheduler's plans of 60 random windows (both penalty shapes, one and
    two workers), each written out in full: ``repr`` gives every float to the last bit."""
    rng = random.Random(7)
    snapshots = [
        windows._window(rng, windows.PENALTIES[penalty], workers)
        for penalty in ("step", "sigmoid")
        for workers in (1, 2)
        for _ in range(15)
    ]
    plans: dict[str, list[str]] = {}
    for name in WINDOW_SCHEDULERS:
        scheduler = make_window_scheduler(name)
        plans[name] = [
            repr(scheduler.schedule(snapshot, DecisionContext(rng=random.Random(i))))
            for i, snapshot in enumerate(snapshots)
        ]
    return plans


def _copy_sources(root: Path) -> None:
    for folder in native.KEYED:
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("*.pyc"))


def _fake_build(root: Path) -> Path:
    """Empty files where a build of ``root``'s sources keeps its binaries."""
    found = native.build_dir(root)
    for module in (*native.COMPILED, f"{native.GROUP}__mypyc"):
        binary = native._binary(found, module)
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.touch()
    return found


def test_make_test_runs_every_hot_module_compiled() -> None:
    # `make test` runs `make native`, which compiles the current sources: the tests below
    # (and every simulator and window-scheduler test of the suite) then run them compiled.
    assert native.served_from() is not None, (
        f"no compiled build of these sources at {native.build_dir()}: run make native"
    )
    assert research.llm.NATIVE
    for name in native.COMPILED:
        module = importlib.import_module(name)
        assert native.compiled(module), name
        assert str(native.build_dir()) in str(module.__file__)


def test_pure_python_and_compiled_give_the_same_outcomes() -> None:
    # Every golden digest of the simulator and every window plan is the same in a
    # process that runs the pure-Python modules as in this one (compiled, the test
    # above): compiling changed no outcome to the last bit.
    script = (
        "import json, sys\n"
        "import research.llm\n"
        "from tests.unit import test_simulator_golden as golden\n"
        "from tests.unit.test_native import window_plans\n"
        "digests = {n: golden.outcome(golden.CASES[n])[0] for n in sys.argv[1:]}\n"
        "print(json.dumps({'native': research.llm.NATIVE, 'digests': digests,"
        " 'plans': window_plans()}))\n"
    )
    env = dict(os.environ, **{native.DISABLE_ENV: "0"})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "shared"), str(REPO)])
    run = subprocess.run(
        [sys.executable, "-c", script, *CASES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    pure = json.loads(run.stdout.strip().splitlines()[-1])
    assert pure["native"] is False
    compiled = {name: golden.outcome(golden.CASES[name])[0] for name in CASES}
    assert pure["digests"] == compiled == {name: golden.GOLDEN[name] for name in CASES}
    assert pure["plans"] == window_plans()


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A copy of the keyed sources, and a (fake) build of them in a cache of its own."""
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    root = tmp_path / "checkout"
    _copy_sources(root)
    return root, _fake_build(root)


@pytest.mark.parametrize(
    "edited",
    [
        "research/llm/instance.py",  # a compiled module
        "shared/switchyard/selection/grouped.py",  # another
        "shared/switchyard/contracts/fields.py",  # a constant mypyc may have inlined
    ],
)
def test_an_edit_of_a_source_it_was_compiled_against_leaves_the_build_unused(
    checkout: tuple[Path, Path], edited: str
) -> None:
    root, built = checkout
    assert native.served_from(root) == built
    # One byte more in one source: another digest, so that build is not used.
    with (root / edited).open("a") as source:
        source.write("\n")
    assert native.served_from(root) is None


def test_a_build_missing_one_module_is_not_used(checkout: tuple[Path, Path]) -> None:
    # The compiled modules call each other directly: never some compiled, some not.
    root, built = checkout
    native._binary(built, "switchyard.selection.grouped").unlink()
    assert native.served_from(root) is None


def test_the_switch_turns_a_matching_build_off(
    checkout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    assert native.served_from(checkout[0]) is None


def test_status_says_which_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    native_build.main(["status"])
    assert capsys.readouterr().out.startswith("compiled: ")
    assert native_build.main(["status", "--quiet"]) == 0
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path))
    assert native_build.main(["status", "--quiet"]) == 1
    native_build.main(["status"])
    assert "run make native" in capsys.readouterr().out


def test_a_build_without_mypyc_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path))  # no build there
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "mypyc" else real_find_spec(name, *a),
    )
    assert native_build.main(["build"]) == 1
    assert capsys.readouterr().err == (
        "research.native: mypyc is missing: `make deps` installs it (mypy, the dev extra)\n"
    )
    assert not any(tmp_path.rglob("*"))  # nothing half-built left behind


def test_the_selection_benchmark_times_both_builds_in_one_sitting(tmp_path: Path) -> None:
    # Each repeat runs a child process per build; a row names the build it timed.
    out = tmp_path / "figures.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "shared"), str(REPO)]))
    subprocess.run(
        [
            *(sys.executable, "-m", "bench.selection_bench", "--builds", "compiled,pure"),
            *("--schedulers", "sneakpeek", "--windows", "10", "--warmup", "2"),
            *("--repeats", "2", "--json", str(out)),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        check=True,
        timeout=300,
    )
    document = json.loads(out.read_text())
    assert document["config"]["build"] == "compiled,pure"
    rows = document["schedulers"]
    assert set(rows) == {"sneakpeek (compiled)", "sneakpeek (pure)"}
    assert all(len(row["p99_ms_runs"]) == 2 for row in rows.values())


def test_a_build_this_process_cannot_read_leaves_the_pure_modules_running(
    checkout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service run as another user than the one who built (a fault harness's cut-off
    # worker) may not read the cache: it runs the pure-Python modules, it does not fail.
    root, built = checkout
    real_is_file = Path.is_file

    def refused(path: Path) -> bool:
        if path.is_relative_to(built):
            raise PermissionError(13, "Permission denied", str(path))
        return real_is_file(path)

    monkeypatch.setattr(Path, "is_file", refused)
    assert native.served_from(root) is None
