"""Temporary folders of processes killed without cleaning up are removed by the next one made; a live one's never."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from appliance.core import scratch

PREFIX = "appliance-test-scratch-"
HOLDER = f"""
import sys, time
from appliance.core import scratch
with scratch.folder({PREFIX!r}) as made:
    (made / "store.db").write_bytes(b"x" * 4096)
    print(made, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@contextmanager
def holder(root: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process that made a folder and holds it until killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER], env={**os.environ, "TMPDIR": str(root)},
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process, Path(process.stdout.readline().strip())
    finally:
        process.kill()
        process.wait()


def test_a_killed_process_folder_is_removed_by_the_next_one_made_and_a_live_process_folder_is_kept(
    tmp_root: Path,
) -> None:
    with holder(tmp_root) as (killed, dead_folder), holder(tmp_root) as (_, live_folder):
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert (dead_folder / "store.db").exists()  # SIGKILL ran no cleanup
        foreign = tmp_root / f"{PREFIX}not-ours"  # another program's folder of the same name: no lock file beside it
        foreign.mkdir()
        assert (dead_folder.parent / f"{dead_folder.name}{scratch.OWNER}").exists()

        with scratch.folder(PREFIX) as made:
            assert not dead_folder.exists()
            assert (live_folder / "store.db").exists() and foreign.exists()
            assert stat.S_IMODE(made.stat().st_mode) == 0o700
            assert made.parent == tmp_root and list(made.iterdir()) == []  # its lock lies beside it, not in it
        assert not made.exists()  # its own, removed when the block ends
        assert live_folder.exists()
        assert sorted(path.name for path in tmp_root.iterdir()) == sorted(  # dead one's lock file gone as well
            [foreign.name, live_folder.name, f"{live_folder.name}{scratch.OWNER}"])
