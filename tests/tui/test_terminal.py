"""The real `appliance-tui` in a real terminal against the real daemon, end to end, as an operator drives it.

The TUI runs on a pseudo-terminal of 80x24; what it draws is read back through pyte, a VT100 emulator, so the
test sees the screen a person would (not Textual's widgets), and types as a person would.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pyte
import pytest

from tests.daemon import Daemon

pytestmark = pytest.mark.slow

ENTER, TAB = "\r", "\t"


class Terminal:
    """A pty of a given size with a program on it, and the screen it has drawn so far."""

    def __init__(self, command: list[str], env: dict[str, str], size: tuple[int, int] = (80, 24)) -> None:
        columns, lines = size
        self.screen = pyte.Screen(columns, lines)
        self._stream = pyte.ByteStream(self.screen)
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.process = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=env,
                                        start_new_session=True)
        os.close(follower)
        self._fd = leader

    def text(self) -> str:
        self._read(0.05)
        return "\n".join(self.screen.display)

    def wait_for(self, *needles: str, seconds: float = 60) -> str:
        """The screen once it shows every needle; AssertionError with the screen after `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            shown = self.text()
            if all(needle in shown for needle in needles):
                return shown
            self._read(0.2)
        raise AssertionError(f"never showed {needles}:\n{self.text()}")

    def type(self, *keys: str) -> None:
        for key in keys:
            os.write(self._fd, key.encode())
            self._read(0.1)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        os.close(self._fd)

    def _read(self, seconds: float) -> None:
        while select.select([self._fd], [], [], seconds)[0]:
            try:
                self._stream.feed(os.read(self._fd, 1 << 16))
            except OSError:  # the program has gone: the screen stays as it was
                return
            seconds = 0.02


@pytest.fixture
def terminal(daemon: Daemon, tmp_path: Path) -> Iterator[Terminal]:
    env = {**daemon.env, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24", "HOME": str(tmp_path)}
    env.pop("NO_COLOR", None)
    shown = Terminal([str(Path(sys.executable).with_name("appliance-tui"))], env)  # the installed command
    yield shown
    shown.close()


def test_an_operator_imports_fine_tunes_watches_loses_and_regains_the_daemon(daemon: Daemon, terminal: Terminal,
                                                                          tmp_path: Path) -> None:
    terminal.wait_for("1 Overview", "connected")

    terminal.type("2", "i")  # import: the file browser first, then the file's path and a name
    terminal.wait_for("Import a dataset")
    terminal.type(TAB, str(tmp_path / "tickets.csv"))
    terminal.wait_for("tickets.csv")  # as an operator would see the path typed before Tab to the next field
    terminal.type(TAB, "tickets")
    terminal.wait_for("▊  tickets ")
    terminal.type(ENTER)
    terminal.wait_for("imported as tickets:1")

    terminal.type("3", "n")  # the wizard: its defaults deploy safely (production, as nothing serves yet)
    terminal.wait_for("New fine-tune", "tickets:1 (120 examples)", "optimise, deploy safely")
    terminal.type(TAB, ENTER)  # from the base model's field, Enter starts it
    terminal.wait_for("queued (pipeline)")
    shown = terminal.wait_for("tickets:2: production (nothing served tickets yet)", "finished", seconds=240)
    assert "NOT REACHABLE" not in shown

    daemon.stop()
    shown = terminal.wait_for("DAEMON NOT REACHABLE", "showing data as of", "nothing listens on", seconds=30)
    assert "finished" in shown  # the last data stays on screen, greyed, and says how old it is

    daemon.start()
    terminal.wait_for("connected", seconds=30)
    terminal.type("q")
    assert terminal.process.wait(timeout=10) == 0
