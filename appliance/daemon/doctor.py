"""Checks that this appliance can run, each a pass or a fail with how to fix it.

run() looks at the hardware and the training plan it implies, the master key, the store,
the audit chain, every deployed model (decrypted and hashed), the backups, the ports and the free disk space, and returns one Check per finding for
the CLI (`appliance doctor`), the installer and the TUI to show. It changes nothing: the
store is opened read-only, so root can examine a service's store without taking its
files over.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import socket
import sqlite3
import stat
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from appliance import registry, store
from appliance.core import clock, hardware, text
from appliance.core.config import Settings
from appliance.core.errors import ApplianceError, BackupError, StoreError
from appliance.daemon import client
from appliance.store import audit, backups, blobs, keys, migrations, space
from appliance.store import db as store_db

GiB = 2**30
DISK_FAIL_BYTES = 2 * GiB  # below this a checkpoint or an optimised model may not fit
DISK_WARN_BYTES = 10 * GiB
FULL_WARN_DAYS = 7  # warn when the store's growth fills the disk sooner
UNSCHEDULED_BACKUP_DAYS = 7  # with no schedule, warn when the newest backup (or a store without one) is older


class Status(enum.Enum):
    OK = "ok"
    """Checked and fine."""
    WARN = "warn"
    """Fine for now, but worth a look (the store does not exist yet, disk space is getting low)."""
    FAIL = "fail"
    """Broken: the appliance will not work until it is fixed."""
    SKIP = "skip"
    """Not checked, because an earlier check failed that it depends on."""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str  # what was found
    hint: str | None = None  # how to fix it, for warnings and failures


def run(settings: Settings, passphrase: str | None = None) -> list[Check]:
    """Every check, in the order an operator would fix them."""
    found = hardware.detect()
    return [_hardware(found), _plan(settings, found), *_key_and_store(settings, passphrase), _backups(settings),
            *_ports(settings), _disk(settings)]


def failed(checks: list[Check]) -> bool:
    return any(check.status is Status.FAIL for check in checks)


# -- hardware -----------------------------------------------------------------------------


def _hardware(found: hardware.Hardware) -> Check:
    gpus = ", ".join(gpu.name for gpu in found.gpus) or "no CUDA GPU"
    devices = ", ".join(device.name for device in found.openvino_devices) or "none"
    detail = (f"{found.cpu.model}, {found.cpu.physical_cores} cores, {hardware.format_bytes(found.ram_total_bytes)}"
              f" RAM; {gpus}; OpenVINO devices: {devices}")
    if found.notes:
        return Check("hardware", Status.WARN, f"{detail}; {'; '.join(found.notes)}",
                     "the appliance uses what it could detect; 'appliance hw' shows the details")
    return Check("hardware", Status.OK, detail)


def _plan(settings: Settings, found: hardware.Hardware) -> Check:
    try:
        shape = hardware.model_shape(settings.base_model)
        plan = hardware.plan(found, hardware.JobRequest(shape=shape, seq_len=128, effective_batch=32))
    except ApplianceError as exc:
        return Check("training plan", Status.FAIL, exc.message,
                     exc.hint or "set train.base_model to a local Hugging Face model directory")
    return Check("training plan", Status.OK,
                 f"{plan.device}, {plan.precision}, micro-batch {plan.micro_batch} for the {shape.parameters / 1e6:.1f}M"
                 f"-parameter base model: about {hardware.format_bytes(plan.estimated_peak_bytes)} of a"
                 f" {hardware.format_bytes(plan.budget_bytes)} budget")


# -- key, store, audit --------------------------------------------------------------------


def _key_and_store(settings: Settings, passphrase: str | None) -> list[Check]:
    key = _key(settings, passphrase)
    if not settings.db_path.exists():
        return [key, Check("store", Status.WARN, f"no store yet at {settings.db_path}",
                           "the daemon creates it on its first start ('systemctl start appliance' or"
                           " 'appliance quickstart')"),
                Check("audit log", Status.SKIP, "not checked: no store yet"),
                Check("served models", Status.SKIP, "not checked: no store yet")]
    integrity = _integrity(settings)
    if key.status is Status.FAIL or integrity.status is Status.FAIL:
        failing = "the master key" if key.status is Status.FAIL else "the store"
        return [key, integrity, Check("audit log", Status.SKIP, f"not checked: {failing} failed its check"),
                Check("served models", Status.SKIP, f"not checked: {failing} failed its check")]
    try:
        opened = store.open_read_only(settings, passphrase)
    except ApplianceError as exc:  # the key does not match this store
        return [Check("master key", Status.FAIL, exc.message, exc.hint), integrity,
                Check("audit log", Status.SKIP, "not checked: the master key does not open the store"),
                Check("served models", Status.SKIP, "not checked: the master key does not open the store")]
    with opened:
        verification = audit.verify(opened)
        served = _served(opened)
    key = replace(key, detail=f"{key.detail}; it opens store {opened.store_id}")
    if not verification.ok:
        return [key, integrity, Check("audit log", Status.FAIL, f"{verification.problem}",
                                      "'appliance audit verify' names the first bad record; keep the database as"
                                      " evidence and restore the last good backup"), served]
    return [key, integrity, Check("audit log", Status.OK,
                                  f"{verification.records} record{'s' * (verification.records != 1)}; the chain"
                                  " and its signed head verify"), served]


def _served(opened: store.Store) -> Check:
    """Decrypt and hash every version that is deployed: a model that would no longer load must not pass."""
    deployed = [version for version in registry.list_versions(opened) if "production" in version.aliases
                or ("candidate" in version.aliases and registry.canary_percent(opened, version.model) > 0)]
    if not deployed:
        return Check("served models", Status.OK, "nothing is deployed yet")
    broken = []
    for version in deployed:
        try:
            for _chunk in blobs.get(opened, version.serving_variant().blob_id):  # every chunk's tag, then the hash
                pass
        except ApplianceError as exc:
            broken.append(f"{version.ref}: {exc.message}")
    if broken:
        return Check("served models", Status.FAIL, "; ".join(broken),
                     "roll back to a version that opens ('appliance rollback MODEL'), or restore the last good backup")
    return Check("served models", Status.OK, f"{', '.join(version.ref for version in deployed)}: every chunk"
                 " decrypts and the content matches its hash")


def _key(settings: Settings, passphrase: str | None) -> Check:
    """Where the key comes from and whether that source is sound; whether it opens the store comes later."""
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if credentials and (Path(credentials) / keys.CREDENTIAL_NAME).is_file():
        return Check("master key", Status.OK, f"systemd credential {Path(credentials) / keys.CREDENTIAL_NAME}")
    path = settings.key_file
    try:
        keys.read_key_file(path)
    except FileNotFoundError:
        if passphrase is not None:
            return Check("master key", Status.OK, "passphrase (APPLIANCE_PASSPHRASE)")
        return Check("master key", Status.FAIL, f"no key file at {path}, no credential, no passphrase",
                     "restore the key from its backup; for a new appliance run 'appliance keys init' (install.sh"
                     " creates it)")
    except PermissionError:
        return Check("master key", Status.FAIL, f"the key file {path} cannot be read by this user",
                     "run 'appliance doctor' as root, or as the user the key belongs to")
    except StoreError as exc:
        return Check("master key", Status.FAIL, exc.message, exc.hint)
    return Check("master key", Status.OK, f"key file {path} (mode {stat.S_IMODE(path.stat().st_mode):04o})")


def _integrity(settings: Settings) -> Check:
    try:
        database = store_db.connect_read_only(settings.db_path)
    except StoreError as exc:
        return Check("store", Status.FAIL, exc.message, exc.hint)
    try:
        damage = store_db.integrity_problems(database.conn)
        version = None if damage else migrations.current_version(database)
    finally:
        database.conn.close()
    if damage:
        return Check("store", Status.FAIL, f"SQLite's integrity check failed: {'; '.join(damage[:3])}",
                     "stop the service and restore the last good backup ('appliance backup list', 'appliance backup"
                     " restore FILE')")
    if version > migrations.LATEST:
        return Check("store", Status.FAIL,
                     f"{settings.db_path} has schema version {version}; this release knows up to {migrations.LATEST}",
                     "a newer release wrote it: install that release again, or restore the copy install.sh kept"
                     " before the upgrade")
    size = settings.db_path.stat().st_size
    upgrade = f", upgraded to {migrations.LATEST} at the next start" if version < migrations.LATEST else ""
    return Check("store", Status.OK, f"{settings.db_path} ({size / 2**20:.1f} MiB): integrity ok, schema"
                 f" {version}{upgrade}")


# -- backups ------------------------------------------------------------------------------


def _backups(settings: Settings) -> Check:
    """Whether a backup to restore exists, and is as recent as the schedule promises: a backup directory that
    became a file or a schedule that stopped shows here before the day it is needed. Read without the key."""
    if not settings.db_path.exists():
        return Check("backups", Status.SKIP, "not checked: no store yet")
    every_h = settings.backup.every_hours
    allowed = timedelta(hours=2 * every_h) if every_h else timedelta(days=UNSCHEDULED_BACKUP_DAYS)
    schedule = (f"the daemon takes one every {every_h:g} hours: is it running? 'appliance alerts' shows a backup"
                " that failed" if every_h else "none is scheduled (backup.every_hours is 0): 'appliance backup now'"
                " takes one; set backup.every_hours for the daemon to take them")
    try:
        found = backups.list_backups(settings)
    except BackupError as exc:
        return Check("backups", Status.WARN, exc.message, exc.hint)
    if aside := backups.left_aside(settings):
        size = sum(path.stat().st_size for path in aside if path.is_file())
        return Check("backups", Status.WARN, f"restores left {', '.join(path.name for path in aside)} beside the store"
                     f" ({hardware.format_bytes(size)})", "once the restored store has proved itself, delete them: each"
                     " holds a store as it was before a restore (keys revoked since included), encrypted as it was")
    if not found:
        age = _store_age(settings)
        if age is not None and age > allowed:
            return Check("backups", Status.WARN, f"no backup in {settings.backup_dir}, and the store is"
                         f" {text.duration(age.total_seconds())} old", schedule)
        return Check("backups", Status.OK, f"none yet in {settings.backup_dir}; the store is new")
    newest = found[0]
    if newest.problem is not None:
        return Check("backups", Status.WARN, f"the newest backup, {newest.path.name}, cannot be read: {newest.problem}",
                     f"'appliance backup verify {newest.path}' checks it; 'appliance backup now' takes a new one")
    age = clock.now() - newest.created_at
    detail = f"the newest of {len(found)} in {settings.backup_dir} is {text.duration(age.total_seconds())} old"
    return Check("backups", Status.WARN if age > allowed else Status.OK, detail, schedule if age > allowed else None)


def _store_age(settings: Settings) -> timedelta | None:
    """Since the store's first audit record (its creation); None if that cannot be read."""
    try:
        database = store_db.connect_read_only(settings.db_path)
    except StoreError:
        return None
    try:
        row = database.execute("SELECT ts FROM audit ORDER BY seq LIMIT 1").fetchone()
    except sqlite3.DatabaseError:
        return None
    finally:
        database.conn.close()
    return clock.age(row[0]) if row else None


# -- ports and disk -----------------------------------------------------------------------


def _ports(settings: Settings) -> list[Check]:
    wanted = [("inference port", settings.serve.host, settings.serve.port, "serve.port")]
    if settings.daemon.tcp_port:
        wanted.append(("control port", settings.daemon.tcp_host, settings.daemon.tcp_port, "daemon.tcp_port"))
    ours = client.daemon_running(settings)
    return [_port(name, host, port, key, ours, settings) for name, host, port, key in wanted]


def _port(name: str, host: str, port: int, key: str, ours: bool, settings: Settings) -> Check:
    where = f"{host}:{port}"
    if port < 1024:
        return Check(name, Status.FAIL, f"{where} is a privileged port, which the service cannot open",
                     f"the service runs without capabilities: set {key} to 1024 or above")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return Check(name, Status.FAIL, f"cannot listen on {where}: {exc.strerror}",
                             f"set {key.replace('port', 'host')} to an address of this machine")
            if ours and (key != "serve.port" or client.inference_answers(settings)):
                return Check(name, Status.OK, f"{where} is in use by the running appliance daemon")
            return Check(name, Status.FAIL, f"{where} is in use by another program",
                         f"stop it ('ss -ltnp' shows which), or set {key} to a free port")
    return Check(name, Status.OK, f"{where} is free")


def _disk(settings: Settings) -> Check:
    where = settings.state_dir
    while not where.exists():  # before the first start the state directory may not exist yet
        where = where.parent
    free = shutil.disk_usage(where).free
    detail = f"{hardware.format_bytes(free)} free for {settings.state_dir}"
    hint = ("free space on that file system, or move state_dir to a larger one; 'appliance store info' shows what"
            " the store holds, and deleting datasets and model versions no longer needed gives their space back")
    grown = _growth(settings)
    days_left = free / grown.bytes_per_day if grown is not None and grown.bytes_per_day > 0 else None
    if grown is not None and days_left is not None:
        detail += (f"; the store grows by {hardware.format_bytes(int(grown.bytes_per_day))} a day (over the last"
                   f" {grown.days} day{'s' * (grown.days != 1)}): full in about {days_left:.0f} days at that rate")
    if free < DISK_FAIL_BYTES:
        return Check("disk space", Status.FAIL, detail, hint)
    if free < DISK_WARN_BYTES or (days_left is not None and days_left < FULL_WARN_DAYS):
        return Check("disk space", Status.WARN, detail, hint)
    return Check("disk space", Status.OK, detail)


def _growth(settings: Settings) -> space.Growth | None:
    """The store's growth from its daily size samples (no key needed); None before two days of them."""
    if not settings.db_path.exists():
        return None
    try:
        database = store_db.connect_read_only(settings.db_path)
    except StoreError:  # the store check says why
        return None
    try:
        return space.growth(database)
    finally:
        database.conn.close()
