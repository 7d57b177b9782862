"""Every metric instrument the code makes is in docs/architecture.md's table, and the
table names none the code does not make: the one list operators read stays true."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_CREATORS = frozenset(
    {
        "create_counter",
        "create_up_down_counter",
        "create_histogram",
        "create_gauge",
        "create_observable_gauge",
        "create_observable_counter",
        "create_observable_up_down_counter",
    }
)


def instruments_in_code() -> set[str]:
    """Instrument names passed as literals to a meter's ``create_*`` or to
    :func:`switchyard.telemetry.observables.observe` (its third argument)."""
    names: set[str] = set()
    for folder in (ROOT / "shared" / "switchyard", ROOT / "services"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                position = 0 if called in _CREATORS else 2 if called == "observe" else None
                if position is None or len(node.args) <= position:
                    continue
                arg = node.args[position]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
    return {name for name in names if name.startswith("switchyard.")}


def instruments_in_docs() -> set[str]:
    """The first column of the instrument table; ``a.b.c`, `.d`` names ``a.b.c`` and
    ``a.b.d``."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text[text.index("| instrument | kind | attributes |") :]
    names: set[str] = set()
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        written = re.findall(r"`([a-z_.]+)`", first)
        base = ""
        for name in written:
            if name.startswith("."):
                names.add(base.rsplit(".", 1)[0] + name)
            else:
                base = name
                names.add(name)
    return names


def test_every_instrument_is_documented_and_no_other() -> None:
    code = instruments_in_code()
    docs = instruments_in_docs()
    assert len(code) > 20  # the scan found the instruments at all
    assert sorted(code - docs) == [], "made in code, missing from docs/architecture.md"
    assert sorted(docs - code) == [], "in docs/architecture.md, made nowhere"
