"""Conditional stages: which stages of a pipeline run, given what earlier stages answered.

One definition for the simulator and the live stack. A stage whose model has ``labels``
(a classifier) answers one of them; a stage with ``when`` runs only when the stage it
names answered that label; a stage every one of whose ``after`` stages was skipped is
skipped too (there is nothing to run it on), and a skipped stage counts as done for
the stages after it.

Which label an emulated classifier answers is drawn from its shares by a number in
``[0, 1)``: the simulator passes its seeded generator's, an emulated worker one derived
from the request id (:func:`unit_of`), so a retried stage answers as it did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from switchyard.multimodel.model import Stage

__all__ = ["condition_problem", "label_at", "labels_problem", "stage_runs", "unit_of"]


def label_at(labels: Sequence[tuple[str, float]], u: float) -> str | None:
    """The label whose share covers ``u`` in ``[0, 1)`` when the shares are laid end to
    end in order (the last one for rounding), or ``None`` for a model without labels.

    Example: ``label_at((("safe", 0.9), ("unsafe", 0.1)), 0.95)`` -> ``"unsafe"``.
    """
    if not labels:
        return None
    edge = 0.0
    for label, share in labels:
        edge += share
        if u < edge:
            return label
    return labels[-1][0]


def unit_of(text: str) -> float:
    """A number in ``[0, 1)`` fixed by ``text`` (a hash, spread evenly)."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def stage_runs(stage: Stage, answered: Mapping[str, str | None], skipped: AbstractSet[str]) -> bool:
    """Whether ``stage`` runs, once every stage in its ``after`` was answered (``answered``:
    each answered stage's label, ``None`` for a model without labels) or ``skipped``."""
    if stage.after and all(name in skipped for name in stage.after):
        return False
    when = stage.when
    return when is None or answered.get(when.stage) == when.label


def labels_problem(labels: Sequence[tuple[str, float]]) -> str | None:
    """What is wrong with a model's ``labels``, or ``None``: a repeated label, a share
    that is not a number > 0, or shares not summing to 1."""
    seen: set[str] = set()
    for label, share in labels:
        if label in seen:
            return f"label {label!r} is given twice"
        seen.add(label)
        if not (isinstance(share, int | float) and share > 0.0 and share <= 1.0):
            return f"label {label!r}: its share must be a number in (0, 1], got {share!r}"
    total = sum(share for _, share in labels)
    if labels and abs(total - 1.0) > 1e-6:
        return f"the labels' shares sum to {total:g}, not 1"
    return None


def condition_problem(stage: Stage, labels_of: Mapping[str, Sequence[str]]) -> str | None:
    """What is wrong with ``stage.when``, or ``None``: it names a stage the stage does not
    run after, or a label that stage's model never answers (``labels_of``: each of the
    pipeline's stages by name -> its model's labels)."""
    when = stage.when
    if when is None:
        return None
    if when.stage not in stage.after:
        return (
            f"when names stage {when.stage!r}, which stage {stage.name!r} does not run after "
            f"(after: {', '.join(stage.after) or 'none'})"
        )
    labels = labels_of.get(when.stage, ())
    if when.label not in labels:
        answers = ", ".join(labels) if labels else "none (its model has no labels)"
        return (
            f"when names label {when.label!r}, which stage {when.stage!r} never answers: {answers}"
        )
    return None
