"""Fixtures shared by the suite: an isolated environment, settings, an initialised store."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance import config, store
from appliance.store import lifecycle


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in its own directory with no appliance settings from outside."""
    for name in list(os.environ):
        if name.startswith("APPLIANCE_") or name in ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def settings(tmp_path: Path) -> config.Settings:
    return config.load()


@pytest.fixture
def opened(settings: config.Settings) -> Iterator[store.Store]:
    """A new store with a key file, open."""
    with lifecycle.init(settings) as new_store:
        yield new_store


def run_cli(*args: str, env: dict[str, str] | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real `appliance` command in a subprocess, in the test's directory."""
    result = subprocess.run(
        [sys.executable, "-m", "appliance", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"appliance {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result
