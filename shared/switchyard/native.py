"""Switchyard's hot modules, compiled with mypyc when a build of their very sources exists.

A few modules of plain, strictly typed Python hold most of the time of the simulator
and of the window scheduler (``COMPILED``): the simulator's event loop, batching
arithmetic, request record, predictions and summary; the LLM performance model, the GAPS
policy, the calibration and the latency objectives it calls on every request; the
window search and the lateness penalty it sums.
``python -m research.native build`` (``make native``, which ``make test``, ``make
test-fast``, ``make simulate-demo`` and the simulator's and scheduler's benchmarks run
first) compiles them, as one mypyc group, into a cache outside the repository, in a
directory named by a digest of the sources it was compiled against (``key_files``: the
shared package and the simulator's package, since mypyc may inline a constant from any
module a compiled one imports) and of the interpreter.

``import switchyard`` installs a finder that loads each of those modules from that
build when it exists, and only then. An edit of any keyed source changes the digest, so
a stale build is never used: the pure-Python modules run, slower and with the same
outcomes (``tests/unit/test_native.py`` checks both ways), until the next build. The
choice is made once a process, for every compiled module at once: the group's modules
call each other directly and share their classes, so they are never mixed with their
pure-Python forms. Only a source checkout has builds; an installed package or a
container image without one runs the pure-Python modules.

``SWITCHYARD_NATIVE=0`` runs the pure-Python modules even where a build exists (a
compiled class's methods cannot be replaced at run time, as a probe that wraps one
would). ``python -m research.native status`` says which runs.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = [
    "COMPILED",
    "DISABLE_ENV",
    "GROUP",
    "KEYED",
    "REPO",
    "build_dir",
    "build_key",
    "cache_root",
    "compiled",
    "install",
    "key_files",
    "served_from",
    "source_path",
]

REPO = Path(__file__).resolve().parents[2]
"""The checkout's root (``shared/switchyard/native.py`` is two folders below it)."""
COMPILED = (
    "research.llm.request",
    "research.llm.predictions",
    "research.llm.instance",
    "research.llm.chunked",
    "research.llm.simulator",
    "research.llm.metrics",
    "switchyard.perf.model",
    "switchyard.policies.gaps",
    "switchyard.prediction.calibration",
    "switchyard.slo",
    "switchyard.apps.penalty",
    "switchyard.selection.snapshot",
    "switchyard.selection.base",
    "switchyard.selection.timeline",
    "switchyard.selection.grouped",
)
"""The compiled modules (one mypyc group)."""
KEYED = ("research/llm", "shared/switchyard")
"""The folders whose Python sources name a build (``key_files``)."""
GROUP = "switchyard_native"
"""The mypyc group's name: its runtime library is the top-level module ``GROUP__mypyc``."""
DISABLE_ENV = "SWITCHYARD_NATIVE"
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def source_path(module: str, root: Path = REPO) -> Path:
    """Where a module's source lives in a checkout: ``switchyard.*`` under ``shared/``."""
    relative = Path(*module.split(".")).with_suffix(".py")
    return root / "shared" / relative if module.startswith("switchyard.") else root / relative


def cache_root() -> Path:
    """Where builds live: ``native`` in ``$SWITCHYARD_CACHE_DIR`` (``~/.cache/switchyard``),
    the cache ``make deps`` keeps the Kafka jars in."""
    base = os.environ.get("SWITCHYARD_CACHE_DIR") or str(Path.home() / ".cache" / "switchyard")
    return Path(base) / "native"


def key_files(root: Path = REPO) -> list[Path]:
    """What a build depends on: the compiled modules, and every module they may read
    types or inline constants from (the rest of the two packages)."""
    return sorted(
        path for folder in KEYED for path in (root / folder).rglob("*.py") if path.is_file()
    )


def build_key(root: Path = REPO) -> str:
    """A digest of ``key_files`` and of the interpreter that will load the build (about
    6 ms, once a process that imports a compiled module)."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {platform.machine()}\n".encode())
    for path in key_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def build_dir(root: Path = REPO) -> Path:
    """The build of ``root``'s sources as they are now (it may not exist)."""
    return cache_root() / f"build-{build_key(root)}"


def served_from(root: Path = REPO) -> Path | None:
    """The build the finder loads the compiled modules from, or ``None``: switched off,
    no checkout, no complete build of these sources, or one this process cannot read.
    Never raises: whatever stands in the way, the pure-Python modules run."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    try:
        if not all(source_path(module, root).is_file() for module in COMPILED):
            return None  # not a source checkout (an installed package, an image)
        found = build_dir(root)
        binaries = [found / f"{GROUP}__mypyc{_SUFFIX}", *(_binary(found, m) for m in COMPILED)]
        if not all(binary.is_file() for binary in binaries):
            return None
    except (OSError, RuntimeError):
        # A source unreadable (its import will say so), no home directory, or a cache this
        # process may not read (a service run as another user than the one who built it).
        return None
    return found


def _binary(build: Path, module: str) -> Path:
    return build / Path(*module.split(".")).with_suffix(_SUFFIX)


class _Finder:
    """Finds the compiled modules (and the group's runtime library) in the build chosen
    at the first import of one of them; every other import passes through untouched."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._names = frozenset((*COMPILED, f"{GROUP}__mypyc"))
        self._build: Path | None = None
        self._chosen = False

    @property
    def build(self) -> Path | None:
        if not self._chosen:
            self._build, self._chosen = served_from(self._root), True
        return self._build

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        del path, target
        if fullname not in self._names or self.build is None:
            return None
        binary = _binary(self.build, fullname)
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(binary))
        return importlib.util.spec_from_file_location(fullname, binary, loader=loader)


def install(root: Path = REPO) -> None:
    """Put the finder first on ``sys.meta_path`` (once a process; ``switchyard`` does it
    on import, before any compiled module can be imported)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder(root))


def compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a build."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)
