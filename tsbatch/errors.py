"""Errors raised at the input boundary.

Every user-facing problem (missing or mistyped column, non-positive size,
unknown GPU or dtype, unreadable file) is an :class:`InputError` whose
message names the column, file or value. The command line prints it on one
line and exits with status 2, writing nothing.
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """Bad user input; the message names what is wrong."""
