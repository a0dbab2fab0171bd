"""Throughput of blobs.put and blobs.get against the crypto they cannot avoid.

A put must SHA-256 hash and AES-256-GCM encrypt every byte, and a get must decrypt and
hash it again. Doing only that, in memory and on one thread, on the same bytes in the
same run, is the baseline: the least work either can do. The ratio of store MiB/s to
baseline MiB/s is how much of that speed is left after the database and the code around it.

A durable put must also get every byte onto the disk, so the run measures that floor too:
the same sealed bytes written to a file beside the database and fdatasync'ed, once,
with nothing else to do. A put can be no faster than the slower of its two floors; the
table gives that ceiling as a ratio, so a disk slower than the crypto shows as a ceiling
under the target rather than as slow code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.core import config, hardware
from appliance.store import Store, blobs, lifecycle
from appliance.store.db import start_writeback

MIB = 1 << 20
TARGET = 0.6

P = ParamSpec("P")
T = TypeVar("T")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256, help="size of each stored blob (default 256)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept (default 3)")
    parser.add_argument("--dir", type=Path, help="state directory to create (default: a temporary one, removed after)")
    args = parser.parse_args()

    state_dir = args.dir or Path(tempfile.mkdtemp(prefix="appliance-bench-"))
    try:
        results = run(state_dir, args.size_mib, args.repeat)
    finally:
        if args.dir is None:
            shutil.rmtree(state_dir)
    report(results, args.size_mib, args.repeat)


def run(state_dir: Path, size_mib: int, repeat: int) -> dict[str, tuple[float, float, float | None]]:
    """Best MiB/s of (store, crypto baseline, disk baseline) for put, and of (store, crypto baseline, None) for get."""
    os.environ["APPLIANCE_STATE_DIR"] = str(state_dir)
    pieces = [os.urandom(MIB) for _ in range(size_mib)]
    put_times, get_times, seal_times, open_times, disk_times = [], [], [], [], []
    with lifecycle.init(config.load()) as opened:
        for run_index in range(repeat):
            # New leading bytes each run, so the content id is new and nothing is deduplicated.
            pieces[0] = run_index.to_bytes(8, "big") + pieces[0][8:]
            key = AESGCM.generate_key(bit_length=256)
            expected, seconds = timed(seal_baseline, key, pieces)
            seal_times.append(seconds)
            sealed = seal_all(key, pieces)
            open_times.append(timed(open_baseline, key, sealed, expected)[1])
            disk_times.append(timed(write_durably, state_dir / "disk-baseline", sealed)[1])
            del sealed
            blob_id, seconds = timed(blobs.put, opened, iter(pieces))
            put_times.append(seconds)
            # The copy of the WAL into the database that the put left to the checkpointer thread,
            # done here and untimed: the get is timed on its own, not beside the put's deferred work.
            opened.db.execute("PRAGMA wal_checkpoint(PASSIVE)")  # as that thread does it
            get_times.append(timed(drain, opened, blob_id)[1])
            assert blob_id == expected
    return {
        "put": (size_mib / min(put_times), size_mib / min(seal_times), size_mib / min(disk_times)),
        "get": (size_mib / min(get_times), size_mib / min(open_times), None),
    }


def timed(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> tuple[T, float]:
    start = time.perf_counter()
    result = work(*args, **kwargs)
    return result, time.perf_counter() - start


def seal_baseline(key: bytes, pieces: list[bytes]) -> str:
    """What put cannot avoid: hash every chunk and encrypt it (then drop it, as put does once written)."""
    sealer = AESGCM(key)
    digest = hashlib.sha256()
    for index, piece in enumerate(pieces):
        digest.update(piece)
        sealer.encrypt(nonce(index), piece, None)
    return digest.hexdigest()


def seal_all(key: bytes, pieces: list[bytes]) -> list[bytes]:
    sealer = AESGCM(key)
    return [sealer.encrypt(nonce(index), piece, None) for index, piece in enumerate(pieces)]


def open_baseline(key: bytes, sealed: list[bytes], expected: str) -> None:
    """What get cannot avoid: decrypt and hash every chunk."""
    opener = AESGCM(key)
    digest = hashlib.sha256()
    for index, chunk in enumerate(sealed):
        digest.update(opener.decrypt(nonce(index), chunk, None))
    assert digest.hexdigest() == expected


def write_durably(path: Path, sealed: list[bytes]) -> None:
    """What put cannot avoid on the disk: the sealed bytes written once and on stable storage.

    The kernel is asked to start writing as the bytes come, as a put does, so this is the disk's
    own speed and not the time to fill the page cache plus the time to empty it.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for index, chunk in enumerate(sealed, start=1):
            os.write(fd, chunk)
            if index % blobs.WRITEBACK_EVERY == 0:
                start_writeback(path)
        os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()


def nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")


def drain(opened: Store, blob_id: str) -> None:
    for _ in blobs.get(opened, blob_id):
        pass


def report(results: dict[str, tuple[float, float, float | None]], size_mib: int, repeat: int) -> None:
    print(f"machine: {hardware.detect_cpu().described()}")
    print(f"blob: {size_mib} MiB in 1 MiB chunks, best of {repeat} runs")
    print()
    print(f"{'operation':<10} {'MiB/s':>9} {'crypto MiB/s':>13} {'ratio':>6} {'target':>7} "
          f"{'disk MiB/s':>11} {'ceiling':>8} {'of disk':>8}")
    summary: dict[str, float] = {}
    for operation, (store_rate, crypto_rate, disk_rate) in results.items():
        ratio = store_rate / crypto_rate
        summary[f"{operation}_ratio"] = round(ratio, 2)
        summary[f"{operation}_target"] = TARGET
        disk = ceiling = of_disk = "-"
        if disk_rate is not None:
            summary[f"{operation}_ceiling"] = round(min(crypto_rate, disk_rate) / crypto_rate, 2)
            summary[f"{operation}_of_disk"] = round(store_rate / disk_rate, 2)
            disk = f"{disk_rate:.1f}"
            ceiling, of_disk = f"{summary[f'{operation}_ceiling']:.2f}", f"{summary[f'{operation}_of_disk']:.2f}"
        print(f"{operation:<10} {store_rate:>9.1f} {crypto_rate:>13.1f} {ratio:>6.2f} {TARGET:>7.1f} "
              f"{disk:>11} {ceiling:>8} {of_disk:>8}")
    print("ceiling: the ratio a put would reach at the speed of the slower floor, the crypto or the disk")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
