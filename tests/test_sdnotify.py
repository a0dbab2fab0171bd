"""sd_notify over a real datagram socket, as systemd listens for it, and the watchdog interval."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.core import sdnotify


@pytest.fixture(autouse=True)
def no_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts outside systemd, with the once-only send warning not yet given."""
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sdnotify, "_warned", False)


def receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory: a socket path must fit in 108 bytes, which pytest's tmp_path may not."""
    with tempfile.TemporaryDirectory(prefix="sdn") as name:
        yield Path(name)


def test_fields_arrive_as_one_datagram_on_a_path_socket(socket_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = socket_dir / "notify"
    with receiver(str(path)) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sdnotify.notify(READY=1, STATUS="serving 2 models") is True
        assert sdnotify.notify(WATCHDOG=1) is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving 2 models"
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_an_at_sign_names_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"appliance-test-{uuid.uuid4().hex}"
    with receiver(b"\0" + name.encode()) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify(STOPPING=1, MAINPID=os.getpid()) is True
        assert sock.recv(4096) == f"STOPPING=1\nMAINPID={os.getpid()}".encode()


def test_outside_systemd_nothing_is_sent() -> None:
    assert sdnotify.notify(READY=1) is False


def test_an_unreachable_socket_returns_false_and_warns_once(
    socket_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(socket_dir / "gone"))
    with caplog.at_level(logging.WARNING, logger="appliance.core.sdnotify"):
        assert sdnotify.notify(WATCHDOG=1) is False
        assert sdnotify.notify(WATCHDOG=1) is False
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert str(socket_dir / "gone") in caplog.records[0].getMessage()


def test_a_newline_in_a_value_is_refused_even_outside_systemd() -> None:
    with pytest.raises(ValueError, match="STATUS"):
        sdnotify.notify(STATUS="two\nlines")


def test_watchdog_pings_at_half_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 15.0


def test_the_watchdog_of_another_process_is_not_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval() is None


@pytest.mark.parametrize("usec", [None, "0", "soon"])
def test_no_watchdog_without_a_positive_timeout(usec: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if usec is not None:
        monkeypatch.setenv("WATCHDOG_USEC", usec)
    assert sdnotify.watchdog_interval() is None
