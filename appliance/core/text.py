"""Text as people write and read it: words for numbers ("1 thread", "4m 05s") and back, what a terminal may show of
what a caller sent, and whether a text can be encoded at all."""

from __future__ import annotations

import re

_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """The number and the noun, singular for one; plural defaults to the noun with an s."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def duration(seconds: float | None) -> str:
    """A span of time at the precision people read it: seconds, then minutes, then hours; "-" when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def whole_number(text: str) -> int | None:
    """text as the whole number it writes in ASCII digits (at most 18), else None. Not str.isdigit(): that takes
    "²" and other digits int() refuses, which a caller would meet as a crash rather than as bad input."""
    return int(text) if _WHOLE_NUMBER.fullmatch(text) else None


def printable(text: str) -> str:
    """text with each character a terminal would act on (escape sequences, line breaks) shown as '?': for what a
    caller sent, such as a request's path, before a log line, an audit record or a terminal shows it."""
    return text if text.isprintable() else "".join(char if char.isprintable() else "?" for char in text)


def surrogate_at(text: str) -> int | None:
    """Where text holds a lone surrogate (what an unpaired "\\ud800" in JSON decodes to), else None: such a text can
    be neither tokenised, nor stored, nor sent back."""
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return exc.start
    return None
