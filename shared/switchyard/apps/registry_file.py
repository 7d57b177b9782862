"""Reading and writing a registry file (:mod:`switchyard.apps.registry` has its models).

:func:`load_registry` reads JSON (YAML for a ``.yaml``/``.yml`` name, when PyYAML is
installed) and turns every problem into one :class:`~switchyard.apps.registry.RegistryError`
line naming the file and the field path; :func:`save_registry` writes JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from switchyard.apps.registry import FieldError, Registry, RegistryError

__all__ = ["REGISTRY_FILE", "load_registry", "registry_from_data", "save_registry"]

REGISTRY_FILE = "registry.json"
"""The registry's file name in the folder `switchyard apps build` writes."""


def _field_path(location: tuple[str | int, ...]) -> str:
    """``("applications", 1, "variants", "a", "accuracy")`` -> ``applications[1].variants.a.accuracy``."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            text += " (key)"
        else:
            text += f".{part}" if text else part
    return text


def _describe(error: ErrorDetails) -> str:
    location = tuple(error["loc"])
    message = error["msg"]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, FieldError):
        location += cause.path
        message = str(cause)
    elif error["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    path = _field_path(location)
    return f"{path}: {message}" if path else message


def _validation_message(exc: ValidationError) -> str:
    errors = exc.errors()
    text = _describe(errors[0])
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def registry_from_data(data: Any, source: str) -> Registry:
    """Validate already-parsed registry data; errors name ``source`` and the field path."""
    if not isinstance(data, Mapping):
        raise RegistryError(
            f"registry {source}: expected an object with an 'applications' list "
            "and/or a 'pipelines' list, "
            f"got {type(data).__name__}"
        )
    old = sorted(_millisecond_fields(data))
    if old:
        raise RegistryError(
            f"registry {source}: {', '.join(old)}: a registry of an earlier format, in "
            "milliseconds; registries now give every time in seconds (deadline_s, "
            "latency_s, load_s, span_s, steepness_per_s, midpoint_s): rebuild it with "
            "`switchyard apps build`"
        )
    try:
        return Registry.model_validate(data)
    except ValidationError as exc:
        raise RegistryError(f"registry {source}: {_validation_message(exc)}") from None


def _millisecond_fields(data: Any) -> set[str]:
    """Every key ending in ``_ms`` anywhere in ``data``."""
    if isinstance(data, Mapping):
        found = {key for key in data if isinstance(key, str) and key.endswith("_ms")}
        for value in data.values():
            found |= _millisecond_fields(value)
        return found
    if isinstance(data, list):
        return set().union(*(_millisecond_fields(item) for item in data)) if data else set()
    return set()


def _is_yaml(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


def _yaml_module(source: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise RegistryError(
            f"registry {source}: YAML needs PyYAML, which is not installed; use JSON"
        ) from None
    return yaml


def load_registry(path: str | os.PathLike[str]) -> Registry:
    """Read and validate a registry file.

    Raises:
        RegistryError: one line naming the file and, for an invalid value, the field
            path: for an unreadable or empty file, invalid JSON (with line and column),
            or any invalid field.

    Example:
        >>> load_registry("registry.json").application("digits").deadline_s
        0.15
    """
    file = Path(path)
    source = str(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RegistryError(f"registry {source}: cannot read the file: {reason}") from None
    if not text.strip():
        raise RegistryError(f"registry {source}: the file is empty")
    if _is_yaml(file):
        yaml = _yaml_module(source)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            detail = " ".join(str(exc).split())
            raise RegistryError(f"registry {source}: invalid YAML: {detail}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RegistryError(
                f"registry {source}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                f"{exc.msg}"
            ) from None
    return registry_from_data(data, source)


def save_registry(registry: Registry, path: str | os.PathLike[str]) -> None:
    """Write ``registry`` to ``path`` (JSON; YAML for a ``.yaml``/``.yml`` name), atomically.

    The file is written beside ``path`` and renamed over it, so a reader never sees half
    a registry. ``load_registry(path)`` gives back an equal registry.

    Raises:
        RegistryError: when the file cannot be written (or YAML is asked for without PyYAML).
    """
    file = Path(path)
    source = str(path)
    data = registry.model_dump(mode="json", exclude_none=True)
    # Leave out empty sections, so that a classification-only registry keeps its format.
    for section in ("models", "pipelines", "applications"):
        if not data.get(section):
            data.pop(section, None)
    if _is_yaml(file):
        text = _yaml_module(source).safe_dump(data, sort_keys=False)
    else:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    temporary = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        try:
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, file)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise RegistryError(f"registry {source}: cannot write the file: {exc.strerror}") from None
