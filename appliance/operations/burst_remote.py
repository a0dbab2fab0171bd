"""A burst job on the Ray cluster: `python -m appliance.operations.burst_remote SUBMISSION_ID PACKAGES`.

Ray runs this as the job's entrypoint, with this package and the sealed payload
packages on its path (runtime_env py_modules) and the per-job key in its environment.
It takes the key out of the environment before anything else starts, opens the
payloads in memory, and runs the same training engine as the appliance on a scratch
store (a temporary directory whose key exists only in this process; the base model
is reached through memfds), so no plaintext of the dataset, the base model or the
trained model is written to the node's disk. Progress goes to the log as JSON lines;
the trained bundle and the run's record go to the log sealed under the job key. On a
refusal it prints one ERROR line with the reason and exits 1.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from appliance import store
from appliance.core import archive, config
from appliance.core.errors import ApplianceError, BurstError
from appliance.data import datasets
from appliance.operations import burst
from appliance.train.params import TrainParams

PROGRESS_EVERY_S = 1.0


def main(argv: list[str]) -> int:
    key = base64.b64decode(os.environ.pop(burst.KEY_ENV, ""))  # no child process inherits it
    submission_id, count = argv[0], int(argv[1])
    print(f"appliance {Path(burst.__file__).parent} on {os.uname().nodename}, job {submission_id}", flush=True)
    try:
        chunks = _payload_chunks(submission_id, count)
        manifest = json.loads(burst.unseal(key, "manifest", chunks.get("manifest", [])))
        if manifest["submission"] != submission_id:
            raise BurstError("the payload belongs to another job")
        content = burst.unseal(key, "dataset", chunks.get("dataset", []))
        base = archive.unpack(burst.unseal(key, "base", chunks.get("base", [])))
        result = _train(manifest, content, base)
    except ApplianceError as exc:
        print(f"{burst.ERROR} {exc.message}", flush=True)
        return 1
    for sealed in burst.seal(key, "result", result, burst.RESULT_LINE_BYTES):
        sys.stdout.write(f"{burst.RESULT} {base64.b64encode(sealed).decode()}\n")
    sys.stdout.flush()
    return 0


def _train(manifest: dict, content: bytes, base: dict[str, bytes]) -> bytes:
    """The same engine as on the appliance, on a scratch store; the result as a tar of record and bundle."""
    from appliance.store import blobs
    from appliance.train import engine, runs

    last = 0.0

    def progress(report: engine.Progress) -> None:
        nonlocal last
        if time.monotonic() - last >= PROGRESS_EVERY_S or report.phase == "evaluate":
            last = time.monotonic()
            print(f"{burst.PROGRESS} {json.dumps({'stage': 'train', **asdict(report)})}", flush=True)

    with tempfile.TemporaryDirectory(prefix="appliance-burst-") as scratch, archive.memory_folder(base) as base_dir:
        settings = config.Settings(state_dir=Path(scratch), key_file=Path(scratch, "no.key"), config_file=None,
                                   base_model=base_dir)
        with store.scratch(settings) as opened:
            version = datasets.adopt(opened, datasets.DatasetVersion(**manifest["dataset"]), content)
            done = engine.start(opened, dataset=version.ref, base_dir=base_dir,
                                params=TrainParams.parse(manifest["params"]), device=manifest["device"],
                                progress=progress, log=lambda line: print(line, flush=True))
            run = runs.get(opened, done.run_id)
            bundle = blobs.read(opened, done.model_blob)
            record = {"params": run.params, "plan": run.plan, "metrics": done.metrics, "steps": done.steps,
                      "epochs": [asdict(epoch) for epoch in runs.epochs(opened, run.id)],
                      "outcome": asdict(done.outcome) if done.outcome else None,
                      "sha256": hashlib.sha256(bundle).hexdigest()}
    print(f"trained: {done.steps} steps, " + ", ".join(f"{k} {v:.4f}" for k, v in done.metrics.items()), flush=True)
    return archive.pack([("result.json", json.dumps(record).encode()), ("bundle.tar", bundle)])


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
