"""Master keys: sources in order, 0600 key files, wrong keys refused, rotation."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from appliance import store
from appliance.core.config import Settings
from appliance.core.errors import KeyMismatch, KeyMissing, StoreError
from appliance.store import Store, audit, blobs, keys, lifecycle
from tests.conftest import run_cli


def _fingerprint_of_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _install_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes) -> Path:
    """Put a key where systemd's LoadCredential= would, and point the environment at it."""
    credentials = tmp_path / "creds"
    credentials.mkdir(exist_ok=True)
    (credentials / "master.key").write_bytes(content)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    return credentials / "master.key"


def test_init_creates_a_key_file_readable_only_by_its_owner(opened: Store, settings: Settings) -> None:
    assert stat.S_IMODE(settings.key_file.stat().st_mode) == 0o600
    assert len(base64.b64decode(settings.key_file.read_bytes())) == 32
    assert opened.master.source == f"key file {settings.key_file}"
    assert stat.S_IMODE(settings.db_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.state_dir.stat().st_mode) == 0o700


def test_init_refuses_a_store_that_already_has_a_key(opened: Store, settings: Settings) -> None:
    with pytest.raises(StoreError, match="already has a master key"):
        lifecycle.init(settings)


def test_opening_without_any_key_says_how_to_make_one(settings: Settings) -> None:
    with pytest.raises(KeyMissing) as caught:
        store.open(settings)
    assert "appliance keys init" in caught.value.hint


def test_a_passphrase_store_asks_for_its_passphrase_and_says_when_it_is_not_the_one(settings: Settings,
                                                                                      tmp_path: Path) -> None:
    """Not 'put its key file back', nor 'the key this store was created with': a typo is a typo."""
    right = {"APPLIANCE_PASSPHRASE": "correct horse battery"}
    assert run_cli("keys", "init", "--passphrase", env=right).returncode == 0
    backup = run_cli("backup", "now", env=right)
    assert backup.returncode == 0, backup.stderr
    for command in (("store", "info"), ("backup", "verify", next(settings.backup_dir.glob("*.db")).name)):
        unset = run_cli(*command)
        assert unset.returncode == 1 and "this store is opened by a passphrase: set APPLIANCE_PASSPHRASE" in unset.stderr
        typo = run_cli(*command, env={"APPLIANCE_PASSPHRASE": "correct horse batterY"})
        assert typo.returncode == 1 and "Traceback" not in typo.stderr
        assert "exactly as typed then" in typo.stderr or "the passphrase does not open this store" in typo.stderr


def test_a_group_readable_key_file_is_refused(opened: Store, settings: Settings) -> None:
    opened.close()
    settings.key_file.chmod(0o640)
    with pytest.raises(StoreError, match=r"readable by group or others \(mode 0640\)"):
        store.open(settings)


@pytest.mark.parametrize(("content", "says"), [(os.urandom(32), "is not base64 text"),
                                               (base64.b64encode(os.urandom(16)), "holds 16 bytes")])
def test_a_key_file_in_the_wrong_form_names_the_file_and_the_fix(
    opened: Store, settings: Settings, content: bytes, says: str
) -> None:
    opened.close()
    settings.key_file.write_bytes(content)  # a raw key someone copied in, or a short one
    result = run_cli("store", "info")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"the master key file {settings.key_file} {says}" in result.stderr
    assert "base64 -w0" in result.stderr


def test_a_wrong_key_is_refused_and_nothing_changes(opened: Store, settings: Settings) -> None:
    blobs.put(opened, b"secret payload")
    opened.close()
    before = _fingerprint_of_file(settings.db_path)
    settings.key_file.unlink()
    keys.write_key_file(settings.key_file, keys.generate())

    result = run_cli("audit", "list")
    assert result.returncode == 1
    assert "master key does not match this store" in result.stderr
    assert f"use the key this store was created with (fingerprint {opened.master.fingerprint})" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(KeyMismatch):
        store.open(settings)
    assert _fingerprint_of_file(settings.db_path) == before


def test_the_systemd_credential_comes_before_the_key_file(
    opened: Store, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened.close()
    credential = _install_credential(tmp_path, monkeypatch, base64.b64encode(keys.generate()))
    with pytest.raises(KeyMismatch, match="systemd credential"):
        store.open(settings)
    credential.write_bytes(settings.key_file.read_bytes())
    with store.open(settings) as reopened:
        assert reopened.master.source.startswith("systemd credential")


def test_a_passphrase_store_opens_with_its_passphrase_only(settings: Settings) -> None:
    with lifecycle.init(settings, passphrase="correct horse battery staple") as created:
        blob_id = blobs.put(created, b"data")
    assert not settings.key_file.exists()
    with store.open(settings, "correct horse battery staple") as reopened:
        assert blobs.read(reopened, blob_id) == b"data"
    with pytest.raises(KeyMismatch):
        store.open(settings, "wrong horse")


def test_rotation_rewraps_every_key_and_retires_the_old_one(opened: Store, settings: Settings) -> None:
    contents = [os.urandom(size) for size in (10, blobs.CHUNK_SIZE + 3)]
    ids = [blobs.put(opened, data) for data in contents]
    chunks_before = opened.db.execute("SELECT data FROM blob_chunks ORDER BY storage_id, idx").fetchall()
    old_key = settings.key_file.read_bytes()

    rotation = lifecycle.rotate(opened)

    assert rotation.rewrapped == 2
    assert settings.key_file.read_bytes() != old_key
    assert stat.S_IMODE(settings.key_file.stat().st_mode) == 0o600
    # payloads are not re-encrypted, only their keys re-wrapped
    assert opened.db.execute("SELECT data FROM blob_chunks ORDER BY storage_id, idx").fetchall() == chunks_before
    opened.close()
    with store.open(settings) as reopened:
        assert [blobs.read(reopened, blob_id) for blob_id in ids] == contents
        assert audit.verify(reopened).ok  # audit MACs do not depend on the master key
    settings.key_file.unlink()
    settings.key_file.write_bytes(old_key)
    settings.key_file.chmod(0o600)
    with pytest.raises(KeyMismatch):
        store.open(settings)


def test_a_rotation_cut_off_before_its_rename_is_finished_on_next_open(opened: Store, settings: Settings) -> None:
    blob_id = blobs.put(opened, b"survives")
    old_key = settings.key_file.read_bytes()
    lifecycle.rotate(opened)
    opened.close()
    # Simulate a crash after the commit but before the new key file replaced the old one.
    new_key = settings.key_file.read_bytes()
    settings.key_file.write_bytes(old_key)
    keys.write_key_file(keys.pending_key_file(settings.key_file), base64.b64decode(new_key))

    with store.open(settings) as reopened:
        assert blobs.read(reopened, blob_id) == b"survives"
    assert settings.key_file.read_bytes() == new_key
    assert not keys.pending_key_file(settings.key_file).exists()


def test_a_passphrase_rotation_takes_the_new_passphrase(settings: Settings) -> None:
    with lifecycle.init(settings, passphrase="old pass phrase") as created:
        blob_id = blobs.put(created, b"data")
        lifecycle.rotate(created, new_passphrase="new pass phrase")
    with store.open(settings, "new pass phrase") as reopened:
        assert blobs.read(reopened, blob_id) == b"data"
    with pytest.raises(KeyMismatch):
        store.open(settings, "old pass phrase")


def test_a_passphrase_given_to_a_key_files_store_is_told_the_store_takes_a_key(settings: Settings,
                                                                                tmp_path: Path) -> None:
    """Not 'type it as it was set': no passphrase ever opened it. Its key file was moved away, say."""
    run_cli("keys", "init", check=True)
    settings.key_file.rename(tmp_path / "elsewhere.key")
    given = run_cli("keys", "status", env={"APPLIANCE_PASSPHRASE": "correct horse battery"})
    assert given.returncode == 1 and "opened by a key file or a systemd credential, not by a passphrase" in given.stderr
    assert keys.read_key_file(tmp_path / "elsewhere.key").fingerprint in given.stderr


def test_a_store_rotated_from_a_passphrase_to_a_key_no_longer_stretches_a_passphrase(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with lifecycle.init(settings, "old pass phrase") as created:
        lifecycle.rotate(created, new_key_file=tmp_path / "new.key")
    with pytest.raises(KeyMismatch, match="not by a passphrase"):
        store.open(settings, "old pass phrase")
    with pytest.raises(KeyMissing) as caught:
        store.open(settings)
    assert "opened by a passphrase" not in caught.value.hint
    _install_credential(tmp_path, monkeypatch, (tmp_path / "new.key").read_bytes())
    store.open(settings).close()


def test_a_credential_rotation_writes_the_new_key_where_asked(
    opened: Store, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened.close()
    credential = _install_credential(tmp_path, monkeypatch, settings.key_file.read_bytes())
    with store.open(settings) as from_credential:
        with pytest.raises(StoreError, match="cannot rewrite") as caught:
            lifecycle.rotate(from_credential)
        assert "--new-key-file" in caught.value.hint
        lifecycle.rotate(from_credential, new_key_file=tmp_path / "new.key")
    credential.write_bytes((tmp_path / "new.key").read_bytes())
    with store.open(settings) as reopened:
        assert reopened.master.fingerprint == keys.read_key_file(tmp_path / "new.key").fingerprint


def test_cli_key_commands_round_trip() -> None:
    assert run_cli("keys", "init", check=True).returncode == 0
    status = run_cli("keys", "status", "--json", check=True)
    assert '"opens_store": true' in status.stdout
    rotated = run_cli("keys", "rotate", check=True)
    assert "re-wrapped 0 data keys" in rotated.stdout
    assert "keys.rotate" in run_cli("audit", "list", check=True).stdout


def _cli_without_a_terminal(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command run from a script: stdin is no terminal, so nothing can be typed unseen."""
    return subprocess.run([sys.executable, "-m", "appliance", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300, check=False)


def test_a_rotation_writes_no_key_where_the_store_would_not_look_for_it(settings: Settings, tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    elsewhere = run_cli("keys", "rotate", "--new-key-file", str(tmp_path / "new.key"))
    assert elsewhere.returncode == 1 and "only for a master key from a systemd credential" in elsewhere.stderr
    assert "leave out --new-key-file" in elsewhere.stderr and not (tmp_path / "new.key").exists()
    assert '"opens_store": true' in run_cli("keys", "status", "--json", check=True).stdout  # nobody locked out

    credentials = tmp_path / "creds"
    credentials.mkdir()
    (credentials / "master.key").write_bytes(settings.key_file.read_bytes())
    from_credential = {"CREDENTIALS_DIRECTORY": str(credentials)}
    missing = run_cli("keys", "rotate", "--new-key-file", str(tmp_path / "no" / "new.key"), env=from_credential)
    assert missing.returncode == 2 and f"the folder {tmp_path / 'no'} does not exist" in missing.stderr
    assert not (tmp_path / "no").exists()
    rotated = run_cli("keys", "rotate", "--new-key-file", str(tmp_path / "new.key"), env=from_credential, check=True)
    assert "install it as the credential master.key" in rotated.stdout
    (credentials / "master.key").write_bytes((tmp_path / "new.key").read_bytes())
    assert run_cli("keys", "status", env=from_credential).returncode == 0


def test_a_passphrase_with_no_terminal_to_type_it_at_names_the_variable_that_gives_it(settings: Settings) -> None:
    asked = _cli_without_a_terminal("keys", "init", "--passphrase")
    assert asked.returncode == 2 and "no terminal to ask for the passphrase at: set APPLIANCE_PASSPHRASE" in asked.stderr
    assert "GetPassWarning" not in asked.stderr

    lifecycle.init(settings, passphrase="correct horse battery staple").close()  # the refusal made no store
    rotating = _cli_without_a_terminal("keys", "rotate", APPLIANCE_PASSPHRASE="correct horse battery staple")
    assert rotating.returncode == 2 and "set APPLIANCE_NEW_PASSPHRASE" in rotating.stderr


def test_a_new_master_passphrase_is_as_long_as_an_exports_and_an_older_short_one_still_opens(
    settings: Settings,
) -> None:
    short = run_cli("keys", "init", "--passphrase", env={"APPLIANCE_PASSPHRASE": "a"})
    assert short.returncode == 1 and "the new master passphrase is shorter than 12 characters" in short.stderr

    assert not settings.db_path.exists()  # the refusal made no store
    database = store.connect(settings)  # a store made before the minimum: its salt kept, its passphrase short
    keys.note_key(database, keys.stretch("short", keys.new_kdf_params()))
    database.conn.close()
    store.open(settings, "short").close()
    older = {"APPLIANCE_PASSPHRASE": "short"}
    assert run_cli("keys", "status", env=older).returncode == 0
    refused = run_cli("keys", "rotate", env={**older, "APPLIANCE_NEW_PASSPHRASE": "still short"})
    assert refused.returncode == 1 and "shorter than 12 characters" in refused.stderr
    run_cli("keys", "rotate", env={**older, "APPLIANCE_NEW_PASSPHRASE": "correct horse battery"}, check=True)
    assert run_cli("keys", "status", env={"APPLIANCE_PASSPHRASE": "correct horse battery"}).returncode == 0
