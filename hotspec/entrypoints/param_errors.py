"""A request refused because of one of its fields: the error names the field (`param`), which the
API's 400 body reports."""

from __future__ import annotations

from hotspec.errors import InvalidRequestError


class InvalidParameterError(InvalidRequestError):
    """A request refused because of one field: `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class UnsupportedParameterError(InvalidParameterError):
    """A field (or value) this server does not implement."""
