"""Exceptions hotspec raises on purpose; every message names the problem and the fix."""

from __future__ import annotations


class HotspecError(Exception):
    """Base class for errors raised deliberately by hotspec."""


class ModelLoadError(HotspecError, ValueError):
    """A checkpoint, config or tokenizer could not be loaded as given.

    Subclasses `ValueError` too, so callers that only know "bad input" still catch it.
    """


class InvalidRequestError(HotspecError, ValueError):
    """A request's parameters are invalid; the request fails, the engine goes on.

    Subclasses `ValueError` too, so callers that only know "bad input" still catch it.
    """
