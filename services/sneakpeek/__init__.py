"""The sneakpeek service: data-aware accuracy estimates for classification requests."""

from services.sneakpeek.service import SneakPeekService, create

__all__ = ["SneakPeekService", "create"]
