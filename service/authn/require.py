"""Stage 1 of the chain (AuthN): a protected action needs an authenticated principal."""

from __future__ import annotations

from .errors import Unauthenticated
from .principal import Principal

__all__ = ["require"]


def require(principal: Principal, token_error: str | None) -> Principal:
    """``principal`` when it is authenticated; else ``Unauthenticated`` (401), carrying the code
    of the presented token's failure when a token was presented and refused."""
    if not principal.is_authenticated:
        raise Unauthenticated(token_error)
    return principal
