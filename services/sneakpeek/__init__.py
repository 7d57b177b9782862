"""The sneakpeek service: data-aware accuracy estimates for classification requests."""

from services.sneakpeek.service import SneakPeekService, create, estimate_key

__all__ = ["SneakPeekService", "create", "estimate_key"]
