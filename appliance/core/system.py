"""How busy the box is right now: CPU, memory, the state directory's disk and the GPUs.

For the operator's overview, not for planning (hardware.py plans). GPUs are read with
nvidia-smi where it exists, so the daemon never opens a CUDA context of its own just
to report on them.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

NVIDIA_SMI_TIMEOUT_S = 5


@dataclass(frozen=True)
class GpuLoad:
    index: int
    name: str
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class Load:
    cpu_percent: float  # all cores, since the previous call
    memory_used_bytes: int
    memory_total_bytes: int
    disk_free_bytes: int  # where the state directory lives
    disk_total_bytes: int
    gpus: tuple[GpuLoad, ...]


def load(state_dir: Path) -> Load:
    """The load now; the CPU share is measured since the previous call (the first call primes it)."""
    memory = psutil.virtual_memory()
    disk = shutil.disk_usage(state_dir if state_dir.exists() else state_dir.parent)
    return Load(
        cpu_percent=psutil.cpu_percent(interval=None),
        memory_used_bytes=memory.total - memory.available,
        memory_total_bytes=memory.total,
        disk_free_bytes=disk.free,
        disk_total_bytes=disk.total,
        gpus=_gpus(),
    )


def _gpus() -> tuple[GpuLoad, ...]:
    """NVIDIA GPUs as nvidia-smi reports them; none when it is absent or fails (a broken driver is hardware.py's news)."""
    if shutil.which("nvidia-smi") is None:
        return ()
    query = "index,name,utilization.gpu,memory.used,memory.total"
    try:
        output = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    found = []
    for line in output.strip().splitlines():
        try:
            index, name, utilization, used, total = (part.strip() for part in line.split(","))
            found.append(GpuLoad(int(index), name, float(utilization), int(used) * 2**20, int(total) * 2**20))
        except ValueError:  # "[N/A]" on some boards: that GPU is left out rather than guessed
            continue
    return tuple(found)
