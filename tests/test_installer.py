"""The offline bundle, built from this checkout and installed as a site would, with no network.

install.sh runs with --root (a temporary directory standing in for /) inside `unshare --net`: a
network namespace whose only interface is loopback, so pip, the installed CLI, the doctor and the
quickstart's daemon, training and server show that they need no network at all. Building the
bundle downloads from PyPI (or this machine's mirrors) through pip's cache. install.sh and
unshare need root; CI runs as root.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from appliance.core import config
from appliance.store import lifecycle
from tests.conftest import write_tickets
from tests.daemon import short_dir
from tests.test_packaging import unit_settings

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="install.sh, unshare and mount need root")]

REPOSITORY = Path(__file__).resolve().parent.parent


def _ensure(command: str, package: str) -> None:
    """A Debian package's tool, installed if missing (a clean CI machine may lack systemd's tools)."""
    if shutil.which(command):
        return
    for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", package]):
        subprocess.run(step, check=True, capture_output=True, timeout=600)


def _run(*command: str | Path, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


def offline(*command: str | Path, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run a command in a new network namespace with nothing but loopback: no way out."""
    return _run("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "offline", *command, env=env,
                timeout=timeout)


def _build(source: Path, out: Path, key: Path) -> Path:
    result = _run(REPOSITORY / "installer" / "build-bundle", "--variant", "cpu", "--out", out, "--source", source,
                  "--sign-key", key.with_suffix(".key"))
    assert result.returncode == 0, result.stderr[-3000:]
    (bundle,) = out.glob("*.tar")
    return bundle


def _unpack(bundle: Path, where: Path) -> Path:
    """The unpacked bundle's directory, as an operator's `tar -xf` leaves it."""
    where.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle) as archive:
        archive.extractall(where, filter="tar")
    return where / bundle.name.removesuffix(".tar")


@dataclasses.dataclass
class Installed:
    """An installation under root, and the bundle it came from."""

    root: Path
    unpacked: Path
    key: Path  # the signing key pair's name: .key and .pub beside it
    socket_dir: Path = dataclasses.field(default_factory=short_dir)

    @property
    def state(self) -> Path:
        return self.root / "var/lib/appliance"

    @property
    def master_key(self) -> Path:
        return self.root / "etc/credstore/appliance.master.key"

    def env(self) -> dict[str, str]:
        """The installed CLI pointed at this root instead of /etc, /var and /run (a socket path must stay short)."""
        return {**os.environ, "APPLIANCE_CONFIG": str(self.root / "etc/appliance/appliance.toml"),
                "APPLIANCE_STATE_DIR": str(self.state), "APPLIANCE_KEYS_FILE": str(self.master_key),
                "APPLIANCE_DAEMON_SOCKET": str(self.socket_dir / "s"), "HF_HUB_OFFLINE": "1"}

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return offline(self.root / "opt/appliance/current/bin/appliance", *args, env=env or self.env())

    def install(self, unpacked: Path | None = None, *args: str) -> subprocess.CompletedProcess[str]:
        return offline((unpacked or self.unpacked) / "install.sh", "--root", self.root, *args)

    def current(self) -> str:
        return os.readlink(self.root / "opt/appliance/current")


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """Where the bundles and installations go (GBs), removed after the module rather than kept by pytest."""
    path = Path(tempfile.mkdtemp(prefix="appliance-installer-"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def scratch(workspace: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir=workspace))
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def signing_key(workspace: Path) -> Path:
    name = workspace / "vendor"
    assert _run(REPOSITORY / "installer" / "build-bundle", "--make-key", name).returncode == 0
    return name


@pytest.fixture(scope="module")
def bundle(workspace: Path, signing_key: Path) -> Path:
    return _build(REPOSITORY, workspace / "bundle", signing_key)


@pytest.fixture(scope="module")
def installed(bundle: Path, signing_key: Path, workspace: Path) -> Iterator[Installed]:
    _ensure("ip", "iproute2")
    _ensure("systemd-sysusers", "systemd")  # install.sh needs its sysusers and tmpfiles, the tests systemd-analyze
    _ensure("openssl", "openssl")  # install.sh checks the signature with it
    site = Installed(workspace / "site", _unpack(bundle, workspace / "usb"), signing_key)
    result = site.install(None, "--pubkey", str(signing_key.with_suffix(".pub")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 9 checks passed" in result.stdout  # install.sh ends with the doctor
    assert "systemctl enable appliance.service" in result.stdout  # what it leaves to do where systemd runs
    yield site
    shutil.rmtree(site.socket_dir)


def test_the_bundle_pins_every_wheel_by_hash_with_the_cpu_torch_and_no_torchvision(bundle: Path) -> None:
    with tarfile.open(bundle) as archive:
        top = bundle.name.removesuffix(".tar")
        lock = archive.extractfile(f"{top}/requirements.lock").read().decode().splitlines()  # type: ignore[union-attr]
        sums = archive.extractfile(f"{top}/SHA256SUMS").read().decode()  # type: ignore[union-attr]
        files = {member.name.removeprefix(f"{top}/") for member in archive.getmembers() if member.isfile()}
    assert all("==" in line and " --hash=sha256:" in line for line in lock)
    names = {line.split("==")[0] for line in lock}
    assert {"appliance", "torch", "openvino", "optimum-intel", "pip"} <= names and "torchvision" not in names
    assert any(line.startswith("torch==2.13.0+cpu ") for line in lock)
    assert len([name for name in files if name.startswith("wheelhouse/")]) == len(lock)
    assert {line.split("  ")[1] for line in sums.splitlines()} == files - {"SHA256SUMS", "SHA256SUMS.sig"}


def test_the_installed_copy_runs_offline_and_owns_what_it_should(installed: Installed) -> None:
    no_way_out = offline("python3", "-c", "import socket; socket.create_connection(('pypi.org', 443), timeout=5)")
    assert no_way_out.returncode != 0  # the namespace these commands run in really has no network

    assert installed.cli("version").stdout.startswith("appliance 0.1.0")
    doctor = installed.cli("doctor")
    assert doctor.returncode == 0 and "all 9 checks passed" in doctor.stdout
    layout = installed.root / "opt/appliance"
    assert installed.current().startswith("releases/0.1.0-") and not (layout / "previous").exists()
    assert stat.S_IMODE(installed.master_key.stat().st_mode) == 0o600 and installed.master_key.stat().st_uid == 0
    owner = next(line for line in (installed.root / "etc/passwd").read_text().splitlines()
                 if line.startswith("appliance:")).split(":")
    assert installed.state.stat().st_uid == int(owner[2]) and stat.S_IMODE(installed.state.stat().st_mode) == 0o700
    assert (installed.state / "intel/openvino_telemetry").read_text() == "0"


# Runs in the container below as a unit at boot; each step leaves its output in /out.
PROBE = """#!/bin/sh
trap 'systemctl poweroff --no-block' EXIT
cd /tmp
/bundle/install.sh --pubkey /keys/vendor.pub >/out/install 2>&1; echo $? >/out/install.rc
systemctl show appliance -p ActiveState -p User -p StatusText >/out/started
stat -c '%U %a %n' /var/lib/appliance /var/lib/appliance/appliance.db /run/appliance /run/appliance/appliance.sock \
    /etc/credstore/appliance.master.key >/out/owners
cli=/opt/appliance/current/bin/appliance  # /usr/local/bin is read-only here: the host's /usr
$cli version >/out/version 2>&1
$cli quickstart >/out/quickstart 2>&1; echo $? >/out/quickstart.rc
$cli doctor >/out/doctor 2>&1; echo $? >/out/doctor.rc
systemctl reload appliance; sleep 2
systemctl stop appliance
systemctl show appliance -p Result -p ActiveState -p NRestarts >/out/stopped
journalctl -u appliance --no-pager >/out/journal
"""


def test_under_systemd_the_service_starts_hardened_and_the_quickstart_runs_through_it(installed: Installed,
                                                                                     workspace: Path) -> None:
    """install.sh and the unit under a real systemd: a throwaway container on this machine's /usr.

    systemd-nspawn boots systemd on an empty tmpfs root (--volatile) with no network but loopback
    (--private-network); a unit there runs install.sh from the bundle with the real paths, and then
    the installed CLI's version, quickstart and doctor against the service it started.
    """
    _ensure("systemd-nspawn", "systemd-container")
    rig = workspace / "nspawn"
    units, out = rig / "units", rig / "out"
    (units / "multi-user.target.wants").mkdir(parents=True)
    out.mkdir()
    (units / "probe.service").write_text("[Service]\nType=oneshot\nExecStart=/bin/sh /out/probe.sh\n")
    (units / "multi-user.target.wants/probe.service").symlink_to("../probe.service")
    (units / "systemd-firstboot.service").symlink_to("/dev/null")  # an empty /etc would make it ask questions
    (out / "probe.sh").write_text(PROBE)
    booted = _run("systemd-nspawn", "--directory=/", "--volatile=yes", "--boot", "--private-network",
                  "--register=no", "--keep-unit", f"--machine=appliance-test-{os.getpid()}", f"--bind={out}:/out",
                  f"--bind={units}:/etc/systemd/system", f"--bind-ro={installed.unpacked}:/bundle",
                  f"--bind-ro={installed.key.with_suffix('.pub')}:/keys/vendor.pub", timeout=1500)
    result = {path.name: path.read_text() for path in out.iterdir()}
    assert result.get("install.rc") == "0\n", booted.stdout[-3000:] + result.get("install", "")[-3000:]
    assert "ActiveState=active" in result["started"] and "User=appliance" in result["started"]
    assert result["owners"].splitlines() == [
        "appliance 700 /var/lib/appliance", "appliance 600 /var/lib/appliance/appliance.db",
        "appliance 750 /run/appliance", "appliance 660 /run/appliance/appliance.sock",
        "root 600 /etc/credstore/appliance.master.key"]
    assert result["version"].startswith("appliance 0.1.0")
    assert result["quickstart.rc"] == "0\n", result["quickstart"][-3000:] + result["journal"][-3000:]
    assert "using the running daemon on /run/appliance/appliance.sock" in result["quickstart"]
    assert "deployed sample-tickets:2" in result["quickstart"] and "live prediction for" in result["quickstart"]
    assert result["doctor.rc"] == "0\n", result["doctor"]
    assert "in use by the running appliance daemon" in result["doctor"] and "opens store" in result["doctor"]
    assert "configuration reloaded" in result["journal"] and "appliance.daemon: stopped" in result["journal"]
    assert set(result["stopped"].split()) == {"Result=success", "ActiveState=inactive", "NRestarts=0"}


def _flip_one_byte(bundle: Path, copy: Path) -> str:
    """Copy the bundle with one byte changed in the middle of the torch wheel; returns that member's name."""
    shutil.copy(bundle, copy)
    with tarfile.open(copy) as archive:
        wheel = next(member for member in archive.getmembers() if "/wheelhouse/torch-" in member.name)
    with copy.open("r+b") as file:
        file.seek(wheel.offset_data + wheel.size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x01]))
    return wheel.name


def test_a_bundle_with_one_changed_byte_is_refused(bundle: Path, scratch: Path) -> None:
    changed = _flip_one_byte(bundle, scratch / bundle.name)
    root = scratch / "root"
    result = offline(_unpack(scratch / bundle.name, scratch / "usb") / "install.sh", "--root", root)
    assert result.returncode == 1
    assert "the bundle is damaged or was changed" in result.stderr
    assert changed.split("/", 1)[1] + ": FAILED" in result.stderr and "Traceback" not in result.stderr
    assert not (root / "opt").exists() and not (root / "etc/appliance").exists()  # nothing installed


def test_a_bad_or_missing_signature_is_refused(bundle: Path, scratch: Path) -> None:
    other = scratch / "other"
    assert _run(REPOSITORY / "installer" / "build-bundle", "--make-key", other).returncode == 0
    unpacked = _unpack(bundle, scratch / "usb")
    root = scratch / "root"
    forged = offline(unpacked / "install.sh", "--root", root, "--pubkey", other.with_suffix(".pub"))
    assert forged.returncode == 1 and "signature does not verify" in forged.stderr

    missing = offline(unpacked / "install.sh", "--root", root, "--pubkey", scratch / "nowhere.pub")
    assert missing.returncode == 1 and "nowhere.pub' is none" in missing.stderr and "--make-key" in missing.stderr

    (unpacked / "SHA256SUMS.sig").unlink()
    unsigned = offline(unpacked / "install.sh", "--root", root, "--pubkey", other.with_suffix(".pub"))
    assert unsigned.returncode == 1 and "the bundle is not signed" in unsigned.stderr
    assert not (root / "opt").exists()


@pytest.fixture
def gpu_nodes(installed: Installed) -> Iterator[None]:
    """Stand-ins for NVIDIA and render device nodes under the root, as install.sh looks for them."""
    nodes = [installed.root / "dev/nvidiactl", installed.root / "dev/dri/renderD128"]
    for node in nodes:
        node.parent.mkdir(parents=True, exist_ok=True)
        node.touch()
    yield
    shutil.rmtree(installed.root / "dev")
    assert installed.install().returncode == 0  # and without them the GPU drop-ins go again
    assert not list((installed.root / "etc/systemd/system/appliance.service.d").glob("gpu-*.conf"))


def _verify_unit(installed: Installed) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify on the unit as installed, with the release where ExecStart names it.

    A private mount namespace puts the root's /opt over /opt, so the unit is checked as written,
    against the host's systemd units and the installed release, and nothing outside sees it.
    """
    unit = installed.root / "etc/systemd/system/appliance.service"
    return _run("unshare", "--mount", "sh", "-c", 'mount --bind "$1" /opt && exec systemd-analyze verify "$2"',
                "verify", installed.root / "opt", unit)


def test_the_unit_and_its_drop_ins_verify_without_a_word_and_rate_ok(installed: Installed, gpu_nodes: None) -> None:
    dropins = installed.root / "etc/systemd/system/appliance.service.d"
    assert {path.name for path in dropins.iterdir()} == {"memory.conf"}
    assert unit_settings(dropins / "memory.conf") == {"MemoryMax": ["80%"]}
    checked = _verify_unit(installed)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")  # it only warns on a misspelt key

    again = installed.install()  # on a host with GPUs: the drop-ins that open their device nodes
    assert again.returncode == 0, again.stderr
    assert {path.name for path in dropins.iterdir()} == {"memory.conf", "gpu-nvidia.conf", "gpu-dri.conf"}
    assert unit_settings(dropins / "gpu-nvidia.conf")["DevicePolicy"] == ["closed"]
    checked = _verify_unit(installed)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")

    (dropins / "gpu-nvidia.conf").unlink()
    (dropins / "gpu-dri.conf").unlink()
    rating = _run("systemd-analyze", "security", "--offline=yes", "--threshold=20",
                  installed.root / "etc/systemd/system/appliance.service")
    assert rating.returncode == 0, rating.stdout[-2000:]  # exposure at most 2.0
    assert rating.stdout.strip().splitlines()[-1].split(": ")[1].split()[1] == "OK"


def test_the_doctor_fails_with_a_fix_on_a_key_others_can_read(installed: Installed) -> None:
    installed.master_key.chmod(0o644)
    try:
        result = installed.cli("doctor")
    finally:
        installed.master_key.chmod(0o600)
    assert result.returncode == 1
    assert f"fix: run 'chmod 600 {installed.master_key}'" in result.stdout


def test_an_upgrade_keeps_state_key_and_config_and_rolls_back(installed: Installed, scratch: Path) -> None:
    imported = installed.cli("data", "import", str(write_tickets(scratch / "tickets.csv")), "--name", "kept")
    assert imported.returncode == 0, imported.stderr
    config = installed.root / "etc/appliance/appliance.toml"
    config.write_text(config.read_text().replace("port = 8080", "port = 8181"))
    key = installed.master_key.read_bytes()
    old = installed.current()
    _store_behind_by_one_schema(installed.state / "appliance.db")

    source = scratch / "source"  # the next release: this checkout, one version on
    shutil.copytree(REPOSITORY, source, ignore=shutil.ignore_patterns(".git", ".venv", "var", "build", "*.egg-info"))
    pyproject = source / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.1.1"'))
    newer = _unpack(_build(source, scratch / "out", installed.key), scratch / "usb")
    other = scratch / "other"  # a changed bundle, signed by whoever changed it, with that key beside it
    assert _run(REPOSITORY / "installer" / "build-bundle", "--make-key", other).returncode == 0
    signature = (newer / "SHA256SUMS.sig").read_bytes()
    assert _run("openssl", "pkeyutl", "-sign", "-inkey", other.with_suffix(".key"), "-rawin", "-in",
                newer / "SHA256SUMS", "-out", newer / "SHA256SUMS.sig").returncode == 0
    swapped = installed.install(newer, "--pubkey", str(other.with_suffix(".pub")))
    assert swapped.returncode == 1 and "is not the key earlier bundles were checked with" in swapped.stderr
    assert "--replace-key" in swapped.stderr and installed.current() == old
    (newer / "SHA256SUMS.sig").write_bytes(signature)
    upgraded = installed.install(newer)  # no --pubkey: the key from the first install is trusted
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert "verifies with" in upgraded.stdout and "bundle-signing.pub" in upgraded.stdout
    new = installed.current()
    assert new.startswith("releases/0.1.1-")
    assert os.readlink(installed.root / "opt/appliance/previous") == old
    copy = installed.state / f"appliance.db.before-{new.removeprefix('releases/')}"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600 and copy.stat().st_uid == installed.state.stat().st_uid
    _store_behind_by_one_schema(installed.state / "appliance.db", undo=True)

    assert installed.cli("version").stdout.startswith("appliance 0.1.1")
    assert "kept" in installed.cli("data", "list").stdout
    assert installed.master_key.read_bytes() == key and "port = 8181" in config.read_text()
    assert installed.cli("doctor").returncode == 0

    rolled = offline(installed.root / "opt/appliance/current/bundle/install.sh", "--rollback", "--root", installed.root)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert installed.current() == old and os.readlink(installed.root / "opt/appliance/previous") == new
    assert installed.cli("version").stdout.startswith("appliance 0.1.0")
    assert "kept" in installed.cli("data", "list").stdout
    assert copy.name in rolled.stdout  # where to find the store as the older release left it


def _store_behind_by_one_schema(database: Path, undo: bool = False) -> None:
    """Make the store look one migration behind (or put it back), so an upgrade has a migration to come."""
    conn = sqlite3.connect(database)
    if undo:
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES ((SELECT MAX(version) + 1 FROM"
                     " schema_version), 'restored by the test')")
    else:
        conn.execute("DELETE FROM schema_version WHERE version = (SELECT MAX(version) FROM schema_version)")
    conn.commit()
    conn.close()


def test_uninstall_keeps_the_data_and_purge_removes_it(installed: Installed) -> None:
    """The last test here: it takes the installation away."""
    kept = [installed.state / "appliance.db", installed.master_key, installed.root / "etc/appliance/appliance.toml"]
    removed = offline(installed.root / "opt/appliance/current/bundle/install.sh", "--uninstall", "--root", installed.root)
    assert removed.returncode == 0, removed.stderr
    assert not (installed.root / "opt/appliance").exists()
    assert not (installed.root / "etc/systemd/system/appliance.service").exists()
    assert all(path.exists() for path in kept)

    unconfirmed = offline(installed.unpacked / "install.sh", "--uninstall", "--purge", "--root", installed.root)
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr and all(path.exists() for path in kept)
    purged = offline(installed.unpacked / "install.sh", "--uninstall", "--purge", "--yes", "--root", installed.root)
    assert purged.returncode == 0, purged.stderr
    assert not any(path.exists() for path in kept) and not installed.state.exists()
    assert "appliance:" in (installed.root / "etc/passwd").read_text()  # the system user stays, and says so
    assert "userdel appliance" in purged.stdout


def test_the_cuda_variant_resolves_pypis_cuda_build() -> None:
    """The cuda path without its 5 GB download: what pip would put in the wheelhouse."""
    result = _run(REPOSITORY / "installer" / "build-bundle", "--variant", "cuda", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    wheels = dict(line.split("==") for line in result.stdout.splitlines())
    assert wheels["torch"] == "2.13.0"  # PyPI's build, not the local CPU one
    assert any(name.startswith("nvidia-") for name in wheels) and "torchvision" not in wheels
    assert wheels["openvino"] == metadata.version("openvino")  # the versions the tests ran with



def test_the_store_copy_before_a_migration_follows_no_link_the_service_user_put_there(
        settings: config.Settings, tmp_path: Path) -> None:
    """The state directory is the service user's: root wrote and chowned the copy there by name, so a link put in
    its place (to /etc/shadow, say) was followed and what it named handed over. install.sh's function, on its own."""
    import sys

    state, opt, kept = settings.state_dir, tmp_path / "opt", tmp_path / "root-only"
    opt.mkdir()
    lifecycle.init(settings).close()
    _store_behind_by_one_schema(state / "appliance.db")
    for path in (state, *state.iterdir()):
        os.chown(path, 65534, 65534)  # the service's user's, as the daemon leaves them
    (state / "appliance.db.before-r2").symlink_to(kept)  # where the copy for r2 will go, a link to a file of root's
    function = (REPOSITORY / "installer" / "install.sh").read_text().split("\ncopy_store_before_migration() {")[1]
    script = (f'set -euo pipefail\nsay() {{ echo "$*"; }}\ndie() {{ echo "error: $1" >&2; exit 1; }}\n'
              f'state={state}; opt={opt}\ncopy() {{{function.split(chr(10) + "}" + chr(10))[0]}\n}}\n'
              f'copy r1\ncopy r2\n').replace('"$opt/releases/$release/bin/python"', sys.executable)
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert f"the store as it was: {state}/appliance.db.before-r1" in ran.stdout
    copy = (state / "appliance.db.before-r1").stat()
    assert (copy.st_uid, copy.st_gid, stat.S_IMODE(copy.st_mode)) == (65534, 65534, 0o600)
    assert ran.returncode == 1 and "could not copy the store before release r2" in ran.stderr
    assert not kept.exists() and not list(opt.iterdir())  # nothing written through the link, nothing left staged
