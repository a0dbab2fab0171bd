"""Temporary folders that a killed process does not leave behind for good.

A process ended by SIGKILL (a Ray worker stopped or preempted, the kernel's OOM killer) runs no
cleanup, so its temporary folders stay: a burst worker's holds a scratch store of the whole dataset
and model, sealed under a key that died with the process but 180 MB each time. Each folder made here
is matched by a file beside it that its process holds an exclusive lock on for as long as it lives,
and the kernel drops that lock when the process dies, however it dies. Making a folder first removes
the folders of the same prefix whose lock can be taken, with their lock files: whoever made them is
gone. A folder without such a file (another program's, or one still being made) is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OWNER, CLAIM = ".owner", ".claim"  # the lock file beside a folder; named OWNER only once locked


@contextmanager
def folder(prefix: str) -> Iterator[Path]:
    """A new private (0700) temporary folder named prefix..., removed when the block ends, or by the next one made
    with this prefix after this process dies. Its lock is a file beside it (prefix....owner), so the folder holds
    only what its user puts in it."""
    parent = Path(tempfile.gettempdir())
    _sweep(parent, prefix)
    descriptor, claim = tempfile.mkstemp(prefix=prefix, suffix=CLAIM, dir=parent)
    made = Path(claim.removesuffix(CLAIM))
    owner = made.with_name(made.name + OWNER)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        made.mkdir(mode=0o700)  # a folder of that name already there is someone else's: refused, left alone
    except BaseException:
        os.unlink(claim)
        os.close(descriptor)
        raise
    try:
        os.rename(claim, owner)
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
        for lock in (claim, owner):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
        os.close(descriptor)


def _sweep(parent: Path, prefix: str) -> None:
    """Remove this user's folders under parent named prefix... whose makers have died, with their lock files."""
    for owner in parent.glob(f"{prefix}*{OWNER}"):
        try:
            facts = owner.lstat()
        except FileNotFoundError:  # removed meanwhile, by its maker or another sweep
            continue
        if not stat.S_ISREG(facts.st_mode) or facts.st_uid != os.geteuid():
            continue
        try:
            descriptor = os.open(owner, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process lives
            os.close(descriptor)
            continue
        shutil.rmtree(owner.with_name(owner.name.removesuffix(OWNER)), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            owner.unlink()
        os.close(descriptor)
