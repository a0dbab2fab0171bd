"""Bursting training to a real single-node Ray head on loopback, with token authentication on.

The head is started once for the session (tests/ray_head.py, `ray start --head --num-cpus 2`: two training
workers). Without the burst extra (ray) these tests skip and say so.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance import registry, store
from appliance.compliance import evidence
from appliance.core import archive, config
from appliance.core.errors import BurstError, ResidencyRefused
from appliance.data import datasets
from appliance.operations import burst, burst_remote, jobs, jobspec, pipeline, worker
from appliance.store import Store, audit, blobs, keys, lifecycle
from appliance.train import engine, runs
from appliance.train.params import TrainParams
from tests.conftest import run_cli, write_tickets
from tests.daemon import Daemon
from tests.ray_head import RayHead, free_ports, local_head

TINY = TrainParams(epochs=2, learning_rate=3e-3, batch_size=16, max_length=32, seed=3)


def _ray_missing() -> str | None:
    try:
        import ray.job_submission  # noqa: F401
    except ImportError as exc:
        return f"the burst extra is not installed (pip install '.[burst]'): {exc}"
    return None


needs_ray = pytest.mark.skipif(_ray_missing() is not None, reason=_ray_missing() or "")


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayHead]:
    """One Ray head for the session: loopback, two CPUs (two training workers), token auth."""
    if _ray_missing():
        pytest.skip(_ray_missing())
    with local_head(num_cpus=2) as head:
        yield head


@pytest.fixture
def burst_settings(ray_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    monkeypatch.setenv("APPLIANCE_BURST_ADDRESS", ray_head.address)
    monkeypatch.setenv("APPLIANCE_BURST_TOKEN_FILE", str(ray_head.token_file))
    monkeypatch.setenv("APPLIANCE_BURST_POLL_S", "0.5")
    return config.load()


@dataclass
class Recorder:
    """A watcher that keeps what the burst reported."""

    stop: bool = False
    cancel: bool = False
    submission: dict[str, str] | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    resumable_run: str | None = None

    def submitted(self, submission: dict[str, str]) -> None:
        self.submission = submission

    def progress(self, data: dict[str, Any]) -> None:
        self.reports.append(data)

    def log(self, line: str) -> None:
        self.lines.append(line)

    def should_stop(self) -> bool:
        return self.stop

    def cancelled(self) -> bool:
        return self.cancel

    def resumable(self, run_id: str) -> None:
        self.resumable_run = run_id


class KeepingLogs(burst.RayBackend):
    """The real backend, keeping the last log text it read (the test tampers with a copy of it)."""

    last_logs = ""

    def logs(self, submission_id: str) -> str:
        self.last_logs = super().logs(submission_id)
        return self.last_logs


def _tickets(opened: Store, tmp_path: Path, residency: str) -> datasets.DatasetVersion:
    return datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv", per_class=20), name="tickets",
                                residency=residency)


def _records(opened: Store, action: str) -> list[dict[str, Any]]:
    return audit.rows(opened, action=action)


# -- residency, without a cluster ------------------------------------------------------


def test_residency_is_set_at_import_and_changed_by_an_audited_command(opened: Store, tmp_path: Path) -> None:
    version = _tickets(opened, tmp_path, datasets.LOCAL_ONLY)
    assert version.residency == "local-only"
    changed = datasets.set_residency(opened, "tickets", "burst-allowed", actor="user:alice")
    assert [v.residency for v in changed] == ["burst-allowed"]
    record = _records(opened, "dataset.residency")[-1]
    assert record["actor"] == "user:alice" and json.loads(record["details"])["changed"] == {"tickets:1": "local-only"}
    with pytest.raises(Exception, match="unknown residency"):
        datasets.set_residency(opened, "tickets", "anywhere")
    assert _records(opened, "dataset.residency")[-1]["outcome"] == "failed"
    with pytest.raises(Exception, match="residency must be"):  # the schema holds it too (migration 6)
        opened.db.execute("UPDATE datasets SET residency = 'anywhere'")


def test_a_local_only_dataset_is_refused_before_anything_leaves(opened: Store, tmp_path: Path, tiny_base: Path) -> None:
    version = _tickets(opened, tmp_path, datasets.LOCAL_ONLY)
    backend = burst.RayBackend(config.BurstSettings(address="http://127.0.0.1:9"), token="unused")
    request = burst.Request("tickets", tiny_base, TINY, None, "job1", "user:alice")
    with pytest.raises(ResidencyRefused, match="tickets:1 is local-only: it may not leave this box") as refused:
        burst.train(opened, backend, request, Recorder())
    assert "appliance data residency tickets burst-allowed" in (refused.value.hint or "")
    record = _records(opened, "burst.refused")[-1]
    assert record["outcome"] == "failed" and json.loads(record["details"])["dataset"] == version.id
    assert not _records(opened, "burst.send")  # nothing left


def test_the_token_file_must_be_private(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token-value")
    token.chmod(0o644)
    with pytest.raises(BurstError, match="readable by group or others") as refused:
        burst.connect(config.BurstSettings(address="http://127.0.0.1:9", token_file=token), tmp_path)
    assert "secret-token-value" not in str(refused.value) + str(refused.value.hint)


def test_sealed_chunks_refuse_a_change_a_swap_and_a_cut() -> None:
    key, data = burst.new_key(), os.urandom(10_000)
    chunks = list(burst.seal(key, "dataset", data, chunk_bytes=4096))
    assert len(chunks) == 3 and burst.unseal(key, "dataset", chunks) == data
    changed = [chunks[0][:-1] + bytes([chunks[0][-1] ^ 1]), *chunks[1:]]
    for bad, problem in ((changed, "chunk 0 of the dataset does not authenticate"),
                         ([chunks[1], chunks[0], chunks[2]], "chunk 0 of the dataset does not authenticate"),
                         (chunks[:2], "cut short"),
                         (chunks + chunks[-1:], "data after its last chunk")):
        with pytest.raises(BurstError, match=problem):
            burst.unseal(key, "dataset", bad)
    with pytest.raises(BurstError, match="does not authenticate"):  # another payload's chunks, or another key
        burst.unseal(key, "base", chunks)
    with pytest.raises(BurstError, match="does not authenticate"):
        burst.unseal(burst.new_key(), "dataset", chunks)


def test_a_sealed_chunk_is_framed_as_the_format_says() -> None:
    """The job on the cluster and the appliance must agree: the format, spelled out without the code."""
    key, data = burst.new_key(), os.urandom(5000)
    for index, chunk in enumerate(burst.seal(key, "dataset", data, chunk_bytes=4096)):
        flag, nonce, sealed = chunk[:1], chunk[1:13], chunk[13:]
        assert flag == (b"\x01" if index == 1 else b"\x00")
        aad = b"appliance/burst|dataset|%d|%s" % (index, flag.hex().encode())
        assert AESGCM(key).decrypt(nonce, sealed, aad) == data[index * 4096:(index + 1) * 4096]


def test_burst_settings_and_job_flags_are_checked(monkeypatch: pytest.MonkeyPatch, opened: Store) -> None:
    monkeypatch.setenv("APPLIANCE_BURST_ADDRESS", "ray.corp:8265")
    with pytest.raises(Exception, match="'burst.address' in the environment is 'ray.corp:8265'"):
        config.load()
    with pytest.raises(Exception, match='burst: "yes" is not true or false'):
        jobspec.parse("train", {"dataset": "tickets", "burst": "yes"})


# -- against the Ray head ---------------------------------------------------------------


@pytest.mark.slow
@needs_ray
def test_a_burst_trains_on_the_cluster_and_brings_the_model_home(
    burst_settings: config.Settings, tiny_base: Path, tmp_path: Path, ray_head: RayHead
) -> None:
    with lifecycle.init(burst_settings) as opened:
        version = _tickets(opened, tmp_path, datasets.BURST_ALLOWED)
        backend = KeepingLogs(burst_settings.burst, burst.read_token(burst_settings.burst, burst_settings.state_dir))
        request = burst.Request("tickets", tiny_base, TINY, None, "job2", "user:alice")
        watcher = Recorder()
        run_id = burst.train(opened, backend, request, watcher, poll_s=0.5)

        run = runs.get(opened, run_id)
        where = f"ray://{ray_head.address.removeprefix('http://')}/{watcher.submission['id']}"
        assert run.status == "finished" and run.trained_on == where and run.dataset_id == version.id
        assert len(runs.epochs(opened, run_id)) == TINY.epochs and run.metrics["accuracy"] > 0
        registered = pipeline.register_run(opened, run_id, "tickets")
        assert registered.lineage(opened)["trained_on"] == where
        bundle = blobs.read(opened, run.model_blob)
        assert "model.safetensors" in archive.unpack(bundle)

        # The remote ran the shipped package, reported training progress, and the job is gone from the cluster.
        assert any("runtime_resources" in line and "py_modules_files" in line for line in watcher.lines)
        assert any(r.get("stage") == "train" and r.get("where") == "ray" for r in watcher.reports), "\n".join(watcher.lines)
        with pytest.raises(RuntimeError):
            ray_head.client().get_job_info(watcher.submission["id"])

        # What left, to where and when, is on record; the key is in no log line.
        sent = json.loads(_records(opened, "burst.send")[-1]["details"])
        packed_base = archive.pack(sorted((p.name, p.read_bytes()) for p in tiny_base.iterdir() if p.is_file()))
        assert sent["dataset"] == version.id and sent["cluster"] == ray_head.address
        assert sent["base_model"] == hashlib.sha256(packed_base).hexdigest()
        assert sent["base_model_bytes"] == len(packed_base) and sent["sealed_bytes"] > sent["base_model_bytes"]
        result = _records(opened, "burst.result")[-1]
        assert result["outcome"] == "ok" and json.loads(result["details"])["trained_on"] == where
        assert all(watcher.submission["key"] not in line for line in watcher.lines)
        # Nor in any file on the cluster's node after the job: Ray's runtime-env agent logs a job's variables.
        key = keys.unwrap(opened.master, base64.b64decode(watcher.submission["key"]),
                          burst._key_aad(watcher.submission["id"]))
        holding = [path for path in ray_head.tmp.parent.rglob("*") if path.is_file() and not path.is_symlink()
                   and any(form in path.read_bytes() for form in (key, base64.b64encode(key), key.hex().encode()))]
        assert not holding, holding

        # The compliance report lists it as a transfer off the box, and the run it came back as in the lineage.
        facts = evidence.collect(opened)
        (transfer,) = facts["transfers"]
        assert (transfer["submission"], transfer["to"], transfer["dataset"]) == (watcher.submission["id"],
                                                                                  ray_head.address, version.ref)
        assert transfer["last_step"] == "burst.result ok" and transfer["sealed_bytes"] == sent["sealed_bytes"]
        assert facts["datasets"][0]["used_by"]["bursts"] == [watcher.submission["id"]]
        assert [(r["id"], r["trained_on"]) for r in facts["lineage"]["runs"]] == [(run_id, where)]

        # The same result, corrupted on the way: refused, and nothing stored.
        before = len(runs.list_runs(opened))
        lines = backend.last_logs.split("\n")
        frame = next(i for i, line in enumerate(lines) if line.startswith(burst.RESULT))
        raw = bytearray(base64.b64decode(lines[frame].split(" ", 1)[1]))
        raw[-5] ^= 1
        lines[frame] = f"{burst.RESULT} {base64.b64encode(bytes(raw)).decode()}"
        with pytest.raises(BurstError, match="is corrupted: chunk 0 of the result does not authenticate"):
            burst.receive(opened, backend, watcher.submission, request, "\n".join(lines))
        cut = "\n".join(line for i, line in enumerate(backend.last_logs.split("\n")) if i != frame)
        with pytest.raises(BurstError, match="is corrupted"):
            burst.receive(opened, backend, watcher.submission, request, cut)
        assert len(runs.list_runs(opened)) == before
        assert [r["outcome"] for r in _records(opened, "burst.result")][-2:] == ["failed", "failed"]


@pytest.mark.slow
@needs_ray
def test_a_burst_trains_data_parallel_on_two_ray_train_workers_as_one_process_would(
    burst_settings: config.Settings, tiny_base: Path, tmp_path: Path
) -> None:
    params = TrainParams(mode="full", epochs=8, learning_rate=3e-3, batch_size=16, max_length=32, patience=8, seed=3)
    with lifecycle.init(burst_settings) as opened:
        datasets.import_file(opened, write_tickets(tmp_path / "tickets.csv", per_class=40), name="tickets",
                             residency=datasets.BURST_ALLOWED)
        here = engine.start(opened, dataset="tickets", base_dir=tiny_base, params=params)
        backend = burst.connect(burst_settings.burst, burst_settings.state_dir)
        watcher = Recorder()
        run_id = burst.train(opened, backend, burst.Request("tickets", tiny_base, params.changed(workers=2), None,
                                                            "job3", "user:alice"), watcher, poll_s=0.5)

        run = runs.get(opened, run_id)
        assert run.status == "finished" and run.plan["workers"] == 2
        assert any("world_rank=1" in line for line in watcher.lines)  # Ray Train placed a second worker
        assert runs.epochs(opened, run_id)[-1].step == here.steps  # the same batches, each split in two
        assert here.metrics["accuracy"] > 0.8  # it learnt, so the two can be compared
        assert run.metrics["accuracy"] == pytest.approx(here.metrics["accuracy"], abs=0.1), (run.metrics, here.metrics)
        assert sum(r.get("phase") == "evaluate" for r in watcher.reports) == params.epochs  # rank 0's, once each


# Two workers, twelve epochs of seconds, checkpoints by steps (not minutes): a run to kill workers in.
KILLED = TrainParams(mode="full", epochs=12, learning_rate=3e-3, batch_size=16, max_length=32, patience=12, seed=3,
                     workers=2, checkpoint_every=2)


@dataclass
class KillingWorkers(Recorder):
    """A watcher that kills a Ray Train worker (SIGKILL) once the remote run has passed its second epoch, and
    again, up to `kills` times in all, each time the workers have started again."""

    kills: int = 1
    killed: list[int] = field(default_factory=list)

    def progress(self, data: dict[str, Any]) -> None:
        super().progress(data)
        restarts = sum("the workers started again" in line for line in self.lines)
        if len(self.killed) < self.kills and len(self.killed) == restarts and data.get("epoch", 0) >= 3:
            worker = next(p for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(
                p.info["cmdline"] or []))
            worker.kill()
            self.killed.append(worker.pid)


@pytest.mark.slow
@needs_ray
def test_a_worker_killed_mid_burst_is_started_again_from_the_last_checkpoint(
    burst_settings: config.Settings, tiny_base: Path, tmp_path: Path, ray_head: RayHead
) -> None:
    params = KILLED
    with lifecycle.init(burst_settings) as opened:
        _tickets(opened, tmp_path, datasets.BURST_ALLOWED)
        backend = burst.connect(burst_settings.burst, burst_settings.state_dir)
        watcher = KillingWorkers()
        run_id = burst.train(opened, backend, burst.Request("tickets", tiny_base, params, None, "job5", "user:alice"),
                             watcher, poll_s=0.5)

        assert len(watcher.killed) == 1
        restarted = [line for line in watcher.lines if "the workers started again, from the checkpoint at step" in line]
        assert len(restarted) == 1, watcher.lines
        history = runs.epochs(opened, run_id)
        assert [row.epoch for row in history] == list(range(1, params.epochs + 1))  # none lost, none twice
        assert runs.get(opened, run_id).status == "finished"
    # The killed worker's scratch store (sealed dataset and model, under a key that died with it) went with the
    # workers started again, not kept in the node's temporary folder for good.
    assert not list(ray_head.tmp.glob("appliance-*")), sorted(path.name for path in ray_head.tmp.iterdir())


@pytest.mark.slow
@needs_ray
def test_a_burst_whose_workers_keep_dying_sends_its_last_checkpoint_home_and_training_goes_on_here(
    burst_settings: config.Settings, tiny_base: Path, tmp_path: Path
) -> None:
    params = KILLED
    with lifecycle.init(burst_settings) as opened:
        _tickets(opened, tmp_path, datasets.BURST_ALLOWED)
        watcher = KillingWorkers(kills=burst_remote.RESTARTS + 1)  # one more death than Ray Train starts again
        request = burst.Request("tickets", tiny_base, params, None, "job6", "user:alice")
        assert burst.attempt(opened, burst_settings, request, watcher, fallback=True) is None

        run_id = watcher.resumable_run
        assert run_id is not None, "\n".join(watcher.lines[-30:])
        assert len(watcher.killed) == burst_remote.RESTARTS + 1
        brought = json.loads(_records(opened, "burst.checkpoint")[-1]["details"])
        assert brought["run"] == run_id and brought["trained_on"].endswith(watcher.submission["id"])
        kept = runs.epochs(opened, run_id)
        assert 2 <= len(kept) < params.epochs and runs.get(opened, run_id).status != "finished"  # killed in epoch 3
        assert brought["step"] >= kept[-1].step  # the checkpoint is at or past the last epoch it records

        done = engine.resume(opened, run_id)  # what the job does next, here
        assert done.status == "finished" and runs.get(opened, run_id).trained_on is None
        assert [row.epoch for row in runs.epochs(opened, run_id)] == list(range(1, params.epochs + 1))
        assert any("training here instead" in line for line in watcher.lines)
        here = engine.start(opened, dataset="tickets", base_dir=tiny_base, params=params)  # never interrupted
        assert done.metrics["accuracy"] == pytest.approx(here.metrics["accuracy"], abs=0.1), (done.metrics,
                                                                                            here.metrics)


@pytest.mark.slow
@needs_ray
def test_more_workers_than_the_cluster_has_fail_the_burst_at_once_with_the_reason(
    burst_settings: config.Settings, tiny_base: Path, tmp_path: Path
) -> None:
    with lifecycle.init(burst_settings) as opened:
        _tickets(opened, tmp_path, datasets.BURST_ALLOWED)
        backend = burst.connect(burst_settings.burst, burst_settings.state_dir)
        request = burst.Request("tickets", tiny_base, TINY.changed(workers=4), None, "job4", "user:alice")
        with pytest.raises(BurstError, match="4 training workers were asked for, a CPU each, but the Ray cluster has"
                                             " 2: ask for 2 or fewer"):
            burst.train(opened, backend, request, Recorder(), poll_s=0.5)


@pytest.mark.slow
@needs_ray
def test_a_cluster_that_is_down_fails_the_job_and_fallback_trains_here_in_the_time_left(
    opened: Store, tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="appliance.operations")
    monkeypatch.setattr(worker, "_on_sigterm", lambda _stop: None)  # the job runs in pytest's process: keep its signals
    token = tmp_path / "token"
    token.write_text("t0ken")
    token.chmod(0o600)
    down = f"http://127.0.0.1:{free_ports(1)[0]}"
    opened.settings = dataclasses.replace(opened.settings, base_model=tiny_base,
                                          burst=config.BurstSettings(address=down, token_file=token))
    _tickets(opened, tmp_path, datasets.BURST_ALLOWED)
    params = {"dataset": "tickets", "burst": True, "params": {"epochs": 1, "batch_size": 16, "max_length": 32}}

    failed = _run_job(opened, params)
    assert failed.status == "failed" and f"cannot reach the Ray cluster at {down}" in failed.error
    assert runs.list_runs(opened) == [] and registry.list_versions(opened) == []  # local state intact
    assert _records(opened, "burst.submit")[-1]["outcome"] == "failed"

    fell_back = _run_job(opened, {**params, "fallback": True})
    assert fell_back.status == "finished"
    assert runs.get(opened, fell_back.result["run_id"]).trained_on is None
    assert "cannot reach" in json.loads(_records(opened, "burst.fallback")[-1]["details"])["reason"]

    # A job restarted 40 s into a burst of its 60 s: the burst fails, and training here has the 20 s left.
    job = jobs.submit(opened, jobspec.parse("train", {**params, "fallback": True,
                                                      "params": {**params["params"], "max_minutes": 1}}))
    owner = jobs.claim(opened, job.id)
    assert owner is not None
    jobs.save_state(opened, job.id, owner, burst_began=time.time() - 40)
    assert worker._run_claimed(opened, job.id, owner, None) == 0
    late = jobs.get(opened, job.id)
    assert runs.get(opened, late.result["run_id"]).params["max_minutes"] == pytest.approx(20 / 60, abs=2 / 60)
    said = [record.getMessage() for record in caplog.records]
    assert any(re.match(r"the burst took 4\ds: training here has the 1\ds left of its 1m 00s$", line) for line in said
               ), said


@pytest.mark.slow
@needs_ray
def test_a_remote_failure_fails_the_cli_run_with_the_reason(
    burst_settings: config.Settings, tmp_path: Path, tiny_base: Path
) -> None:
    broken = tmp_path / "broken-base"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_base / "config.json").read_text())  # no tokenizer, no weights
    run_cli("keys", "init", check=True)
    run_cli("data", "import", str(write_tickets(tmp_path / "t.csv", per_class=20)), "--name", "tickets",
            "--residency", "burst-allowed", check=True)
    result = run_cli("train", "--data", "tickets", "--burst", "--base", str(broken), "--epochs", "1")
    assert result.returncode == 1, result.stderr
    assert "error: the Ray job appliance-cli-" in result.stderr and " failed: " in result.stderr, result.stderr
    assert "weights" in result.stderr.split(" failed: ", 1)[1]  # the remote's own reason: the base has none
    assert "Traceback" not in result.stderr
    assert run_cli("runs", "list").stdout.startswith("no training runs")


@pytest.mark.slow
@needs_ray
def test_cancel_of_a_burst_job_stops_the_ray_job(burst_env: None, daemon: Daemon, ray_head: RayHead) -> None:
    assert daemon.env["APPLIANCE_BURST_ADDRESS"] == ray_head.address
    source = daemon.settings.state_dir.parent / "tickets.csv"
    with daemon.api() as api:
        imported = daemon.upload(source, name="tickets", residency="burst-allowed")
        assert imported.status_code == 201 and imported.json()["residency"] == "burst-allowed", imported.text
        answer = api.post("/v1/jobs", json={"kind": "train", "params": {
            "dataset": "tickets", "burst": True,
            "params": {"epochs": 500, "patience": 500, "batch_size": 16, "max_length": 32}}})
    job_id = answer.json()["id"]
    daemon.wait(lambda: any(e.kind == "progress" and e.data.get("where") == "ray" for e in _job_events(daemon, job_id)),
                240, "the remote job never reported training progress")
    assert daemon.cli("jobs", "cancel", job_id).returncode == 0
    assert daemon.ended(job_id, 120)["status"] == "cancelled"
    shown = daemon.job(job_id)["state"]["burst"]
    submission = shown["id"]
    assert "key" not in shown and shown["cluster"] == ray_head.address  # the data key stays in the job's own row
    with store.open(daemon.settings) as opened:
        assert jobs.get(opened, job_id).state["burst"]["key"]
    client = ray_head.client()
    daemon.wait(lambda: client.get_job_status(submission).value == "STOPPED", 60, "the Ray job was not stopped")
    with store.open(daemon.settings) as opened:
        assert _records(opened, "burst.cancel")[-1]["outcome"] == "ok"


@pytest.fixture
def burst_env(ray_head: RayHead, monkeypatch: pytest.MonkeyPatch) -> None:
    """Burst settings in the environment; asked for before `daemon`, so the daemon inherits them."""
    monkeypatch.setenv("APPLIANCE_BURST_ADDRESS", ray_head.address)
    monkeypatch.setenv("APPLIANCE_BURST_TOKEN_FILE", str(ray_head.token_file))
    monkeypatch.setenv("APPLIANCE_BURST_POLL_S", "0.5")


# -- helpers -------------------------------------------------------------------------------


def _run_job(opened: Store, params: dict[str, Any]) -> jobs.Job:
    """A train job run in this process, as the daemon's worker would run it."""
    job = jobs.submit(opened, jobspec.parse("train", params))
    owner = jobs.claim(opened, job.id)
    assert owner is not None
    assert worker._run_claimed(opened, job.id, owner, None) in (0, 1)
    return jobs.get(opened, job.id)


def _job_events(running: Daemon, job_id: str) -> list[Any]:
    from appliance import store
    from appliance.store import events

    with store.open(running.settings) as opened:
        return events.after(opened, 0, job_id, limit=100_000)
