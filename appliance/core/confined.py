"""Files the daemon reads on a client's word, only from a folder root chose, never by a client's path.

A client names a file inside a configured folder (`daemon.import_dir`, `train.base_models_dir`)
by a relative name. The name is walked one component at a time from the folder's descriptor
with O_NOFOLLOW, so no component may be a symbolic link, `..` or absolute, and a link swapped
in between a check and the open is refused by the kernel rather than followed; what is
opened must be a regular file (or a folder, where one is asked for). Messages name the
relative name the client gave, never where a link would have led.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from appliance.core.errors import ConfinementError

MAX_NAME_CHARS = 255
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang the open


@dataclass(frozen=True)
class Folder:
    """A folder root configured, and the setting that names it (for messages)."""

    root: Path | None
    setting: str

    def open_file(self, name: str) -> BinaryIO:
        """The regular file `name` inside the folder, open for reading."""
        fd = self._open(name, directory=False)
        return os.fdopen(fd, "rb")

    def files(self, name: str) -> Iterator[tuple[str, BinaryIO]]:
        """Every regular file under the folder `name`, as (path relative to it, open file), sorted; hidden
        entries are skipped, and any link or special file met on the way is refused."""
        fd = self._open(name, directory=True)
        try:
            yield from _walk(fd, PurePosixPath(), name)
        finally:
            os.close(fd)

    def is_folder(self, name: str) -> bool:
        """Whether `name` is a folder inside this one (links and special files are neither)."""
        try:
            os.close(self._open(name, directory=True))
        except ConfinementError:
            return False
        return True

    def _open(self, name: str, *, directory: bool) -> int:
        parts = self._parts(name)
        current = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # root's own choice may be a link
        try:
            for index, part in enumerate(parts):
                last = index == len(parts) - 1
                try:
                    opened = os.open(part, _FLAGS | (os.O_DIRECTORY if not last or directory else 0), dir_fd=current)
                except OSError as exc:
                    raise self._refusal(name, exc) from None
                os.close(current)
                current = opened
            kind = os.fstat(current).st_mode
            wanted = stat.S_ISDIR(kind) if directory else stat.S_ISREG(kind)
            if not wanted:
                raise ConfinementError(f"{name!r} in {self.setting} is not a {'folder' if directory else 'regular file'}",
                                       hint="name a plain file (or folder) that root put there; links are refused")
            if not directory:
                os.set_blocking(current, True)
        except BaseException:
            os.close(current)
            raise
        return current

    def _parts(self, name: str) -> tuple[str, ...]:
        if self.root is None:
            raise ConfinementError(f"no {self.setting} is configured, so the daemon reads no files by name",
                                   hint=f"send the file's content instead, or have root set {self.setting}")
        path = PurePosixPath(name)
        if (not name or len(name) > MAX_NAME_CHARS or "\x00" in name or path.is_absolute()
                or any(part in ("..", ".") for part in name.split("/"))):
            raise ConfinementError(f"{name[:80]!r} is not a name inside {self.setting}",
                                   hint="give the file's name relative to that folder, without '..' or a leading '/'")
        return path.parts

    def _refusal(self, name: str, exc: OSError) -> ConfinementError:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return ConfinementError(f"{name!r} in {self.setting} is or passes through a link, or is not a folder",
                                    hint="links are refused: put the file itself there")
        if exc.errno == errno.ENOENT:
            return ConfinementError(f"there is no {name!r} in {self.setting}", hint="check the name and the folder")
        return ConfinementError(f"{name!r} in {self.setting} cannot be read ({os.strerror(exc.errno)})",
                                hint="the daemon's user must be able to read it")


def _walk(fd: int, prefix: PurePosixPath, name: str) -> Iterator[tuple[str, BinaryIO]]:
    for entry in sorted(os.listdir(fd)):
        if entry.startswith("."):
            continue
        relative = prefix / entry
        try:
            child = os.open(entry, _FLAGS, dir_fd=fd)
        except OSError as exc:
            raise ConfinementError(f"{name}/{relative} cannot be read ({os.strerror(exc.errno)})",
                                   hint="links are refused: put the files themselves there") from None
        kind = os.fstat(child).st_mode
        if stat.S_ISDIR(kind):
            try:
                yield from _walk(child, relative, name)
            finally:
                os.close(child)
        elif stat.S_ISREG(kind):
            os.set_blocking(child, True)
            with os.fdopen(child, "rb") as file:
                yield relative.as_posix(), file
        else:
            os.close(child)
            raise ConfinementError(f"{name}/{relative} is not a regular file",
                                   hint="only plain files and folders are read")
