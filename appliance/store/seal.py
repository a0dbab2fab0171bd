"""Chunked AES-256-GCM: a stream sealed piece by piece, each piece bound to its place (STREAM).

A piece's AAD names its stream (the caller's context), its index and whether it is the last
piece, so a piece that is changed, reordered, moved to another stream, dropped or cut off the
tail fails to open. Two framings:

- counted (blobs): the nonce is the index, so the key must seal this one stream only; a sealed
  piece is the bare ciphertext, and the reader knows the count from elsewhere (authenticated there).
- framed (burst payloads): one key seals several streams, so each piece carries a random nonce
  and its last flag: the flag byte, the nonce, the ciphertext; the reader learns the end from them.

Kept to the standard library and cryptography: a burst job imports it on a Ray cluster.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.core.errors import TamperDetected

NONCE_BYTES = 12

Source = bytes | BinaryIO | Iterable[bytes]
Aad = Callable[[int, bool], bytes]  # (index, is last) -> the piece's associated data, naming its stream
LAST, NOT_LAST = b"\x01", b"\x00"  # a framed piece's first byte


def pieces(source: Source, size: int) -> Iterator[tuple[bytes, bool]]:
    """size-byte pieces of source (the last shorter; empty content is one empty piece), each with is-last."""
    read = reader(source)
    current = _read_exact(read, size)
    while True:
        following = _read_exact(read, size) if len(current) == size else b""
        yield current, not following
        if not following:
            return
        current = following


def seal_counted(aead: AESGCM, index: int, plain: bytes, last: bool, aad: Aad) -> bytes:
    """One piece with its index as the nonce: only for a key that seals this one stream."""
    return aead.encrypt(_counter(index), plain, aad(index, last))


def open_counted(aead: AESGCM, index: int, count: int, sealed: bytes | None, aad: Aad, name: str) -> bytes:
    """Piece index of count, opened; TamperDetected naming the stream if it is missing, changed or misplaced."""
    if sealed is None:
        raise TamperDetected(f"{name}: chunk {index} of {count} is missing")
    try:
        return aead.decrypt(_counter(index), sealed, aad(index, index == count - 1))
    except InvalidTag as exc:
        raise TamperDetected(f"{name}: chunk {index} of {count} was changed, moved or reordered") from exc


def seal_framed(aead: AESGCM, source: Iterable[tuple[bytes, bool]], aad: Aad) -> Iterator[bytes]:
    """Each piece framed as its last flag, a random nonce and the ciphertext: for a key that seals several streams."""
    for index, (plain, last) in enumerate(source):
        nonce = os.urandom(NONCE_BYTES)
        yield (LAST if last else NOT_LAST) + nonce + aead.encrypt(nonce, plain, aad(index, last))


def open_framed(aead: AESGCM, frames: Iterable[bytes], aad: Aad, name: str) -> bytes:
    """The whole stream from its frames in order; TamperDetected if one was changed, moved or added, or it is cut short."""
    parts, ended = [], False
    for index, frame in enumerate(frames):
        if ended:
            raise TamperDetected(f"{name} has data after its last chunk")
        flag, nonce, sealed = frame[:1], frame[1:1 + NONCE_BYTES], frame[1 + NONCE_BYTES:]
        try:
            if flag not in (LAST, NOT_LAST):
                raise InvalidTag  # no sealer writes another flag
            parts.append(aead.decrypt(nonce, sealed, aad(index, flag == LAST)))
        except (InvalidTag, ValueError) as exc:  # ValueError: a frame too short to hold a nonce
            raise TamperDetected(f"chunk {index} of {name} does not authenticate: it was changed or damaged") from exc
        ended = flag == LAST
    if not ended:
        raise TamperDetected(f"{name} is cut short: its last chunk is missing")
    return b"".join(parts)


def _counter(index: int) -> bytes:
    return index.to_bytes(NONCE_BYTES, "big")


def reader(source: Source) -> Callable[[int], bytes]:
    """A file's read() over source: bytes, a file, or an iterable of byte chunks (such as blobs.get)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source).read
    if hasattr(source, "read"):
        return source.read
    chunks = iter(source)
    rest = bytearray()

    def read(size: int) -> bytes:
        if not rest:
            chunk = next(chunks, b"")
            if len(chunk) == size:
                return bytes(chunk)  # a chunk that is already a whole piece: no copy if it is bytes
            rest.extend(chunk)
        while len(rest) < size and (chunk := next(chunks, None)) is not None:
            rest.extend(chunk)
        taken = bytes(rest[:size])
        del rest[:size]
        return taken

    return read


def _read_exact(read: Callable[[int], bytes], size: int) -> bytes:
    """Up to size bytes, fewer only at the end of the stream (file reads may come short)."""
    parts = []
    wanted = size
    while wanted and (piece := read(wanted)):
        parts.append(piece)
        wanted -= len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)
