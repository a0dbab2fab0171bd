"""The time: now, and the one form every stored time takes.

Stored times are ISO 8601 in UTC to the millisecond (2026-11-20T13:14:08.078+00:00), so SQL can
compare and order them as strings, and records written within one second keep their order. Rows
written before this form hold seconds or microseconds in the same columns; they still compare
correctly: after the seconds, '+' (the offset) sorts before '.' and the digits, so a shorter form
sorts before any longer one that starts the same (only one instant written both ways reads as two). Audit records keep the time they were written with: it is part of their hash.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)


def stamp(moment: datetime | None = None) -> str:
    """A time (an aware one; now if none) as it is stored and compared."""
    return (moment or now()).astimezone(UTC).isoformat(timespec="milliseconds")


def age(stored: str) -> timedelta:
    """How long ago a stored time was (any precision it was written with)."""
    return now() - datetime.fromisoformat(stored)
