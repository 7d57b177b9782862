"""The compiled simulator (``research.native``): used when a build of the very sources
exists, never when they changed since, and the same outcomes as the pure-Python one."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import research.llm
from research import native
from tests.unit import test_simulator_golden as golden

REPO = Path(__file__).resolve().parents[2]
# Cases of every kind the golden tests pin: a rebalancer, a mixed cluster, prefixes,
# chunked prefill, prefill/decode pools.
CASES = (
    "gaps-conv-x6",
    "llumnix-mixed",
    "switchyard-mooncake",
    "switchyard-chunked",
    "switchyard-disaggregated",
)


def _copy_sources(root: Path) -> None:
    for folder in native.KEYED:
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("*.pyc"))


def test_make_test_runs_the_compiled_simulator() -> None:
    # `make test` runs `make native`, which compiles the current sources: the tests below
    # (and every simulator test of the suite) then run the compiled modules.
    assert research.llm.NATIVE, (
        f"no compiled build of the simulator's sources at {native.build_dir()}: run make native"
    )
    assert research.llm.simulator.__file__.endswith(".so")
    assert str(native.build_dir()) in research.llm.instance.__file__


def test_pure_python_and_compiled_give_the_same_outcomes() -> None:
    # Every golden digest holds in a process that runs the pure-Python modules, as in
    # this one (compiled, the test above): compiling changed no outcome to the last bit.
    script = (
        "import json, sys\n"
        "import research.llm\n"
        "from tests.unit import test_simulator_golden as golden\n"
        "digests = {n: golden.outcome(golden.CASES[n])[0] for n in sys.argv[1:]}\n"
        "print(json.dumps({'native': research.llm.NATIVE, 'digests': digests}))\n"
    )
    env = dict(os.environ, SWITCHYARD_SIM_NATIVE="0")
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


@pytest.mark.parametrize(
    "edited",
    [
        "research/llm/instance.py",  # a compiled module
        "shared/switchyard/contracts/fields.py",  # a constant mypyc may have inlined
    ],
)
def test_an_edit_of_a_source_it_was_compiled_against_leaves_the_build_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edited: str
) -> None:
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    root = tmp_path / "checkout"
    _copy_sources(root)
    # A build of these sources (its files stand in for the compiled modules).
    built = native.build_dir(root) / "research" / "llm"
    built.mkdir(parents=True)
    path: list[str] = ["/src/research/llm"]
    assert native.activate(path, root)
    assert path == [str(built), "/src/research/llm"]
    # One byte more in one source: another digest, so that build is not used.
    with (root / edited).open("a") as source:
        source.write("\n")
    path = ["/src/research/llm"]
    assert not native.activate(path, root)
    assert path == ["/src/research/llm"]


def test_the_switch_turns_a_matching_build_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    _copy_sources(root)
    (native.build_dir(root) / "research" / "llm").mkdir(parents=True)
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    path: list[str] = []
    assert not native.activate(path, root)
    assert path == []


def test_status_says_which_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    native.main(["status"])
    assert capsys.readouterr().out.startswith("compiled: ")
    assert native.main(["status", "--quiet"]) == 0
    monkeypatch.setenv("SWITCHYARD_CACHE_DIR", str(tmp_path))
    assert native.main(["status", "--quiet"]) == 1
    native.main(["status"])
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
    assert native.main(["build"]) == 1
    assert capsys.readouterr().err == (
        "research.native: mypyc is missing: `make deps` installs it (mypy, the dev extra)\n"
    )
    assert not any(tmp_path.rglob("*"))  # nothing half-built left behind
