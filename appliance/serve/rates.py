"""How many texts an API key may send: one bucket per key, drawn on by every API that serves inference (and one per
user, for the predictions the control API lets users try)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from appliance.access import auth, users
from appliance.core.errors import RateLimited


class KeyRates:
    """A token bucket of texts per API key: `burst` at once, refilled at `per_s` a second (0: no limit).

    A request is admitted while its key has a text left, before its body is read, and that takes one; once its
    texts are counted, the rest are charged, which may leave the key in debt that later requests wait out. So
    a key's texts over any span stay within burst + per_s x span + one request, and a malformed body costs a text.
    """

    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s, self.burst, self._clock = per_s, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (texts left, when)

    def admit(self, key: auth.ApiKey | users.User) -> None:
        """Take one text; RateLimited, with the whole seconds until one is back, when the key has none."""
        if not self.per_s:
            return
        now = self._clock()
        left, at = self._buckets.get(key.id, (float(self.burst), now))
        left = min(float(self.burst), left + (now - at) * self.per_s)
        if left < 1:
            wait = math.ceil((1 - left) / self.per_s)
            who = f"user {key.name}" if isinstance(key, users.User) else f"API key {key.id} ({key.name})"
            raise RateLimited(f"{who} sent more than its rate of {self.per_s:g} texts a second", retry_after_s=wait,
                              hint=f"retry after {wait} s; {self.burst} texts may be sent at once, then"
                                   f" {self.per_s:g} a second")
        self._buckets[key.id] = (left - 1, now)

    def charge(self, key: auth.ApiKey | users.User, texts: int) -> None:
        """The texts of an admitted request beyond the one admit() took."""
        if self.per_s and texts > 1:
            left, at = self._buckets[key.id]
            self._buckets[key.id] = (left - (texts - 1), at)
