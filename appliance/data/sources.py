"""Where an import (a dataset's, a model's) reads its bytes: never from a path an API client chose.

    LocalPath(path)              a file or folder the calling user named (the CLI without a daemon)
    ImportDir(settings, name)    a name inside daemon.import_dir, the one folder root lets the daemon read
    Upload(filename, body, ...)  bytes a client sent through the control API, spooled sealed (a folder comes as a tar)

A text dataset is one CSV or JSONL file; an image dataset is a folder with a subfolder per
class; a model is a folder or one archive. Uploaded, a folder is an uncompressed tar, which
tar_stream() makes on the fly on the client's side. A tar is only read, never unpacked onto
the disk: its regular files are read into memory, and every other kind of member (links,
devices) is refused. Constructing a source touches nothing; the first look (is_folder) may
fail, inside the import, so a refusal is audited like any failed import.
"""

from __future__ import annotations

import io
import os
import string
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from appliance.core import archive
from appliance.core.config import Settings
from appliance.core.confined import Folder
from appliance.core.errors import DatasetError
from appliance.core.files import regular_file
from appliance.store import spool

TAR_SUFFIX = ".tar"
TAR_CHUNK = 1 << 20
_PLAIN = set(string.ascii_letters + string.digits + "._- ()+,@")


@dataclass(frozen=True)
class FolderFile:
    """One file of a folder (an image dataset's, a model's): its place under the folder (label/.../file), its size
    and its bytes, read only when asked."""

    entry: str
    size: int
    read: Callable[[], bytes]  # call while the iteration that gave it is at it


class Source(Protocol):
    """What an import reads, with a name for messages and an origin for the record."""

    name: str  # the file's or folder's own name, as messages show it
    origin: str  # what the version and its audit record keep as its source

    def is_folder(self) -> bool: ...

    def size(self) -> int:
        """Bytes in all, for progress; 0 when not known before reading."""

    def open(self) -> BinaryIO:
        """A text dataset's file."""

    def files(self) -> Iterator[FolderFile]:
        """A folder's files, sorted by entry."""


class LocalPath:
    """A file or folder named by the user who runs the command, read with that user's own rights. A file is checked
    to be a regular one before anything opens it: by is_folder (an import here) or size (the CLI's upload)."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()
        self.name, self.origin = self.path.name, str(self.path)

    def is_folder(self) -> bool:
        if not self.path.exists():
            raise DatasetError(f"{self.path}: no such file or folder")
        if self.path.is_dir():
            return True
        regular_file(self.path, "the file", error=DatasetError)
        return False

    def size(self) -> int:
        if self.path.is_dir():
            return sum(file.stat().st_size for file in self._files())
        return regular_file(self.path, "the file", error=DatasetError)

    def open(self) -> BinaryIO:
        return self.path.open("rb")

    def files(self) -> Iterator[FolderFile]:
        for file in self._files():
            yield FolderFile(file.relative_to(self.path).as_posix(), file.stat().st_size, file.read_bytes)

    def _files(self) -> list[Path]:
        return [file for file in sorted(self.path.rglob("*"))
                if file.is_file() and not any(part.startswith(".") for part in file.relative_to(self.path).parts)]


class ImportDir:
    """A file or folder inside daemon.import_dir, opened without following a link (confined.Folder)."""

    def __init__(self, settings: Settings, name: str) -> None:
        self._folder = Folder(settings.daemon.import_dir, "daemon.import_dir")
        self._name = name
        self.name = PurePosixPath(name).name or "import"
        self.origin = f"daemon.import_dir/{name[:255]}"

    def is_folder(self) -> bool:
        if self._folder.is_folder(self._name):
            return True
        self.open().close()  # refuses a link, a special file or a name outside the folder now, not later
        return False

    def size(self) -> int:
        if self._folder.is_folder(self._name):
            return 0
        with self.open() as file:
            return os.fstat(file.fileno()).st_size

    def open(self) -> BinaryIO:
        return self._folder.open_file(self._name)

    def files(self) -> Iterator[FolderFile]:
        for entry, file in self._folder.files(self._name):
            yield FolderFile(entry, os.fstat(file.fileno()).st_size, file.read)


class Upload:
    """Bytes a client sent: a text file, or (folder=True) an uncompressed tar of a folder (images, a model). They
    come spooled (sealed on the disk, the control API's way), or in memory (an archive already read)."""

    def __init__(self, filename: str, body: spool.Spool | bytes, *, folder: bool) -> None:
        shown = safe_filename(filename)
        self._body, self._folder = body, folder
        self.name = (shown.removesuffix(TAR_SUFFIX) or "upload") if folder else shown
        self.origin = f"upload of {shown}"

    def is_folder(self) -> bool:
        return self._folder

    def size(self) -> int:
        return len(self._body) if isinstance(self._body, bytes) else self._body.size

    def open(self) -> BinaryIO:
        return io.BytesIO(self._body) if isinstance(self._body, bytes) else self._body.open()

    def files(self) -> Iterator[FolderFile]:
        try:
            with self.open() as body, tarfile.open(fileobj=body, mode="r:") as tar:
                for member in sorted(tar.getmembers(), key=lambda found: found.name):
                    file = _member(tar, member, self.name)
                    if file is not None:
                        yield file
        except tarfile.TarError as exc:
            raise DatasetError(f"{self.name}: the upload is not an uncompressed tar of a folder"
                               f" ({type(exc).__name__})",
                               hint="the CLI packs and uploads a folder ('appliance data import FOLDER', 'appliance models import FOLDER')") from None


def safe_filename(filename: str) -> str:
    """A client's file name as messages and records may show it: its last part, plain characters, bounded."""
    name = PurePosixPath(filename.replace("\\", "/")).name
    cleaned = "".join(char if char in _PLAIN else "_" for char in name)[:128].strip()
    return cleaned if cleaned.strip("._") else "upload"


def tar_stream(folder: Path, sent: Callable[[int], None] = lambda size: None) -> Iterator[bytes]:
    """A folder as an uncompressed tar, made a member at a time (for an upload); hidden entries and
    anything but plain files and folders are left out. `sent` hears each file's size as it goes."""
    buffer = archive.Spool()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for file in sorted(folder.rglob("*")):
            relative = file.relative_to(folder)
            if any(part.startswith(".") for part in relative.parts) or file.is_symlink() or not file.is_file():
                continue
            info = tarfile.TarInfo(relative.as_posix())
            info.size, info.mode = file.stat().st_size, 0o600
            with file.open("rb") as content:
                tar.addfile(info, content)
            sent(info.size)
            yield from buffer.drain(TAR_CHUNK)
    yield from buffer.drain(TAR_CHUNK)


def _member(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> FolderFile | None:
    """A regular file of the tar as a folder's file; folders and hidden entries are skipped, anything else refused."""
    if member.isdir():
        return None
    entry = PurePosixPath(member.name)
    if not member.isreg() or entry.is_absolute() or ".." in entry.parts:
        raise DatasetError(f"{name}: the upload holds an entry that is not a plain file inside the folder",
                           hint="upload a folder of plain files only; links and devices are refused")
    parts = [part for part in entry.parts if part not in ("", ".")]
    if any(part.startswith(".") for part in parts):
        return None
    shown = "/".join(parts)

    def read() -> bytes:
        try:
            return tar.extractfile(member).read()  # type: ignore[union-attr]  # a regular file has content
        except tarfile.TarError as exc:
            raise DatasetError(f"{name}/{shown}: the upload is cut short ({exc})",
                               hint="send it again; a copy may have been cut off on the way") from None

    return FolderFile(shown, member.size, read)
