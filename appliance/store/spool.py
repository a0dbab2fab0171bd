"""An upload on its way in, kept on the disk sealed rather than in memory.

A body of up to daemon.max_upload_mb held in memory while it arrives and is imported would take the memory the
daemon serves in; on the disk in the clear it would break the promise that no customer data is stored in plaintext.
So a Spool is an unnamed file (O_TMPFILE: it has no name, and is gone when closed or when the process dies, however
it dies) in the folder given (the state directory: /tmp may be a tmpfs, which is memory again), sealed in pieces of
PIECE bytes with AES-256-GCM under a key that lives only in the Spool's memory, each piece bound to its place
(`seal`'s counted framing). What is read back is opened a piece at a time, at any offset: a tar is read out of order.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Self

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.store import seal

PIECE = 1 << 20
_SEALED_PIECE = PIECE + 16  # and GCM's tag


class Spool:
    """Bytes written in order, then `finish()`ed, then read as often as needed (`open()`); `close()` drops them."""

    def __init__(self, folder: Path) -> None:
        self._file = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115 (closed by close())
        self._aead = AESGCM(AESGCM.generate_key(bit_length=256))
        self._pending = bytearray()  # written, not yet sealed: under two pieces
        self._pieces = 0  # sealed and written to the file
        self.size = 0
        self.finished = False

    def write(self, data: bytes) -> None:
        """Append data; whole pieces are sealed and written once more follows them (the last is sealed apart)."""
        if self.finished:
            raise ValueError("the spool is finished")
        self._pending += data
        self.size += len(data)
        while len(self._pending) > PIECE:
            self._seal(bytes(self._pending[:PIECE]), last=False)
            del self._pending[:PIECE]

    def finish(self) -> None:
        """Seal what is pending as the last piece; nothing more may be written."""
        if not self.finished:
            self._seal(bytes(self._pending), last=True)
            self._pending.clear()
            self.finished = True

    def open(self) -> BinaryIO:
        """The bytes written, readable and seekable; several may be open at once."""
        if not self.finished:
            raise ValueError("finish the spool before reading it")
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _seal(self, plain: bytes, last: bool) -> None:
        sealed = seal.seal_counted(self._aead, self._pieces, plain, last, _aad)
        os.pwrite(self._file.fileno(), sealed, self._pieces * _SEALED_PIECE)
        self._pieces += 1

    def piece(self, index: int) -> bytes:
        """Piece index, opened (TamperDetected if it was changed)."""
        sealed = os.pread(self._file.fileno(), _SEALED_PIECE, index * _SEALED_PIECE)
        return seal.open_counted(self._aead, index, self._pieces, sealed or None, _aad, "an upload being imported")


def _aad(index: int, last: bool) -> bytes:
    return b"upload:%d:%d" % (index, last)


class _Reader(io.RawIOBase):
    """A Spool's bytes from a position, the piece under it opened and kept until the position leaves it."""

    def __init__(self, spool: Spool) -> None:
        self._spool, self._position = spool, 0
        self._held: tuple[int, bytes] | None = None  # (index, opened piece)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._spool.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._position >= self._spool.size:
            return 0
        index, start = divmod(self._position, PIECE)
        if self._held is None or self._held[0] != index:
            self._held = (index, self._spool.piece(index))
        chunk = self._held[1][start:start + len(buffer)]
        buffer[:len(chunk)] = chunk
        self._position += len(chunk)
        return len(chunk)
