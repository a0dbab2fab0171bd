"""Deterministic tar archives built and read in memory: how model files travel between steps.

A model bundle or an optimised artifact is several files (weights, graph, tokenizer,
manifest) stored as one encrypted blob. They are packed and unpacked from bytes only,
so no plaintext weight ever reaches a disk; fixed metadata makes the same files give
the same bytes, and so the same content hash.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from appliance.core import scratch
from appliance.core.errors import ArtifactError


def pack(files: Iterable[tuple[str, bytes]], *, mode: int = 0o600) -> bytes:
    """An uncompressed tar of (name, content) pairs, in the order given, with mtime 0."""
    return b"".join(stream(files, mode=mode))


def stream(files: Iterable[tuple[str, bytes]], *, mode: int = 0o600) -> Iterator[bytes]:
    """pack()'s bytes, given out a file at a time: files may be read one by one as they are packed, so a set larger
    than memory can be packed into a blob."""
    spool = Spool()
    with tarfile.open(fileobj=spool, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, content in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
            yield from spool.drain()
    yield from spool.drain()


class Spool(io.RawIOBase):
    """A write-only file that keeps what is written until drained: tarfile writes, a stream reads."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._parts.append(bytes(data))
        return len(data)

    def drain(self, size: int = 1 << 20) -> Iterator[bytes]:
        """What was written since the last drain, in pieces of at most size bytes."""
        parts, self._parts = self._parts, []
        joined = b"".join(parts)
        for start in range(0, len(joined), size):
            yield joined[start:start + size]


def unpack(data: bytes) -> dict[str, bytes]:
    """The regular files of a tar, by name, read from bytes."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    except tarfile.TarError as exc:
        raise ArtifactError(f"a stored model artifact is not a readable tar: {exc}") from exc


@contextmanager
def memory_folder(files: dict[str, bytes]) -> Iterator[Path]:
    """A folder whose files live in RAM (memfds), for libraries that only load from a path.

    The folder holds symlinks to /proc/self/fd/N and nothing else, so no content reaches a disk;
    the paths work in this process only.
    """
    descriptors = []
    try:
        with scratch.folder("appliance-mem-") as folder:
            for name, content in files.items():
                descriptor = os.memfd_create(name, os.MFD_CLOEXEC)
                descriptors.append(descriptor)
                _write_all(descriptor, content)
                (folder / name).symlink_to(f"/proc/self/fd/{descriptor}")
            yield folder
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def _write_all(descriptor: int, content: bytes) -> None:
    """os.write may take less than it is given (large writes); loop until all of it is written."""
    view = memoryview(content)
    while view:
        view = view[os.write(descriptor, view):]
