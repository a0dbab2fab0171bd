"""Files of Debian packages, unpacked without installing them: real third-party tools and data for tests and
benchmarks (`apt-get download` fetches the .deb, `dpkg -x` unpacks it into a folder of the caller's)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def unpacked(packages: tuple[str, ...], into: Path) -> Path:
    """The packages' files under into (as they would lie under /); CalledProcessError when apt cannot fetch them."""
    with tempfile.TemporaryDirectory(prefix="debs-") as folder:
        subprocess.run(["apt-get", "download", *packages], cwd=folder, check=True, capture_output=True, timeout=300)
        for package in Path(folder).glob("*.deb"):
            subprocess.run(["dpkg", "-x", str(package), str(into)], check=True, capture_output=True, timeout=300)
    return into
