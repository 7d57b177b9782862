"""Argument parsing shared by the ``switchyard`` subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

__all__ = ["comma_list"]

T = TypeVar("T")


def comma_list(kind: Callable[[str], T], what: str) -> Callable[[str], tuple[T, ...]]:
    """An argparse ``type`` reading ``"a,b,c"`` into a tuple of ``kind`` values; an empty
    list or an unreadable item is an error naming the option ``what``."""

    def parse(text: str) -> tuple[T, ...]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{what}: expected a comma-separated list")
        try:
            return tuple(kind(item) for item in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: cannot read {text!r}") from None

    return parse
