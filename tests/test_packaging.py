"""The packaging files agree with each other and with the code that reads them; the bundle tool's keys."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker

from appliance.core import config
from appliance.core.errors import ConfigError
from appliance.store import keys

REPOSITORY = Path(__file__).resolve().parent.parent
PACKAGING = REPOSITORY / "packaging"


def unit_settings(path: Path) -> dict[str, list[str]]:
    """Key -> values of a systemd unit or drop-in, comments and sections left out."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_the_default_config_is_valid_and_puts_things_where_the_unit_expects_them() -> None:
    settings = config.load(PACKAGING / "appliance.toml")
    unit = unit_settings(PACKAGING / "appliance.service")
    assert settings.state_dir == Path("/var/lib") / unit["StateDirectory"][0]
    assert settings.socket_path.parent == Path("/run") / unit["RuntimeDirectory"][0]
    credential, _, source = unit["LoadCredential"][0].partition(":")
    assert credential == keys.CREDENTIAL_NAME and Path(source) == settings.key_file
    assert f"HOME={settings.state_dir}" in unit["Environment"]
    assert settings.daemon.memory_max == "80%" and settings.serve.port >= 1024  # the service has no capabilities
    user = (PACKAGING / "sysusers.conf").read_text().split("\nu ")[1].split()
    assert user[0] == unit["User"][0] == unit["Group"][0] and user[-2] == str(settings.state_dir)


@pytest.mark.parametrize("value", ["lots", "80 %", "12 G", "-1G"])
def test_a_memory_limit_systemd_would_not_take_is_refused(tmp_path: Path, value: str) -> None:
    conf = tmp_path / "appliance.toml"
    conf.write_text(f'[daemon]\nmemory_max = "{value}"\n')
    with pytest.raises(ConfigError) as caught:
        config.load(conf)
    assert "daemon.memory_max" in caught.value.message and "80%" in (caught.value.hint or "")


def test_the_telemetry_file_tmpfiles_writes_opts_openvino_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO's own consent check, given the file tmpfiles.d writes in the service's HOME."""
    line = next(line.split() for line in (PACKAGING / "tmpfiles.conf").read_text().splitlines()
                if line.startswith("f+"))
    path, content = Path(line[1]), line[6]
    home = unit_settings(PACKAGING / "appliance.service")["Environment"][0].removeprefix("HOME=")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    assert OptInChecker().check(enable_opt_in_dialog=False) is ConsentCheckResult.NO_FILE  # NNCF sends then
    written = tmp_path / path.relative_to(home)
    written.parent.mkdir()
    written.write_text(content)
    assert OptInChecker().check(enable_opt_in_dialog=False) is ConsentCheckResult.DECLINED


def _build_bundle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPOSITORY / "installer" / "build-bundle"), *args], capture_output=True, text=True,
                          timeout=600, check=False)


def test_make_key_writes_a_private_key_and_never_overwrites_one(tmp_path: Path) -> None:
    made = _build_bundle("--make-key", str(tmp_path / "site"))
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE((tmp_path / "site.key").stat().st_mode) == 0o600
    assert (tmp_path / "site.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    again = _build_bundle("--make-key", str(tmp_path / "site"))
    assert again.returncode == 1 and "already exists" in again.stderr and "Traceback" not in again.stderr


def test_a_signing_key_others_can_read_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    assert _build_bundle("--make-key", str(tmp_path / "site")).returncode == 0
    (tmp_path / "site.key").chmod(0o644)
    result = _build_bundle("--variant", "cpu", "--out", str(tmp_path / "out"), "--sign-key", str(tmp_path / "site.key"))
    assert result.returncode == 1 and "readable by group or others" in result.stderr
    assert "chmod 600" in result.stderr and not (tmp_path / "out").exists()
