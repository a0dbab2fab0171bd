"""An upload spooled on its way in: read back whole and from any offset, never on the disk in the clear or by a name,
and a changed byte is caught."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest

from appliance.core.errors import TamperDetected
from appliance.data import sources
from appliance.store import spool

MARKER = b"customer 4711 wrote: my card number is"


def _spooled(folder: Path, data: bytes, chunk: int = 70_001) -> spool.Spool:
    body = spool.Spool(folder)
    for start in range(0, len(data), chunk):
        body.write(data[start:start + chunk])
    body.finish()
    return body


def _content(size: int) -> bytes:
    noise = random.Random(7).randbytes(size)
    return noise[:size // 2] + MARKER + noise[size // 2 + len(MARKER):]


def test_what_is_written_reads_back_whole_and_from_any_offset(tmp_path: Path) -> None:
    data = _content(2 * spool.PIECE + 12_345)
    with _spooled(tmp_path, data) as body:
        assert body.size == len(data)
        with body.open() as whole:
            assert whole.read() == data
        with body.open() as file:
            for offset in (0, spool.PIECE - 3, spool.PIECE, 2 * spool.PIECE + 12_000, len(data) - 1, len(data) + 5):
                file.seek(offset)
                assert file.read(10) == data[offset:offset + 10]
            file.seek(-4, io.SEEK_END)
            assert file.read() == data[-4:]


def test_an_empty_upload_reads_as_empty(tmp_path: Path) -> None:
    with _spooled(tmp_path, b"") as body, body.open() as file:
        assert body.size == 0 and file.read() == b""


def test_the_disk_holds_it_sealed_and_under_no_name(tmp_path: Path) -> None:
    data = _content(spool.PIECE + 100)
    with _spooled(tmp_path, data) as body:
        assert list(tmp_path.iterdir()) == []  # nothing anyone could open by a name, nothing left if killed
        with open(f"/proc/self/fd/{body._file.fileno()}", "rb") as raw:  # what the disk holds
            stored = raw.read()
        assert len(stored) >= len(data) and MARKER not in stored
        assert MARKER[:16] not in stored and data[:64] not in stored
    assert list(tmp_path.iterdir()) == []


def test_a_changed_byte_on_the_disk_is_caught(tmp_path: Path) -> None:
    data = _content(spool.PIECE + 100)
    with _spooled(tmp_path, data) as body:
        os.pwrite(body._file.fileno(), b"\x00", spool.PIECE + 40)  # in the second piece
        with body.open() as file:
            assert file.read(spool.PIECE) == data[:spool.PIECE]
            with pytest.raises(TamperDetected, match="chunk 1 of 2"):
                file.read()


def test_a_folder_uploaded_as_a_tar_is_read_from_the_spool(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    for label, count in (("cat", 3), ("dog", 2)):
        (folder / label).mkdir(parents=True)
        for index in range(count):
            (folder / label / f"{index}.png").write_bytes(_content(400_000 + index))
    sent = tmp_path / "sent"
    sent.mkdir()
    with _spooled(sent, b"".join(sources.tar_stream(folder))) as body:
        files = {file.entry: file.read() for file in sources.Upload("photos.tar", body, folder=True).files()}
    assert files == {f"{label}/{index}.png": _content(400_000 + index)
                     for label, count in (("cat", 3), ("dog", 2)) for index in range(count)}
