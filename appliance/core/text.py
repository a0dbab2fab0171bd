"""Words for numbers, as people write them: "1 thread", "2 threads"."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """The number and the noun, singular for one; plural defaults to the noun with an s."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"
