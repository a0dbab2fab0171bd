"""A burst job on the Ray cluster: `python -m appliance.operations.burst_remote SUBMISSION_ID PACKAGES`.

Ray runs this as the job's entrypoint, with this package and the sealed payload packages on its path (runtime_env
py_modules) and the per-job key in the job's metadata, which Ray hands to the entrypoint alone (in the job config
of its environment). The entrypoint takes the key out of that before it joins the cluster, opens the manifest and
asks Ray Train for the workers it names (params.workers, one by default; a GPU each where the device is cuda): a
TorchTrainer whose workers Ray places and joins in one torch process group. Each worker asks the job's small actor
for the key (memory to memory, never a file or an environment), opens the payloads in memory and adopts the
dataset into a scratch store (a temporary directory whose key exists only in that process; the base model is
reached through memfds), so no plaintext of the dataset, the base model or the trained model is written to a
node's disk. Rank 0 runs the same training engine as the appliance as the lead of that group (train/parallel.py),
the others assist it. Progress goes to the log as JSON lines; rank 0 seals the trained bundle and the run's record
under the job key and hands them to the entrypoint through a small actor (ciphertext only in Ray's object store),
which prints them to the log. Each checkpoint goes to Ray Train, which starts the workers again from it after one
dies, and to that actor: when the workers die more often than Ray Train starts them again, the entrypoint prints
the last one, so that training goes on from it on the appliance. On a refusal the failing process prints one
ERROR line with the reason and the job exits 1.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance import store
from appliance.core import archive, config, scratch
from appliance.core.errors import ApplianceError, BurstError
from appliance.data import datasets
from appliance.operations import burst
from appliance.train.params import TrainParams

if TYPE_CHECKING:  # torch loads in the workers only, not in the entrypoint
    from appliance.train import engine, parallel

PROGRESS_EVERY_S = 1.0
RESTARTS = 2  # times Ray Train starts the workers again after one dies, each from the last checkpoint


def main(argv: list[str]) -> int:
    key = _take_key()
    submission_id, count = argv[0], int(argv[1])
    print(f"appliance {Path(burst.__file__).parent} on {os.uname().nodename}, job {submission_id}", flush=True)
    try:
        manifest = _open(key, submission_id, count, "manifest")[0]
        sealed = _fit(submission_id, count, manifest, key)
    except ApplianceError as exc:
        print(f"{burst.ERROR} {exc.message}", flush=True)
        return 1
    _print_sealed(burst.RESULT, sealed)
    return 0


def _take_key() -> bytes:
    """The job's key, out of the job config Ray put in this process's environment, which is written back without
    it: ray.init() registers that config with the cluster, and no child process of this one inherits the key."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    job_config = json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}")
    key = base64.b64decode((job_config.get("metadata") or {}).pop(burst.KEY_METADATA, ""))
    os.environ[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps(job_config)
    return key


def _print_sealed(marker: str, chunks: list[bytes]) -> None:
    for chunk in chunks:
        sys.stdout.write(f"{marker} {base64.b64encode(chunk).decode()}\n")
    sys.stdout.flush()


def _fit(submission_id: str, count: int, manifest: dict[str, Any], key: bytes) -> list[bytes]:
    """Ray Train's run of the workers; the sealed result chunks that rank 0 left in the mailbox."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    workers, unit = TrainParams.parse(manifest["params"]).workers or 1, "GPU" if manifest["device"] == "cuda" else "CPU"
    ray.init()  # the job's cluster, from RAY_ADDRESS
    has = ray.cluster_resources().get(unit, 0)
    if has < workers:  # Ray Train would wait for them without end
        raise BurstError(f"{workers} training workers were asked for, a {unit} each, but the Ray cluster has"
                         f" {has:g}: ask for {int(has)} or fewer (--workers), or add nodes to the cluster")
    mailbox = ray.remote(num_cpus=0)(Mailbox).remote(key)
    with scratch.folder("appliance-burst-run-") as storage:  # Ray Train's own records
        trainer = TorchTrainer(
            _worker, train_loop_config={"submission": submission_id, "packages": count, "mailbox": mailbox},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=unit == "GPU"),
            run_config=RunConfig(name=submission_id, storage_path=storage, failure_config=FailureConfig(RESTARTS)))
        try:
            trainer.fit()
        except Exception as exc:  # Ray Train's errors have no common base: a worker's, the controller's, ...
            _print_sealed(burst.CHECKPOINT, ray.get(mailbox.last_checkpoint.remote()))  # none before the first
            raise BurstError(f"the training failed on the cluster: {_last_line(exc)}") from exc
    sealed: list[bytes] = ray.get(mailbox.take.remote())
    if not sealed:
        raise BurstError("the training ended on the cluster without a result")
    return sealed


class Mailbox:
    """Where the workers find the job's key, and rank 0 leaves the sealed result and each sealed checkpoint for the
    entrypoint (a Ray actor: one in each job, outliving the workers)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._sealed: list[bytes] = []
        self._checkpoint: list[bytes] = []

    def job_key(self) -> bytes:
        return self._key

    def put(self, sealed: list[bytes]) -> None:
        self._sealed = sealed

    def take(self) -> list[bytes]:
        return self._sealed

    def keep(self, checkpoint: list[bytes]) -> None:
        self._checkpoint = checkpoint

    def last_checkpoint(self) -> list[bytes]:
        return self._checkpoint


def _worker(settings: dict[str, Any]) -> None:
    """One Ray Train worker: rank 0 leads the training and seals its result, the others assist."""
    import ray
    import ray.train

    from appliance.train import engine, parallel

    key = ray.get(settings["mailbox"].job_key.remote())
    context = ray.train.get_context()
    group = parallel.Group(context.get_world_rank(), context.get_world_size(), context.get_local_rank())
    try:
        manifest, content, base = _open(key, settings["submission"], settings["packages"], "manifest", "dataset",
                                        "base")
        with _scratch(archive.unpack(base)) as (opened, base_dir):
            version = datasets.adopt(opened, datasets.DatasetVersion(**manifest["dataset"]), content)
            if group.leads:
                result = _lead(opened, version, base_dir, manifest, group, key, settings["mailbox"])
                ray.get(settings["mailbox"].put.remote(list(burst.seal(key, "result", result, burst.LINE_BYTES))))
            else:
                engine.assist(group, datasets.load(opened, version), base_dir,
                              _reporter(opened, key, settings["mailbox"]))
    except ApplianceError as exc:  # its scratch store is gone already
        print(f"{burst.ERROR} {exc.message}", flush=True)
        os._exit(1)  # Ray Train ends the other workers at once; the line above is the reason, not a traceback
    ray.train.report({})  # every worker reports as often as the others: this once, at the end


def _lead(opened: store.Store, version: datasets.DatasetVersion, base_dir: Path, manifest: dict[str, Any],
          group: parallel.Group, key: bytes, mailbox: Any) -> bytes:
    """The same engine as on the appliance, on the scratch store, from Ray Train's last checkpoint of this job when
    its workers were started again; the result as a tar of record and bundle."""
    import ray.train

    from appliance.store import blobs
    from appliance.train import engine, runs

    last = 0.0

    def progress(report: engine.Progress) -> None:
        nonlocal last
        if time.monotonic() - last >= PROGRESS_EVERY_S or report.phase == "evaluate":
            last = time.monotonic()
            print(f"{burst.PROGRESS} {json.dumps({'stage': 'train', **asdict(report)})}", flush=True)

    checkpointed = _reporter(opened, key, mailbox)

    def say(line: str) -> None:
        print(line, flush=True)

    if (restart := ray.train.get_checkpoint()) is None:
        done = engine.start(opened, dataset=version.ref, base_dir=base_dir,
                            params=TrainParams.parse(manifest["params"]), device=manifest["device"],
                            progress=progress, log=say, group=group, on_checkpoint=checkpointed)
    else:
        with restart.as_directory() as folder:
            packed = burst.unseal(key, "checkpoint", [path.read_bytes() for path in sorted(Path(folder).iterdir())])
        run_id, step = burst.adopt(opened, packed, version.ref, base_dir, manifest["device"], say, group)
        say(f"a worker stopped: the workers started again, from the checkpoint at step {step}")
        done = engine.resume(opened, run_id, progress=progress, log=say, group=group, on_checkpoint=checkpointed)
    run = runs.get(opened, done.run_id)
    bundle = blobs.read(opened, done.model_blob)
    record = {"params": run.params, "plan": run.plan, "metrics": done.metrics, "steps": done.steps,
              "epochs": [asdict(epoch) for epoch in runs.epochs(opened, run.id)],
              "outcome": asdict(done.outcome) if done.outcome else None,
              "sha256": hashlib.sha256(bundle).hexdigest()}
    print(f"trained: {done.steps} steps, " + ", ".join(f"{k} {v:.4f}" for k, v in done.metrics.items()), flush=True)
    return archive.pack([("result.json", json.dumps(record).encode()), ("bundle.tar", bundle)])


def _reporter(opened: store.Store, key: bytes, mailbox: Any) -> engine.CheckpointFn:
    """Each checkpoint to Ray Train as well (every worker reports it, as Ray Train wants), and to the mailbox: the
    lead's, sealed, with what a restart needs besides (burst.checkpoint_archive; the best weights so far are in the
    checkpoint), in chunks that fit a line of the job's log."""
    import ray.train

    from appliance.train import runs

    def report(done: engine.Checkpointed | None) -> None:
        if done is None:
            ray.train.report({})
            return
        packed = burst.checkpoint_archive(done.saved, runs.get(opened, done.run_id).params,
                                          runs.epochs(opened, done.run_id))
        sealed = list(burst.seal(key, "checkpoint", packed, burst.LINE_BYTES))
        ray.get(mailbox.keep.remote(sealed))
        with scratch.folder("appliance-burst-checkpoint-") as folder:
            for index, chunk in enumerate(sealed):
                Path(folder, f"{index:06d}").write_bytes(chunk)
            ray.train.report({}, checkpoint=ray.train.Checkpoint.from_directory(folder))

    return report


@contextmanager
def _scratch(base: dict[str, bytes]) -> Iterator[tuple[store.Store, Path]]:
    """A store whose key lives in this process only, and the base model's files in memory."""
    with scratch.folder("appliance-burst-scratch-") as folder, archive.memory_folder(base) as base_dir:
        settings = config.Settings(state_dir=folder, key_file=folder / "no.key", config_file=None,
                                   base_model=base_dir)
        with store.scratch(settings) as opened:
            yield opened, base_dir


def _open(key: bytes, submission_id: str, count: int, *labels: str) -> list[Any]:
    """The payloads by label, unsealed in memory: the manifest (checked to be this job's) as a dict, the rest bytes."""
    chunks = _payload_chunks(submission_id, count)
    opened: list[Any] = [burst.unseal(key, label, chunks.get(label, [])) for label in labels]
    manifest = json.loads(opened[0])
    if manifest["submission"] != submission_id:
        raise BurstError("the payload belongs to another job")
    return [manifest, *opened[1:]]


def _payload_chunks(submission_id: str, count: int) -> dict[str, list[bytes]]:
    """Every sealed chunk shipped in the payload packages, by label, in order."""
    files: dict[str, list[Path]] = {}
    for index in range(count):
        spec = importlib.util.find_spec(burst.package_name(submission_id, index))
        if spec is None or not spec.submodule_search_locations:
            raise BurstError(f"payload package {index} of {count} is missing from the job's runtime environment")
        for path in Path(next(iter(spec.submodule_search_locations))).iterdir():
            label, _, number = path.name.partition(".")
            if number.isdigit():
                files.setdefault(label, []).append(path)
    return {label: [path.read_bytes() for path in sorted(paths, key=lambda p: p.name)]
            for label, paths in files.items()}


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1][:500] if lines else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
