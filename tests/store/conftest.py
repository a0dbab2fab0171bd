"""What the store's tests share: a store with a few audit records, closed for tampering."""

from __future__ import annotations

import pytest

from appliance.core.config import Settings
from appliance.store import Store, audit


@pytest.fixture
def logged(opened: Store, settings: Settings) -> Settings:
    """A store with ten records (keys.init + nine), closed so tests can tamper with the file."""
    for n in range(9):
        audit.record(opened, "test.step", f"object-{n}", n=n)
    opened.close()
    return settings
