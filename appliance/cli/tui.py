"""`appliance tui`: the operator's terminal UI (the same as `appliance-tui`)."""

from __future__ import annotations

from appliance.cli.base import cli, load_settings


@cli.command("tui")
def tui() -> None:
    """Open the terminal UI on the running daemon: overview, datasets, jobs, models, serving, audit."""
    from tui.app import ApplianceApp  # Textual loads only for this command

    ApplianceApp(settings=load_settings()).run()
