"""Reading the predictor's published model (``predictor:model``) back, in every service
that predicts in-process (the scheduler, the rebalancer, an ingress dispatching
directly): the text is parsed only when it changed, and an unreadable one keeps the
last good model."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from switchyard.contracts.messages import PredictorModel
from switchyard.prediction.snapshot import FittedPredictor
from switchyard.state import keys
from switchyard.state.base import StateStore

log = logging.getLogger(__name__)


class PublishedModelReader:
    """The latest model the predictor published, re-read on :meth:`refresh`.

    Args:
        state: the store holding ``predictor:model``.
        interval_s: :meth:`refresh_due` reads at most this often.
    """

    def __init__(self, state: StateStore, *, interval_s: float = 0.0) -> None:
        self._state = state
        self._interval_s = interval_s
        self._text: str | None = None
        self._read_s = float("-inf")
        self.current: FittedPredictor | None = None
        """The latest readable model; None until one was published."""

    async def refresh(self) -> FittedPredictor | None:
        """Read ``predictor:model``; the current model (a new one when it changed)."""
        text = await self._state.get(keys.PREDICTOR_MODEL)
        if text is None or text == self._text:
            return self.current
        self._text = text
        try:
            self.current = FittedPredictor.from_model(PredictorModel.model_validate_json(text))
        except (ValidationError, ValueError) as exc:
            log.warning("the predictor's published model is unreadable, keeping the last: %s", exc)
        return self.current

    async def refresh_due(self, now_s: float) -> FittedPredictor | None:
        """:meth:`refresh` when ``interval_s`` passed since the last read, else the
        current model without a read."""
        if now_s - self._read_s < self._interval_s:
            return self.current
        self._read_s = now_s
        return await self.refresh()


__all__ = ["PublishedModelReader"]
