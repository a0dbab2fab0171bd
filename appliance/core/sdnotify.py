"""systemd's notify protocol (sd_notify(3)) in plain socket code, so the daemon needs no libsystemd.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, a datagram socket to which the service
reports READY=1, STATUS=..., WATCHDOG=1 and so on, one ``KEY=value`` per line in one datagram.
Outside systemd the variable is unset and every call is a harmless no-op.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

_warned = False  # whether a failed send has been logged yet


def notify(**fields: str | int) -> bool:
    """Send ``KEY=value`` fields, e.g. ``notify(READY=1, STATUS="serving 2 models")``, to systemd.

    Returns whether the datagram was sent: False outside systemd or when sending fails. A send
    error is logged once per process and never raised, because a lost notification must not stop
    the service, and watchdog pings every few seconds would otherwise flood the journal.
    Raises ValueError for a value holding a newline, which would be read as a second field;
    that check runs before the environment is read, so the bug shows outside systemd too.
    """
    global _warned
    message = _encode(fields)
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, _socket_address(address))
    except OSError as exc:
        if not _warned:
            log.warning("cannot notify systemd at %s: %s", address, exc)
            _warned = True
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings: half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises.

    None when the watchdog is off, the value is not a positive integer, or ``$WATCHDOG_PID`` names
    another process (a child that inherited the environment must not ping for its parent).
    """
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2_000_000 if usec > 0 else None


def _encode(fields: dict[str, str | int]) -> bytes:
    lines = []
    for key, value in fields.items():
        text = str(value)
        if "\n" in text:
            raise ValueError(f"sd_notify field {key} must be one line, got {text!r}")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def _socket_address(address: str) -> str | bytes:
    """A leading '@' names a socket in Linux's abstract namespace, whose real name starts with NUL."""
    return b"\0" + address[1:].encode() if address.startswith("@") else address
