"""Errors the engine raises at its boundary (stdlib only); the server maps each to a status."""

from __future__ import annotations


class ContextLengthError(ValueError):
    """The prompt plus the requested output does not fit the context (HTTP 400)."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


class QueueFullError(RuntimeError):
    """Too many requests are waiting (HTTP 429 with Retry-After)."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped after a fault it could not contain (HTTP 503)."""
