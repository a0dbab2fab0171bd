"""Files a person names on the command line (a dataset, a checkpoint, an archive, a feedback file): checked to be
a regular file, within its bound where it has one, before anything opens it. A named pipe hangs its reader, and a
device (/dev/zero) or an outsized file never ends or fills the memory."""

from __future__ import annotations

import stat
from pathlib import Path

from appliance.core.errors import ApplianceError

MAX_SMALL_FILE = 64 * 2**10  # a checkpoint or an age identity is a few hundred bytes: a larger file is none of them
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def regular_file(path: Path, what: str, limit: int | None = None, *, over: str = "",
                 error: type[ApplianceError] = ApplianceError) -> int:
    """The size of path, a regular file a user named (of at most limit bytes), checked before anything opens it: a
    pipe hangs its reader, and a device (/dev/zero) or an outsized file never ends or fills the memory. `error` says
    what is wrong and which file; `over` is its hint for a file past the limit."""
    found = path.stat()
    if not stat.S_ISREG(found.st_mode):
        raise error(f"{what} {path} is {_KINDS.get(stat.S_IFMT(found.st_mode), 'something else')}, not a regular"
                    " file", hint="a pipe or a device is never read: save what it gives to a file and give that")
    if limit is not None and found.st_size > limit:
        raise error(f"{what} {path} holds {found.st_size:,} bytes, over its limit of {limit:,}", hint=over)
    return found.st_size


def read_file(path: Path, what: str, limit: int, *, over: str = "", error: type[ApplianceError] = ApplianceError
              ) -> bytes:
    """regular_file()'s bytes, never more than limit of them even if the file grows meanwhile."""
    regular_file(path, what, limit, over=over, error=error)
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what} {path} holds more than its limit of {limit:,} bytes", hint=over)
    return data
