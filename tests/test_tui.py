"""The TUI, driven with Textual's Pilot against a real store."""

from __future__ import annotations

from appliance.store import Store
from tui.app import ApplianceApp


async def _rendered(app: ApplianceApp, pilot) -> tuple[str, str]:
    await app.workers.wait_for_complete()
    await pilot.pause()
    return str(app.query_one("#store").render()), str(app.query_one("#audit").render())


async def test_overview_shows_the_store_and_a_verified_audit_log(opened: Store) -> None:
    opened.close()
    app = ApplianceApp()
    async with app.run_test(size=(80, 24)) as pilot:
        store_text, audit_text = await _rendered(app, pilot)
    assert "integrity_check  ok" in store_text
    assert "Audit log OK: 1 records" in audit_text


async def test_a_missing_key_is_a_message_not_a_traceback() -> None:
    app = ApplianceApp()
    async with app.run_test(size=(80, 24)) as pilot:
        store_text, _ = await _rendered(app, pilot)
    assert "error: no master key" in store_text
    assert "appliance keys init" in store_text
