"""A Ray head of its own on loopback, for the burst tests and bench/burst.py: token authentication on, every port
chosen free, its own temporary directory, so it neither meets nor stops another Ray on this machine; stopped by its
own process id, and any of its processes still alive then are named and killed."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil


@dataclass
class RayHead:
    address: str
    token_file: Path
    tmp: Path  # the temporary folder of its processes (TMPDIR)

    def client(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        token = self.token_file.read_text().strip()
        return JobSubmissionClient(self.address, headers={"Authorization": f"Bearer {token}"})


@contextmanager
def local_head(num_cpus: int = 2) -> Iterator[RayHead]:
    """A head with num_cpus CPUs (so as many one-CPU training workers), until the block ends."""
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay short
    token_file = root / "token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    tmp = root / "tmp"
    tmp.mkdir()
    ports = free_ports(9)
    workers = _worker_ports_base()
    dashboard = f"http://127.0.0.1:{ports[0]}"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file),
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "TMPDIR": str(tmp), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env = {name: value for name, value in env.items() if not name.startswith("APPLIANCE_")}
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus", str(num_cpus),
               "--disable-usage-stats", "--node-ip-address", "127.0.0.1", "--include-dashboard", "true",
               "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports[0]), "--port", str(ports[1]),
               "--node-manager-port", str(ports[2]), "--object-manager-port", str(ports[3]),
               "--dashboard-agent-listen-port", str(ports[4]), "--dashboard-agent-grpc-port", str(ports[5]),
               "--runtime-env-agent-port", str(ports[6]), "--metrics-export-port", str(ports[7]),
               "--ray-client-server-port", str(ports[8]), "--min-worker-port", str(workers),
               "--max-worker-port", str(workers + 99), "--object-store-memory", str(100 * 2**20),
               "--temp-dir", str(root / "r")]
    log = (root / "head.log").open("w")
    # Its own working directory: jobs start there, and a checkout there would shadow the shipped package.
    process = subprocess.Popen(command, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    head = RayHead(dashboard, token_file, tmp)
    try:
        _wait_for_dashboard(head, process, root / "head.log")
        yield head
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        left = _processes_under(root)
        for process in left:  # ours by their temp dir, killed by pid: never another Ray on this machine
            process.kill()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes outlived the head: {[p.info['cmdline'][:2] for p in left]}"


def _worker_ports_base() -> int:
    """The first of 100 worker ports below the kernel's ephemeral range, so no port picked by `free_ports` lies in it."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 10000 + secrets.randbelow(max(1, (ephemeral_low - 10000) // 100 - 1)) * 100


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _wait_for_dashboard(head: RayHead, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"ray start exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            head.client().get_version()
            return
        except (ConnectionError, RuntimeError, OSError):  # not up yet (Ray raises these while it starts)
            time.sleep(1)
    raise AssertionError(f"the Ray dashboard did not answer:\n{log.read_text()[-3000:]}")


def _processes_under(root: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(root) in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found
