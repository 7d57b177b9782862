"""Where the live stack's catalogue comes from: a registry file, or the default one built
once into the cache.

:func:`load_catalogue` is what every service calls at start. With ``SWITCHYARD_REGISTRY``
set it reads that file; otherwise it uses the default registry under
``SWITCHYARD_CACHE_DIR``, building it first when it is missing (training and profiling
the classification variants takes a few seconds and needs the ``ml`` extra). Concurrent
processes take a file lock, so one builds and the others wait and read.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from switchyard.apps.registry_file import REGISTRY_FILE, load_registry, save_registry
from switchyard.config import Settings
from switchyard.errors import ConfigError
from switchyard.serving.catalogue import CatalogueError, ServingCatalogue

DEFAULT_REGISTRY_SEED = 0
_BUILD_VERSION = "v2"  # bump when the default applications, their variants or the format change
_PROFILE_REPEATS = 5


def default_registry_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """The folder of the default registry under ``cache_dir``."""
    return Path(cache_dir) / "serving" / f"apps-{_BUILD_VERSION}-seed{DEFAULT_REGISTRY_SEED}"


def ensure_default_registry(cache_dir: str | os.PathLike[str]) -> Path:
    """The default registry file, built first when missing; returns its path.

    Raises:
        ConfigError: when it must be built and the ``ml`` extra (torch, scikit-learn) is
            not installed.
    """
    folder = default_registry_dir(cache_dir)
    path = folder / REGISTRY_FILE
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():  # another process built it while we waited
            return path
        try:
            from switchyard.apps.profiling import build_registry
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ConfigError(
                f"the default registry is not built yet ({path}) and building it needs the "
                f"ml extra ({exc.name} is missing): install switchyard[ml], run "
                "`switchyard apps build --out DIR` and set SWITCHYARD_REGISTRY=DIR/registry.json"
            ) from exc
        registry = build_registry(folder, seed=DEFAULT_REGISTRY_SEED, repeats=_PROFILE_REPEATS)
        partial = path.with_suffix(".partial")
        save_registry(registry, partial)
        partial.replace(path)  # readers never see half a file
    return path


def load_catalogue(
    registry: str | None, cache_dir: str, *, pipeline_catalogue: str = "txt2img"
) -> ServingCatalogue:
    """The catalogue of ``registry`` (a file), or of the default registry when None;
    ``pipeline_catalogue`` names the pipelines served when the registry declares none.

    Raises:
        ConfigError: the file is missing or invalid (one line naming the file and field).
    """
    from switchyard.apps.registry import RegistryError

    path = Path(registry) if registry else ensure_default_registry(cache_dir)
    if not path.is_file():
        raise ConfigError(f"SWITCHYARD_REGISTRY={str(path)!r}: no such file")
    try:
        loaded = load_registry(path)
    except RegistryError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return ServingCatalogue.from_registry(
            loaded, path.parent, pipeline_catalogue=pipeline_catalogue
        )
    except CatalogueError as exc:
        raise ConfigError(f"registry {path.name}: {exc}") from None


def settings_catalogue(settings: Settings) -> ServingCatalogue:
    """The catalogue ``settings`` name: :func:`load_catalogue` of its registry, cache
    folder and pipeline catalogue (what every service loads at start)."""
    return load_catalogue(
        settings.registry, settings.cache_dir, pipeline_catalogue=settings.pipeline_catalogue
    )
