"""Kafka's error codes by their own names, and which of them a client may retry.

The table is kio's (generated from Apache Kafka's Errors.java), so the names and the retriable
flags are Kafka's, not ours. Nothing here does I/O.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "error_name", "is_retriable"]


def error_name(code: int) -> str:
    """Kafka's name for an error code, e.g. 6 -> 'NOT_LEADER_OR_FOLLOWER'."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_CODE_{code}"


def is_retriable(code: int) -> bool:
    """Whether Kafka marks the error retriable (a client should refresh metadata and retry)."""
    try:
        return bool(ErrorCode(code).retriable)
    except ValueError:
        return False
