"""The commands' entry points, light on purpose: loading the CLI (torch, OpenVINO, FastAPI) takes a second or more,
and Ctrl-C in that second would otherwise print a traceback where it later prints "aborted" and exits 130."""

import importlib
import sys


def run(module: str) -> None:
    """Import module, then run its main()."""
    try:
        command = importlib.import_module(module).main
    except KeyboardInterrupt:
        sys.stderr.write("aborted\n")
        raise SystemExit(130) from None
    command()


def main() -> None:
    """The `appliance` command."""
    run("appliance.cli")
