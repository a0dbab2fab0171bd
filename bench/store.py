"""Throughput of blobs.put and blobs.get against the crypto they cannot avoid.

A put must SHA-256 hash and AES-256-GCM encrypt every byte, and a get must decrypt and
hash it again. Doing only that, in memory and on one thread, on the same bytes in the
same run, is the baseline: the least work either can do. The ratio of store MiB/s to
baseline MiB/s is how much of that speed is left after the database and the code around it.
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

from appliance import config
from appliance.store import Store, blobs, lifecycle

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


def run(state_dir: Path, size_mib: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Best MiB/s of (store, baseline) for put and get."""
    os.environ["APPLIANCE_STATE_DIR"] = str(state_dir)
    pieces = [os.urandom(MIB) for _ in range(size_mib)]
    put_times, get_times, seal_times, open_times = [], [], [], []
    with lifecycle.init(config.load()) as opened:
        for run_index in range(repeat):
            # New leading bytes each run, so the content id is new and nothing is deduplicated.
            pieces[0] = run_index.to_bytes(8, "big") + pieces[0][8:]
            key = AESGCM.generate_key(bit_length=256)
            expected, seconds = timed(seal_baseline, key, pieces)
            seal_times.append(seconds)
            open_times.append(timed(open_baseline, key, seal_all(key, pieces), expected)[1])
            blob_id, seconds = timed(blobs.put, opened, iter(pieces))
            put_times.append(seconds)
            get_times.append(timed(drain, opened, blob_id)[1])
            assert blob_id == expected
    return {
        "put": (size_mib / min(put_times), size_mib / min(seal_times)),
        "get": (size_mib / min(get_times), size_mib / min(open_times)),
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


def nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")


def drain(opened: Store, blob_id: str) -> None:
    for _ in blobs.get(opened, blob_id):
        pass


def report(results: dict[str, tuple[float, float]], size_mib: int, repeat: int) -> None:
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores")
    print(f"blob: {size_mib} MiB in 1 MiB chunks, best of {repeat} runs")
    print()
    print(f"{'operation':<10} {'MiB/s':>9} {'baseline MiB/s':>15} {'ratio':>6} {'target':>7}")
    summary: dict[str, float] = {}
    for operation, (store_rate, baseline_rate) in results.items():
        ratio = store_rate / baseline_rate
        print(f"{operation:<10} {store_rate:>9.1f} {baseline_rate:>15.1f} {ratio:>6.2f} {TARGET:>7.1f}")
        summary[f"{operation}_ratio"] = round(ratio, 2)
        summary[f"{operation}_target"] = TARGET
    print(json.dumps(summary))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
