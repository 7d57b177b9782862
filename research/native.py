"""The LLM simulator's hot modules, compiled with mypyc when a build of their very sources
exists.

The simulator spends its time in a few modules of plain, strictly typed Python
(``COMPILED``): the event loop, the instances' batching arithmetic, the request record
and the requests' predictions. ``python -m research.native build`` (``make native``,
which ``make test``, ``make test-fast``, ``make simulate-demo`` and the simulator's
benchmarks run first) compiles them with mypyc into a cache outside the repository, in
a directory named by a digest of the sources it was compiled against (``key_files``:
those modules and the shared package they read types and constants from) and the
interpreter, and ``research.llm`` imports the compiled modules from there when one
matches. An edit of any of those sources changes the digest, so a stale build is never
used: the pure-Python modules run, slower and with the same outcomes
(``tests/unit/test_native_simulator.py`` checks the golden digests both ways), until
the next build.

``SWITCHYARD_SIM_NATIVE=0`` runs the pure-Python modules even where a build exists (a
compiled class's methods cannot be replaced at run time, as a probe that wraps one
would). ``python -m research.native status`` says which runs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = [
    "COMPILED",
    "DISABLE_ENV",
    "BuildError",
    "activate",
    "build",
    "build_dir",
    "build_key",
    "cache_root",
    "key_files",
]

REPO = Path(__file__).resolve().parent.parent
COMPILED = (
    "research/llm/request.py",
    "research/llm/predictions.py",
    "research/llm/instance.py",
    "research/llm/chunked.py",
    "research/llm/simulator.py",
)
"""The compiled modules, as paths from the repository's root (one mypyc group)."""
KEYED = ("research/llm", "shared/switchyard")
"""The folders whose Python sources name a build (``key_files``)."""
GROUP = "switchyard_sim"
"""The mypyc group's name: its runtime library is the top-level module ``GROUP__mypyc``."""
DISABLE_ENV = "SWITCHYARD_SIM_NATIVE"
KEEP_BUILDS = 8
"""Builds kept in the cache (about 1 MB each), the newest first."""


def cache_root() -> Path:
    """Where builds live: ``native`` in ``$SWITCHYARD_CACHE_DIR`` (``~/.cache/switchyard``),
    the cache ``make deps`` keeps the Kafka jars in."""
    base = os.environ.get("SWITCHYARD_CACHE_DIR") or str(Path.home() / ".cache" / "switchyard")
    return Path(base) / "native"


def key_files(root: Path = REPO) -> list[Path]:
    """What a build depends on: the compiled modules, and every module they may read
    types or inline constants from (the rest of ``research/llm`` and the shared package)."""
    return sorted(
        path for folder in KEYED for path in (root / folder).rglob("*.py") if path.is_file()
    )


def build_key(root: Path = REPO) -> str:
    """A digest of ``key_files`` and of the interpreter that will load the build (about
    6 ms, once a process)."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {platform.machine()}\n".encode())
    for path in key_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def build_dir(root: Path = REPO) -> Path:
    """The build of ``root``'s sources as they are now (it may not exist)."""
    return cache_root() / f"sim-{build_key(root)}"


def activate(package_path: list[str], root: Path = REPO) -> bool:
    """Put the matching build first on ``research.llm``'s path, if there is one.

    Called by ``research/llm/__init__.py`` before it imports any compiled module;
    returns whether the compiled modules will be the ones imported.
    """
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return False
    try:
        found = build_dir(root)
    except (OSError, RuntimeError):
        return False  # a source unreadable (its import will say so), or no home directory
    modules = found / "research" / "llm"
    if not modules.is_dir():
        return False
    if str(found) not in sys.path:
        sys.path.append(str(found))  # its runtime library, a module no one else names
    package_path.insert(0, str(modules))
    return True


_SETUP = """
import sys
from mypyc.build import mypycify
from setuptools import setup

setup(
    name="switchyard-sim-native",
    ext_modules=mypycify(sys.argv[3:], opt_level="3", group_name=sys.argv[2], target_dir=sys.argv[1] + "/c"),
    script_args=["build_ext", "--build-lib", sys.argv[1] + "/lib", "--build-temp", sys.argv[1] + "/obj"],
)
"""


class BuildError(RuntimeError):
    """A build that could not be made; the message says why."""


def build(root: Path = REPO, *, force: bool = False) -> Path:
    """Compile ``COMPILED`` (a few minutes of gcc) unless a build of them exists."""
    key = build_key(root)
    target = cache_root() / f"sim-{key}"
    if target.is_dir() and not force:
        return target
    if importlib.util.find_spec("mypyc") is None:
        raise BuildError("mypyc is missing: `make deps` installs it (mypy, the dev extra)")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise BuildError("no C compiler (cc or gcc) on PATH: `make deps` installs gcc")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".building-") as scratch:
        env = dict(os.environ, MYPYPATH=str(root / "shared"))
        # Run from the root: mypy reads the project's settings (pyproject.toml) there
        # and names the modules from their paths.
        run = subprocess.run(
            [sys.executable, "-c", _SETUP, scratch, GROUP, *COMPILED],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            said = "\n".join((run.stdout + run.stderr).strip().splitlines()[-30:])
            raise BuildError(f"mypyc or the C compiler failed:\n{said}")
        if build_key(root) != key:
            # A source was edited while it compiled: the build may hold either version.
            raise BuildError("a source changed during the build; run it again")
        staged = Path(scratch) / "lib"
        if force and target.is_dir():
            shutil.rmtree(target)
        try:
            staged.rename(target)
        except OSError:
            if not target.is_dir():  # another build finished first: keep that one
                raise
    _prune(target.parent, keep=KEEP_BUILDS)
    return target


def _prune(root: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest builds (several checkouts may share the cache)."""
    builds = sorted(root.glob("sim-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m research.native", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=("build", "status"))
    parser.add_argument("--force", action="store_true", help="build again even if one exists")
    parser.add_argument(
        "--quiet", action="store_true", help="status: print nothing, exit 1 without a build"
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            print(f"compiled simulator: {build(force=args.force)}")
        except BuildError as exc:
            print(f"research.native: {exc}", file=sys.stderr)
            return 1
        return 0
    found = build_dir()
    if args.quiet:
        return 0 if found.is_dir() else 1
    if os.environ.get(DISABLE_ENV, "1") == "0":
        print(f"pure Python ({DISABLE_ENV}=0)")
    elif found.is_dir():
        print(f"compiled: {found}")
    else:
        print(f"pure Python: no build of these sources (expected at {found}); run make native")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
