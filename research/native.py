"""Builds the compiled forms of Switchyard's hot modules (:mod:`switchyard.native`).

``python -m research.native build`` (``make native``) compiles ``switchyard.native.COMPILED``
with mypyc, as one group, into ``switchyard.native.build_dir()``, unless a build of the
current sources exists (a few minutes of gcc). ``python -m research.native status`` says
whether the compiled or the pure-Python modules run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from switchyard.native import (
    COMPILED,
    DISABLE_ENV,
    GROUP,
    REPO,
    build_dir,
    build_key,
    cache_root,
    served_from,
    source_path,
)

__all__ = ["KEEP_BUILDS", "BuildError", "build", "main"]

KEEP_BUILDS = 8
"""Builds kept in the cache (about 2 MB each), the newest first."""

_SETUP = """
import sys
from mypyc.build import mypycify
from setuptools import setup

setup(
    name="switchyard-native",
    ext_modules=mypycify(sys.argv[3:], opt_level="3", group_name=sys.argv[2], target_dir=sys.argv[1] + "/c"),
    script_args=["build_ext", "--build-lib", sys.argv[1] + "/lib", "--build-temp", sys.argv[1] + "/obj"],
)
"""


class BuildError(RuntimeError):
    """A build that could not be made; the message says why."""


def build(root: Path = REPO, *, force: bool = False) -> Path:
    """Compile ``COMPILED`` unless a build of the current sources exists."""
    sources = [source_path(module, root) for module in COMPILED]
    missing = [path for path in sources if not path.is_file()]
    if missing:
        raise BuildError(f"not a source checkout: {missing[0]} is missing")
    key = build_key(root)
    target = build_dir(root)
    if target.is_dir() and not force:
        return target
    if importlib.util.find_spec("mypyc") is None:
        raise BuildError("mypyc is missing: `make deps` installs it (mypy, the dev extra)")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise BuildError("no C compiler (cc or gcc) on PATH: `make deps` installs gcc")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".building-") as scratch:
        env = dict(os.environ, MYPYPATH=str(root / "shared"))
        # Run from the root: mypy reads the project's settings (pyproject.toml) there.
        # mypyc names each module from its path below the first folder that is not a
        # package, so shared/switchyard/perf/model.py is switchyard.perf.model.
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                _SETUP,
                scratch,
                GROUP,
                *(path.relative_to(root).as_posix() for path in sources),
            ],
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
    _prune(cache_root(), keep=KEEP_BUILDS)
    return target


def _prune(root: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest builds (several checkouts may share the cache,
    and the simulator-only builds of before, ``sim-*``, count among them)."""
    builds = sorted(
        [*root.glob("build-*"), *root.glob("sim-*")],
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
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
            print(f"compiled modules: {build(force=args.force)}")
        except BuildError as exc:
            print(f"research.native: {exc}", file=sys.stderr)
            return 1
        return 0
    found = served_from()
    if args.quiet:
        return 0 if found is not None else 1
    if os.environ.get(DISABLE_ENV, "1") == "0":
        print(f"pure Python ({DISABLE_ENV}=0)")
    elif found is not None:
        print(f"compiled: {found}")
    else:
        print(
            f"pure Python: no build of these sources (expected at {build_dir()}); run make native"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
