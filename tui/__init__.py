"""Terminal UI for the appliance."""

from appliance import launch


def main() -> None:
    """The `appliance-tui` command."""
    launch.run("tui.app")
