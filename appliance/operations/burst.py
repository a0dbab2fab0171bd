"""Bursting a training job to a central Ray cluster, when the dataset's residency allows it.

The job goes through Ray's Job Submission API (the cluster's dashboard port), with Ray's
token authentication and, for https, the cluster's CA. What leaves the box is sealed
under a fresh per-job key (AES-256-GCM, chunk by chunk, each chunk's label, index and
last-flag bound into its AAD): a manifest (dataset version, hyperparameters), the
dataset's canonical content and the base model's files. The sealed chunks travel as
runtime_env `py_modules` packages of at most PACKAGE_BYTES each (Ray refuses large
packages and keeps them in the cluster's GCS), next to the appliance package itself,
which runs the same training engine there, on the Ray Train workers it asks for
(burst_remote.py). The key is not in any
package, nor in the runtime environment (whose variables Ray's runtime-env agent writes
to its log on the node, to stay there after the job): it reaches the job as an entry of
the job's metadata, which Ray keeps in memory and hands to the entrypoint alone, which
takes it out before it joins the cluster and gives it to its workers from memory. Whoever
holds the cluster's token can read it while the job is known to the cluster; the job is
deleted from the cluster once its result is home (see the README's threat model).

The remote job prints progress, logs and, at the end, its sealed result (the model
bundle and the run's record) as log lines; the appliance polls status and logs into
the local job's events, checks the result (authentication of every chunk, SHA-256 of
the bundle) and stores it encrypted with lineage `trained_on: ray://host:port/id`.
A job that fails for good after a checkpoint (its workers died more often than Ray
Train starts them again) prints that checkpoint, sealed, instead: it becomes an
unfinished local run, which a fallback, or `train --resume`, continues here.
Every step is audited: a refusal, what was sent where, the result, a checkpoint
brought home, a cancel.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import appliance
from appliance.core import archive, scratch
from appliance.core.config import BurstSettings, Settings
from appliance.core.errors import ApplianceError, BurstError, ResidencyRefused, TamperDetected
from appliance.data import datasets
from appliance.store import Store, audit, blobs, keys
from appliance.store import seal as sealing
from appliance.train import runs
from appliance.train.params import TrainParams

if TYPE_CHECKING:  # torch loads only where something trains
    from appliance.train import engine, parallel

log = logging.getLogger("appliance.operations.burst")

KEY_METADATA = "appliance_job_key"  # the job's metadata entry that carries its key
TOKEN_CREDENTIAL = "burst.token"  # the token's name in $CREDENTIALS_DIRECTORY
PROGRESS, ERROR = "APPLIANCE-BURST-PROGRESS", "APPLIANCE-BURST-ERROR"
RESULT, CHECKPOINT = "APPLIANCE-BURST-RESULT", "APPLIANCE-BURST-CHECKPOINT"  # sealed, a chunk per line
CHUNK_BYTES = 2**20  # plaintext per sealed payload chunk: sealing holds a few at a time
LINE_BYTES = 192 * 2**10  # plaintext per sealed line in the job's log (a result or a checkpoint)
PACKAGE_BYTES = 64 * 2**20  # sealed bytes per py_modules package: well under Ray's package cap
UNREACHABLE_GRACE_S = 120.0  # a cluster silent this long while a job runs there fails the job
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
FORGET_SETTLE_S = 2.5  # Ray's job monitor looks at each job's supervisor once a second
FORGET_TRIES = 3
# The training workers' lines reach the job's log once each, as they wrote them: not deduplicated across workers,
# not also through Ray Train's logger, behind a prefix without colours ("(RayTrainWorker pid=7) ").
REMOTE_LOGGING = {"RAY_DEDUP_LOGS": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "RAY_COLOR_PREFIX": "0"}


class Interrupted(Exception):
    """The local job was asked to stop (preempted, the daemon stopping, or cancelled) while the burst ran."""


# -- sealing: the same code on both sides -------------------------------------------


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def seal(key: bytes, label: str, data: sealing.Source, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """data as sealed chunks (seal.py, framed: one key seals every payload of a job); the AAD binds the label."""
    return sealing.seal_framed(AESGCM(key), sealing.pieces(data, chunk_bytes), functools.partial(_aad, label))


def unseal(key: bytes, label: str, chunks: Iterable[bytes]) -> bytes:
    """The data back from its chunks, in order; BurstError if any chunk was changed, moved, added or cut off."""
    try:
        return sealing.open_framed(AESGCM(key), chunks, functools.partial(_aad, label), f"the {label}")
    except TamperDetected as exc:
        raise BurstError(exc.message) from exc


def _aad(label: str, index: int, last: bool) -> bytes:
    return b"appliance/burst|%s|%d|%s" % (label.encode(), index, b"01" if last else b"00")


# -- the backend: Ray's Job Submission API ------------------------------------------


class Backend(Protocol):
    """What a burst needs from a cluster; Ray's Jobs API is the one there is."""

    address: str

    def submit(self, submission_id: str, packages: list[Path], key: bytes) -> None: ...
    def status(self, submission_id: str) -> str: ...  # PENDING | RUNNING | SUCCEEDED | FAILED | STOPPED
    def logs(self, submission_id: str) -> str: ...
    def cancel(self, submission_id: str) -> None: ...
    def forget(self, submission_id: str) -> None: ...  # drop a finished job (and its key) from the cluster
    def where(self, submission_id: str) -> str: ...  # the lineage name of the remote run


class RayBackend:
    """Ray's JobSubmissionClient, with the token in a header (never argv or logs) and timeouts on every call."""

    def __init__(self, settings: BurstSettings, token: str) -> None:
        self.address = settings.address.rstrip("/")
        self._token = token
        self._verify: str | bool = str(settings.ca_file) if settings.ca_file else True
        self._python = settings.python
        self._client: Any = None

    def submit(self, submission_id: str, packages: list[Path], key: bytes) -> None:
        """The appliance package and the payload packages as py_modules; the job runs appliance.operations.burst_remote,
        which asks Ray Train for the workers (their CPUs or GPUs): the entrypoint itself needs none. The key goes in
        the job's metadata, never its runtime environment (see the module's docstring)."""
        runtime_env = {"py_modules": [str(Path(appliance.__file__).parent), *map(str, packages)],
                       "excludes": ["__pycache__", "*.pyc"], "env_vars": REMOTE_LOGGING}
        entrypoint = f"{self._python} -m appliance.operations.burst_remote {submission_id} {len(packages)}"
        self._call("submit the job", lambda client: client.submit_job(
            entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env, entrypoint_num_cpus=0,
            metadata={"submitted_by": "appliance", KEY_METADATA: base64.b64encode(key).decode()}))

    def status(self, submission_id: str) -> str:
        return str(self._call("read the job's status", lambda client: client.get_job_status(submission_id).value))

    def logs(self, submission_id: str) -> str:
        return self._call("read the job's logs", lambda client: client.get_job_logs(submission_id))

    def cancel(self, submission_id: str) -> None:
        self._call("stop the job", lambda client: client.stop_job(submission_id))

    def forget(self, submission_id: str) -> None:
        """Delete the job, and again while it comes back: Ray's job monitor, finding the supervisor of a job deleted
        a moment ago gone, records the job anew as failed. That record holds no key, but it is a job nobody ran."""
        for _ in range(FORGET_TRIES):
            self._call("delete the finished job", lambda client: client.delete_job(submission_id))
            time.sleep(FORGET_SETTLE_S)
            if not self._call("check the job is gone", lambda client: _listed(client, submission_id)):
                return
        raise BurstError(f"the Ray cluster at {self.address} keeps a record of job {submission_id} after "
                         f"{FORGET_TRIES} deletes", hint=f"delete it there: 'ray job delete {submission_id}'")

    def where(self, submission_id: str) -> str:
        return f"ray://{urlsplit(self.address).netloc}/{submission_id}"

    def _call(self, what: str, call: Any) -> Any:
        """One request; Ray's and requests' errors become a BurstError that names the cluster, never the token."""
        client_class = _client_class()
        import requests  # Ray's client is built on it

        try:
            if self._client is None:
                self._client = client_class(self.address, headers={"Authorization": f"Bearer {self._token}"},
                                            verify=self._verify)
            return call(self._client)
        except (requests.RequestException, ConnectionError) as exc:
            raise BurstError(f"cannot reach the Ray cluster at {self.address} to {what}: {self._clean(exc)}",
                             hint="check burst.address, the network and that the cluster is up") from exc
        except (RuntimeError, ValueError, OSError) as exc:  # Ray's AuthenticationError is a RuntimeError
            raise BurstError(f"the Ray cluster at {self.address} refused to {what}: {self._clean(exc)}",
                             hint=_refusal_hint(exc)) from exc

    def _clean(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())[:300]
        return text.replace(self._token, "<token>") if self._token else text


def _listed(client: Any, submission_id: str) -> bool:
    try:
        client.get_job_info(submission_id)
    except RuntimeError as exc:  # Ray's client raises this for every refusal; a missing job is its 404
        if "status code 404" in str(exc):
            return False
        raise
    return True


@functools.cache
def _client_class() -> type:
    """JobSubmissionClient with a timeout on every request (requests has none by default)."""
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:
        raise BurstError("bursting needs Ray, which is not installed", hint="install the extra: pip install "
                         "'appliance[burst]'") from exc
    logging.getLogger("ray").setLevel(logging.WARNING)  # not a line per package uploaded: we say what was sent

    class TimedClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", (10, 600))  # connect, then read: package uploads can take minutes
            return super()._do_request(method, endpoint, **kwargs)

    return TimedClient


def _refusal_hint(exc: BaseException) -> str:
    text = str(exc)
    if "Authentication" in text or "401" in text or "403" in text:
        return "the cluster wants Ray's auth token: check the token file (burst.token_file)"
    return "see the cluster's dashboard for this job"


def read_token(settings: BurstSettings, state_dir: Path) -> str:
    """Ray's auth token: the systemd credential, else burst.token_file, else <state_dir>/burst.token (0600)."""
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    path = Path(credentials) / TOKEN_CREDENTIAL if credentials else None
    if path is None or not path.is_file():
        path = settings.token_file or state_dir / TOKEN_CREDENTIAL
        try:
            if path.stat().st_mode & 0o077:
                raise BurstError(f"the Ray token file {path} is readable by group or others",
                                 hint=f"run 'chmod 600 {path}'")
        except FileNotFoundError:
            raise BurstError(f"no Ray auth token: no systemd credential {TOKEN_CREDENTIAL} and no file {path}",
                             hint="put the cluster's token (ray get-auth-token) in that file, mode 0600") from None
    token = path.read_text().strip()
    if not token:
        raise BurstError(f"the Ray token file {path} is empty", hint="put the cluster's token in it")
    return token


def connect(settings: BurstSettings, state_dir: Path) -> RayBackend:
    if not settings.enabled:
        raise BurstError("no Ray cluster is configured for bursts",
                         hint="set burst.address (APPLIANCE_BURST_ADDRESS) to the cluster's dashboard URL")
    return RayBackend(settings, read_token(settings, state_dir))


def suggestion(settings: BurstSettings, eta_s: float | None) -> str | None:
    """A note for a local run predicted to take long, when a cluster is configured; None otherwise."""
    if not settings.enabled or eta_s is None or eta_s <= settings.suggest_after_minutes * 60:
        return None
    return (f"this run is predicted to take about {eta_s / 60:.0f} more minutes here; the Ray cluster at "
            f"{settings.address} may be faster: run it again with --burst (job parameter burst=true), if the "
            "dataset's residency allows it")


# -- one burst, from the local side --------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What to train: the same inputs as a local run."""

    dataset: str
    base_dir: Path
    params: TrainParams
    device: str | None
    job_id: str
    actor: str | None = None


class Watcher(Protocol):
    """The local job around a burst: where its state, progress and logs go, and whether it should stop."""

    def submitted(self, submission: dict[str, str]) -> None: ...
    def progress(self, data: dict[str, Any]) -> None: ...
    def log(self, line: str) -> None: ...
    def should_stop(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def resumable(self, run_id: str) -> None: ...  # the failed burst's last checkpoint, as this unfinished run


def attempt(store: Store, settings: Settings, request: Request, watcher: Watcher,
            submission: dict[str, str] | None = None, fallback: bool | None = None) -> str | None:
    """Burst the request: the local run's id, or None when the burst failed and may fall back to training here
    (from the run the watcher was told is resumable, if the job sent its last checkpoint home).

    A residency refusal never falls back: it is a policy answer, and training here instead is the submitter's call.
    """
    fallback = settings.burst.fallback_local if fallback is None else fallback
    try:
        backend = connect(settings.burst, settings.state_dir)
        return train(store, backend, request, watcher, submission, settings.burst.poll_s)
    except ResidencyRefused:
        raise
    except BurstError as exc:
        if not fallback:
            raise
        audit.record(store, "burst.fallback", request.job_id, actor=request.actor, reason=exc.message)
        watcher.log(f"burst failed: {exc.message}; training here instead")
        return None


def train(store: Store, backend: Backend, request: Request, watcher: Watcher,
          submission: dict[str, str] | None = None, poll_s: float = 2.0) -> str:
    """Run the request on the cluster (or follow the submission an earlier attempt made); the local run's id."""
    if submission is not None and (done := runs.trained_at(store, submission["where"])):
        return done  # an earlier attempt stored the result, then stopped before the job noted it
    if submission is None:
        submission = submit(store, backend, request, watcher)
    status, logs = follow(store, backend, submission, watcher, request.actor, poll_s)
    if status == "SUCCEEDED":
        return receive(store, backend, submission, request, logs)
    failure = f"the Ray job {submission['id']} {status.lower()}: {_failure(logs)}"
    run_id = bring_checkpoint_home(store, submission, request, logs, watcher)
    _forget(backend, submission["id"])  # its lines are in this job's log already
    if run_id is not None:
        raise BurstError(failure, hint=f"its last checkpoint is run {run_id} here: 'appliance train --resume "
                                       f"{run_id}' goes on from it")
    raise BurstError(failure, hint="the cluster's log of it is in this job's log")


def check_residency(store: Store, version: datasets.DatasetVersion, cluster: str, actor: str | None) -> None:
    """Refuse, and audit the refusal, unless the dataset version may leave this box."""
    if version.residency == datasets.BURST_ALLOWED:
        return
    with audit.operation(store, "burst.refused", version.ref, actor=actor, dataset=version.id, cluster=cluster,
                         residency=version.residency):
        raise ResidencyRefused(
            f"dataset {version.ref} is {version.residency}: it may not leave this box, so it cannot burst to "
            f"{cluster}",
            hint=f"train it here (without --burst), or have an operator allow it: "
                 f"'appliance data residency {version.name} {datasets.BURST_ALLOWED}'")


def submit(store: Store, backend: Backend, request: Request, watcher: Watcher) -> dict[str, str]:
    """Seal the inputs under a new key, record what leaves, and submit the job; the submission to keep."""
    version = datasets.get(store, request.dataset)
    check_residency(store, version, backend.address, request.actor)
    key = new_key()
    submission_id = f"appliance-{request.job_id}-{secrets.token_hex(4)}"
    content_bytes, content = datasets.content_chunks(store, version)
    base = archive.pack(sorted(_base_files(request.base_dir)))
    # The parameters the caller named, so that the cluster's plan settles the rest as this box's would (mode, window).
    manifest = json.dumps({"dataset": asdict(version), "params": request.params.model_dump(exclude_unset=True),
                           "device": request.device, "submission": submission_id}).encode()
    submission = {"id": submission_id, "cluster": backend.address, "where": backend.where(submission_id),
                  "key": base64.b64encode(keys.wrap(store.master, key, _key_aad(submission_id))).decode()}
    watcher.submitted(submission)  # before anything leaves: a later attempt finds the remote job again
    with scratch.folder("appliance-burst-sealed-") as folder:  # sealed bytes only, mode 0700
        packages, sent = _packages(folder, submission_id, key,
                                   {"manifest": manifest, "dataset": content, "base": base})
        audit.record(store, "burst.send", submission_id, actor=request.actor, cluster=backend.address,
                     dataset=version.id, dataset_ref=version.ref, dataset_bytes=content_bytes,
                     base_model=hashlib.sha256(base).hexdigest(), base_model_path=str(request.base_dir),
                     base_model_bytes=len(base), sealed_bytes=sent, job=request.job_id)
        with audit.operation(store, "burst.submit", submission_id, actor=request.actor, cluster=backend.address):
            backend.submit(submission_id, packages, key)
    watcher.log(f"burst: submitted {version.ref} as Ray job {submission_id} to {backend.address} "
                f"({(sent / 2**20):.1f} MiB sealed)")
    return submission


def follow(store: Store, backend: Backend, submission: dict[str, str], watcher: Watcher, actor: str | None,
           poll_s: float) -> tuple[str, str]:
    """Poll the remote job into the watcher until it ends: how it ended (SUCCEEDED, FAILED or STOPPED) and its
    whole log."""
    submission_id, seen, last_answer, status = submission["id"], 0, time.monotonic(), ""
    while True:
        if watcher.should_stop():
            if watcher.cancelled():
                cancel(store, backend, submission_id, actor)
            raise Interrupted
        try:
            status, text = backend.status(submission_id), backend.logs(submission_id)
        except BurstError as exc:
            if time.monotonic() - last_answer > UNREACHABLE_GRACE_S:
                raise
            watcher.progress({"stage": "burst", "remote": "unreachable", "error": exc.message})
            _nap(watcher, poll_s)
            continue
        last_answer = time.monotonic()
        complete, newline, _partial = text[seen:].rpartition("\n")
        seen += len(complete) + len(newline)
        for line in complete.split("\n") if newline else []:
            _relay(line, watcher)
        watcher.progress({"stage": "burst", "remote": status, "submission": submission_id})
        if status in TERMINAL:
            return status, text
        _nap(watcher, poll_s)


def bring_checkpoint_home(store: Store, submission: dict[str, str], request: Request, logs: str,
                          watcher: Watcher) -> str | None:
    """The last checkpoint a failed job printed, as a new unfinished local run that training here resumes (the
    watcher is told its id); None when it printed none. One that does not check out is left, and said so."""
    lines = [found for line in logs.split("\n") if (found := marked(line, CHECKPOINT)) is not None]
    if not lines:
        return None
    submission_id = submission["id"]
    key = keys.unwrap(store.master, base64.b64decode(submission["key"]), _key_aad(submission_id))
    try:
        with audit.operation(store, "burst.checkpoint", submission_id, actor=request.actor,
                             cluster=submission["cluster"], trained_on=submission["where"]) as details:
            try:
                sealed = [base64.b64decode(line, validate=True) for line in lines]
            except ValueError as exc:
                raise BurstError(f"the last checkpoint of Ray job {submission_id} is corrupted: {exc}") from exc
            run_id, step = adopt(store, unseal(key, "checkpoint", sealed), request.dataset, request.base_dir,
                                 request.device, watcher.log)
            details.update(run=run_id, step=step)
    except ApplianceError as exc:
        watcher.log(f"burst: the job's last checkpoint was not kept: {exc.message}")
        return None
    watcher.log(f"burst: the Ray job's last checkpoint, at step {step}, is run {run_id} here")
    watcher.resumable(run_id)
    return run_id


def checkpoint_archive(saved: bytes, params: dict[str, Any], epochs: list[runs.Epoch]) -> bytes:
    """What a restart of the run elsewhere needs: its checkpoint, (settled) parameters and epochs so far."""
    record = {"params": params, "epochs": [asdict(epoch) for epoch in epochs]}
    return archive.pack([("checkpoint.pt", saved), ("record.json", json.dumps(record).encode())])


def adopt(store: Store, packed: bytes, dataset: str, base_dir: Path, device: str | None,
          log: engine.LogFn | None = None, group: parallel.Group | None = None) -> tuple[str, int]:
    """A checkpoint_archive as a new run on this store, which engine.resume continues: its id and step. Ray Train's
    restarted rank 0 adopts its own this way, and the appliance a failed job's."""
    from appliance.train import engine

    try:
        files = archive.unpack(packed)
        record, saved = json.loads(files["record.json"]), files["checkpoint.pt"]
    except (KeyError, ValueError) as exc:
        raise BurstError(f"a checkpoint from the cluster cannot be read: {exc}") from exc
    run_id = engine.create(store, dataset=dataset, base_dir=base_dir, params=TrainParams.stored(record["params"]),
                           device=device, log=log, group=group)
    step = engine.adopt_checkpoint(store, run_id, saved)
    for epoch in record["epochs"]:
        runs.record_epoch(store, run_id, runs.Epoch(**epoch))
    return run_id, step


def receive(store: Store, backend: Backend, submission: dict[str, str], request: Request, logs: str) -> str:
    """Check the result in the job's log and store it as a finished local run that names where it trained."""
    submission_id = submission["id"]
    key = keys.unwrap(store.master, base64.b64decode(submission["key"]), _key_aad(submission_id))
    version = datasets.get(store, request.dataset)
    with audit.operation(store, "burst.result", submission_id, actor=request.actor, cluster=submission["cluster"],
                         trained_on=submission["where"]) as details:
        meta, bundle = _opened_result(key, logs, submission_id)
        details.update(model=meta["sha256"], model_bytes=len(bundle))
        blob_id = blobs.put(store, bundle)
        run_id = runs.create(store, dataset_id=version.id, base_model=str(request.base_dir), task=version.task,
                             params=meta["params"], plan=meta["plan"], trained_on=submission["where"])
        for epoch in meta["epochs"]:
            runs.record_epoch(store, run_id, runs.Epoch(**epoch))
        runs.finish(store, run_id, blob_id, meta["metrics"],
                    runs.Outcome(**meta["outcome"]) if meta.get("outcome") else None)
        details["run"] = run_id
    _forget(backend, submission_id)
    return run_id


def _forget(backend: Backend, submission_id: str) -> None:
    """Drop the ended job from the cluster: its record holds the key."""
    try:
        backend.forget(submission_id)
    except BurstError as exc:
        log.warning("burst: %s", exc.message)


def cancel(store: Store, backend: Backend, submission_id: str, actor: str | None) -> None:
    with audit.operation(store, "burst.cancel", submission_id, actor=actor, cluster=backend.address):
        backend.cancel(submission_id)


def _opened_result(key: bytes, logs: str, submission_id: str) -> tuple[dict[str, Any], bytes]:
    lines = [found for line in logs.split("\n") if (found := marked(line, RESULT)) is not None]
    if not lines:
        raise BurstError(f"Ray job {submission_id} succeeded but its log holds no result",
                         hint="the cluster may have rotated the job's log away; run the job again")
    try:
        files = archive.unpack(unseal(key, "result", (base64.b64decode(line, validate=True) for line in lines)))
        meta, bundle = json.loads(files["result.json"]), files["bundle.tar"]
    except (ApplianceError, KeyError, ValueError) as exc:
        raise BurstError(f"the result of Ray job {submission_id} is corrupted: {getattr(exc, 'message', exc)}",
                         hint="nothing was stored; run the job again") from exc
    if hashlib.sha256(bundle).hexdigest() != meta.get("sha256"):
        raise BurstError(f"the result of Ray job {submission_id} is corrupted: the model does not match its hash",
                         hint="nothing was stored; run the job again")
    return meta, bundle


def _relay(line: str, watcher: Watcher) -> None:
    """One line of the remote log: progress to the events, the sealed result kept back, the rest as a log line."""
    body = _RAY_PREFIX.sub("", line, count=1)
    if _sealed(line) or body.startswith(("Traceback (most recent call last)", " ", "\t")):
        return  # a traceback (Ray's, of a worker that stopped) stays in the cluster's log: its last line says why
    if (progress := marked(line, PROGRESS)) is not None:
        with contextlib.suppress(ValueError, TypeError):  # one we cannot read is shown as a log line
            watcher.progress({**json.loads(progress), "where": "ray"})
            return
    watcher.log(f"ray: {line}"[:2000])


def _failure(logs: str) -> str:
    """Why the remote job failed: its first own message (the cause, before what followed from it), else the last
    lines of its log."""
    for line in logs.split("\n"):
        if (message := marked(line, ERROR)) is not None:
            return message
    tail = [line for line in logs.split("\n") if line.strip() and not _sealed(line)][-3:]
    return " | ".join(tail)[-500:] or "no log"


def marked(line: str, marker: str) -> str | None:
    """What follows the marker on a line of the job's log, printed by the entrypoint or, behind the prefix Ray puts
    on what a worker prints ("(RayTrainWorker pid=7) "), by a training worker; None on any other line."""
    line = _RAY_PREFIX.sub("", line, count=1)
    return line.split(" ", 1)[1] if line.startswith(marker + " ") else None


def _sealed(line: str) -> bool:
    return marked(line, RESULT) is not None or marked(line, CHECKPOINT) is not None


_RAY_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)]*\)(\x1b\[[0-9;]*m)? ")


def _nap(watcher: Watcher, seconds: float) -> None:
    """Wait between polls, but notice a stop within a fraction of a second."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not watcher.should_stop():
        time.sleep(min(0.2, seconds))


def _packages(folder: Path, submission_id: str, key: bytes, payloads: dict[str, sealing.Source]
              ) -> tuple[list[Path], int]:
    """The payloads sealed into package folders of at most PACKAGE_BYTES each, a chunk at a time (the dataset's
    comes from the store as it is sealed, so a large one is never in memory whole); the folders and bytes
    written."""
    packages: list[Path] = []
    sent = filled = 0
    for label, data in payloads.items():
        for index, chunk in enumerate(seal(key, label, data)):
            if not packages or filled + len(chunk) > PACKAGE_BYTES:
                packages.append(folder / package_name(submission_id, len(packages)))
                packages[-1].mkdir()
                (packages[-1] / "__init__.py").write_text("")
                filled = 0
            (packages[-1] / f"{label}.{index:06d}").write_bytes(chunk)
            filled += len(chunk)
            sent += len(chunk)
    return packages, sent


def package_name(submission_id: str, index: int) -> str:
    """A py_modules folder name: an importable, unique package name."""
    return f"appliance_payload_{submission_id.replace('-', '_')}_{index}"


def _base_files(base_dir: Path) -> Iterator[tuple[str, bytes]]:
    for path in sorted(base_dir.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            yield path.name, path.read_bytes()


def _key_aad(submission_id: str) -> bytes:
    return b"appliance/burst-key|" + submission_id.encode()

