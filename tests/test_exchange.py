"""Models out in open formats: export archives that run without the appliance, signed, encrypted and audited."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyrage
import pytest
from PIL import Image

from appliance import inference, pixels, registry, store
from appliance.access import users
from appliance.core import archive
from appliance.core.config import Settings
from appliance.core.errors import RegistryError
from appliance.data import datasets
from appliance.operations import jobs, pipeline
from appliance.registry import exchange
from appliance.store import Store, anchor, audit, blobs
from appliance.train import engine
from appliance.train.params import TrainParams
from tests import debian
from tests.conftest import run_cli
from tests.daemon import TINY, Daemon, submit
from tests.test_pipeline import FAST
from tests.train.test_images import write_shapes

README = Path(__file__).resolve().parent.parent / "README.md"
TEXTS = ["where is my parcel", "I was charged twice"]  # the README's snippet's


def snippet(name: str) -> str:
    """The README's Python block after <!-- name -->: what a user copies."""
    found = re.search(rf"<!-- {name} -->\n```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert found, f"the README has no {name} snippet"
    return found.group(1)


def age_tool(tmp_path: Path) -> str:
    """The reference age command (Go), installed or unpacked from Debian's package: what a recipient runs."""
    return shutil.which("age") or str(debian.unpacked(("age",), tmp_path / "age-deb") / "usr" / "bin" / "age")


def run_outside(code: str, folder: Path) -> list[list[float]]:
    """code in a fresh interpreter that cannot see the appliance's source (-I: no script dir, no PYTHON* variables),
    in folder; the logits it ends with. It fails if anything imported the appliance."""
    check = "\nimport sys; assert not any(m.split('.')[0] == 'appliance' for m in sys.modules)\n" \
            "print('LOGITS', __import__('json').dumps(logits.tolist()))\n"
    done = subprocess.run([sys.executable, "-I", "-c", code + check], cwd=folder, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("LOGITS ", 1)[1])


@pytest.fixture
def optimised(opened: Store, tickets: str, tiny_base: Path) -> registry.ModelVersion:
    result = engine.start(opened, dataset=tickets, base_dir=tiny_base, params=FAST)
    pipeline.register_run(opened, result.run_id, "tickets")
    return pipeline.optimize_version(opened, "tickets:1")


def served_logits(opened: Store, version: registry.ModelVersion, variant: str,
                  examples: list[str] | list[bytes] = TEXTS) -> np.ndarray:
    servable = inference.load_ir(blobs.read(opened, version.variants[variant].blob_id),
                                 config={"INFERENCE_PRECISION_HINT": "f32"})  # as an exported graph computes
    return inference.predict(servable.compiled, servable.reader, examples)


def test_onnx_and_openvino_exports_run_as_the_readme_shows_without_the_appliance_and_predict_as_it_serves(
    opened: Store, optimised: registry.ModelVersion, tmp_path: Path
) -> None:
    identity, age = pyrage.x25519.Identity.generate(), age_tool(tmp_path)
    (tmp_path / "key.txt").write_text(f"# created: by age-keygen\n{identity}\n")
    for fmt, code, variant in (("onnx", snippet("export-onnx"), "fp32"),
                               ("openvino", snippet("export-onnx").rsplit("logits =", 1)[0] + snippet(
                                   "export-openvino"), optimised.chosen)):
        exported = exchange.export(opened, "tickets", fmt, "recipient", actor="user:alice")
        sealed = exchange.protect(exported.archive, recipient=str(identity.to_public()))
        assert exported.archive not in sealed and sealed.startswith(exchange.AGE_MAGIC)
        folder = tmp_path / fmt
        folder.mkdir()
        (folder / "tickets.tar.age").write_bytes(sealed)
        subprocess.run([age, "-d", "-i", str(tmp_path / "key.txt"), "-o", "tickets.tar", "tickets.tar.age"],
                       cwd=folder, check=True, timeout=60)  # the recipient's side, as the README shows

        logits = np.array(run_outside(code, folder))
        assert np.allclose(logits, served_logits(opened, optimised, variant), atol=1e-3), fmt  # ONNX is the FP32

        verified = exchange.verify(sealed, identity=str(identity))
        assert verified.encrypted and verified.sha256 == exported.sha256
        card = verified.card
        assert card["model"] == "tickets:2" and card["format"] == fmt and card["variant"] == (
            "torch" if fmt == "onnx" else optimised.chosen)
        assert card["labels"] == inference.load_ir(blobs.read(opened, optimised.serving_variant().blob_id)).labels
        assert card["dataset"]["ref"] == "tickets:1" and len(card["dataset"]["sha256"]) == 64
        assert card["guard"] == {"chosen": optimised.chosen, "reason": optimised.reason}
        assert card["base_model"]["licence"].startswith("unknown")  # the tiny test base has no model card
        assert card["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
        assert verified.checked.public_key == anchor.public_key(opened)

        record = audit.rows(opened, action="model.export")[-1]
        details = json.loads(record["details"])
        assert (record["actor"], record["object"], record["outcome"]) == ("user:alice", "tickets:2", "ok")
        assert details["sha256"] == exported.sha256 and details["format"] == fmt
        assert details["protection"] == "recipient"


def test_a_hugging_face_export_loads_with_transformers(opened: Store, optimised: registry.ModelVersion,
                                                        tmp_path: Path) -> None:
    exported = exchange.export(opened, "tickets:1", "hf", "plaintext")
    (tmp_path / "tickets.tar").write_bytes(exported.archive)
    code = snippet("export-onnx").split("tokenizer =", 1)[0] + (
        "import torch, transformers\n"
        "model = transformers.AutoModelForSequenceClassification.from_pretrained('tickets/model').eval()\n"
        "tokenizer = transformers.AutoTokenizer.from_pretrained('tickets/model')\n"
        f"logits = model(**tokenizer({TEXTS!r}, padding=True, truncation=True,"
        " max_length=card['max_length'], return_tensors='pt')).logits.detach().numpy()\n")
    logits = np.array(run_outside(code, tmp_path))
    assert np.allclose(logits, served_logits(opened, optimised, "fp32"), atol=1e-3)
    unpacked = [path for path in (tmp_path / "tickets").rglob("*") if path.is_file()]
    assert unpacked and {stat.S_IMODE(path.stat().st_mode) for path in unpacked} == {0o600}  # not others' to read


def test_a_mean_pooled_model_exports_as_a_sentence_transformers_model_whose_embedding_is_its_logits(
        opened: Store, tickets: str, tiny_sentence_base: Path, tmp_path: Path) -> None:
    """A sentence encoder's fine-tuned model has no Hugging Face sequence classifier to be; it leaves as the
    sentence-transformers layout, which that library loads and reads as the appliance serves it."""
    result = engine.start(opened, dataset=tickets, base_dir=tiny_sentence_base, params=FAST)
    pipeline.register_run(opened, result.run_id, "tickets")
    version = pipeline.optimize_version(opened, "tickets:1")
    exported = exchange.export(opened, "tickets", "hf", "plaintext")
    assert {"model/modules.json", "model/1_Pooling/config.json", "model/2_Dense/model.safetensors"} <= set(
        archive.unpack(exported.archive))
    (tmp_path / "tickets.tar").write_bytes(exported.archive)
    logits = np.array(run_outside(snippet("export-sentence-transformers"), tmp_path))
    assert np.allclose(logits, served_logits(opened, version, "fp32"), atol=1e-3)
    assert exchange.verify(exported.archive).card["format"] == "hf"


def test_an_image_model_exports_as_onnx_and_openvino_that_read_photos_as_the_readme_shows(
        opened: Store, settings: Settings, tmp_path: Path) -> None:
    folder = write_shapes(tmp_path / "shapes", per_class=4)
    datasets.import_file(opened, folder, name="parts", task=datasets.IMAGE)
    trained = engine.start(opened, dataset="parts", base_dir=settings.image_base_model,
                           params=TrainParams(epochs=1, batch_size=8, seed=1))
    pipeline.register_run(opened, trained.run_id, "parts")
    optimised = pipeline.optimize_version(opened, "parts:1", pipeline.OptimizeOptions(int8=False))
    photos = [(folder / "circle" / "1.jpg").read_bytes(), pixels.encoded(np.asarray(
        Image.open(folder / "triangle" / "2.jpg").convert("RGB")))]
    served = served_logits(opened, optimised, "fp32", photos)

    openvino = snippet("export-onnx-image").replace(
        'logits = onnxruntime.InferenceSession("parts/model/model.onnx").run(["logits"], {"pixel_values": batch})[0]',
        'import openvino\nlogits = openvino.Core().compile_model("parts/model/model.xml", "CPU", '
        '{"INFERENCE_PRECISION_HINT": "f32"})({"pixel_values": batch})["logits"]')  # f32 as served_logits' is
    for fmt, code in (("onnx", snippet("export-onnx-image")), ("openvino", openvino)):
        exported = exchange.export(opened, "parts", fmt, "plaintext")
        (tmp_path / fmt).mkdir()
        (tmp_path / fmt / "parts.tar").write_bytes(exported.archive)
        (tmp_path / fmt / "part-17.jpg").write_bytes(photos[0])
        (tmp_path / fmt / "part-18.png").write_bytes(photos[1])
        assert np.allclose(run_outside(code, tmp_path / fmt), served, atol=2e-3), fmt
        card = exchange.verify(exported.archive).card
        assert card["task"] == datasets.IMAGE and card["inputs"] == [pixels.INPUT] and "max_length" not in card
        assert card["preprocessing"] | {"how": ""} == {"image_size": 224, "mean": [127 / 255] * 3,
                                                      "std": [128 / 255] * 3, "centre": 0.875, "how": ""}
        assert "tokenizer" not in archive.unpack(exported.archive)["README.txt"].decode()
    with pytest.raises(RegistryError, match="an image model, which has no Hugging Face form"):
        exchange.export(opened, "parts", "hf", "plaintext")


def test_a_changed_cut_or_foreign_archive_is_refused_saying_what(opened: Store, optimised: registry.ModelVersion
                                                                 ) -> None:
    exported = exchange.export(opened, "tickets", "openvino", "plaintext")
    files = archive.unpack(exported.archive)
    assert exchange.verify(exported.archive, public_key=anchor.public_key(opened)).checked.trusted == \
        "the public key given"

    changed = dict(files)
    weights = bytearray(changed["model/model.bin"])
    weights[len(weights) // 2] ^= 1
    changed["model/model.bin"] = bytes(weights)
    with pytest.raises(RegistryError, match="model/model.bin: changed after the archive was signed"):
        exchange.verify(archive.pack(sorted(changed.items())))
    with pytest.raises(RegistryError, match="extra.txt: not covered by the signature"):
        exchange.verify(archive.pack(sorted({**files, "extra.txt": b"trust me"}.items())))
    with pytest.raises(RegistryError, match="not a readable tar|listed in the signed manifest but missing"):
        exchange.verify(exported.archive[: len(exported.archive) // 2])
    with pytest.raises(RegistryError, match="not the key given"):
        exchange.verify(exported.archive, public_key="11" * 32)

    sealed = exchange.protect(exported.archive, passphrase="correct horse")
    with pytest.raises(RegistryError, match="is encrypted"):
        exchange.verify(sealed)
    with pytest.raises(RegistryError, match="cannot be decrypted: it was not exported to this identity or passphrase"):
        exchange.verify(sealed, passphrase="wrong horse")
    for cut in (sealed[: len(sealed) // 2], sealed[:60]):  # in the payload, in the header: not a wrong passphrase
        with pytest.raises(RegistryError, match="the archive is damaged or cut short"):
            exchange.verify(cut, passphrase="correct horse")
    assert exchange.verify(sealed, passphrase="correct horse").sha256 == exported.sha256
    with pytest.raises(RegistryError, match="is not an age X25519 recipient"):
        exchange.protect(exported.archive, recipient="age1nonsense")


def test_verify_and_import_refuse_a_pipe_or_an_outsized_archive_at_once(tmp_path: Path) -> None:
    """A pipe would hang them (a timeout, not a hang, if it does) and a huge file fill the memory: every file named
    is refused before it is read, saying why. The huge one is encrypted, so import too reads it here."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    huge, sealed = tmp_path / "huge.tar.age", tmp_path / "sealed.tar.age"
    huge.write_bytes(exchange.AGE_MAGIC)
    os.truncate(huge, 3 * 2**30)  # sparse: nothing more is written
    sealed.write_bytes(exchange.AGE_MAGIC + b"-> X25519 ...\n")
    for args, code, said in (
        (("models", "verify", str(pipe)), 1, "the archive "),
        (("models", "verify", str(sealed), "--identity", str(pipe)), 1, "the age identity file "),
        (("models", "verify", str(sealed), "--checkpoint", str(pipe)), 2, "the audit checkpoint "),
    ):
        refused = run_cli(*args, timeout=60)
        assert refused.returncode == code and f"{said}{pipe} is a named pipe (FIFO), not a regular file" in refused.stderr
    for args in (("models", "verify", str(huge)), ("models", "import", str(huge), "--name", "m", "--dataset", "d")):
        refused = run_cli(*args, timeout=60)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert f"the archive {huge} holds 3,221,225,472 bytes, over its limit of 2,147,483,648" in refused.stderr
        assert "daemon.max_upload_mb (2048 MiB)" in refused.stderr


def test_import_refuses_a_pipe_before_it_opens_it(opened: Store, tickets: str, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.tar")
    refused = run_cli("models", "import", str(tmp_path / "model.tar"), "--name", "m", "--dataset", tickets, timeout=60)
    assert refused.returncode == 1 and f"{tmp_path / 'model.tar'} is a named pipe (FIFO), not a regular file" in \
        refused.stderr


def test_a_base_models_card_that_is_a_pipe_is_not_read(tmp_path: Path) -> None:
    """An export reads the licence from the base model's README.md: a pipe there must not hang it (a timeout if it
    does), in a process of its own."""
    os.mkfifo(tmp_path / "README.md")
    code = "import sys; from pathlib import Path; from appliance.registry import exchange; " \
           "print(exchange.base_licence(Path(sys.argv[1])))"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.startswith("unknown: ")


def test_an_admin_exports_through_the_daemon_and_the_archive_is_handed_over_once(daemon: Daemon,
                                                                                   tmp_path: Path) -> None:
    assert daemon.upload(tmp_path / "tickets.csv", name="tickets").status_code == 201
    job_id = submit(daemon, "train", {"dataset": "tickets", "params": TINY})
    assert daemon.ended(job_id)["status"] == "finished"
    with store.open(daemon.settings) as opened:
        _, operator = users.add(opened, "ops", "operator")
    export = {"kind": "export", "params": {"version": "tickets", "format": "onnx", "protection": "plaintext"}}
    with daemon.api(operator) as api:
        refused = api.post("/v1/jobs", json=export)
    assert refused.status_code == 403 and "needs admin" in refused.text
    with store.open(daemon.settings) as opened:  # refused by what its body asks for, and audited as any refusal
        assert [(row["actor"], row["object"]) for row in audit.rows(opened, action="api.refused")] == [
            ("user:ops", "POST /v1/jobs")]

    identity = pyrage.x25519.Identity.generate()
    (tmp_path / "key.txt").write_text(f"# created by age-keygen\n{identity}\n")
    out = tmp_path / "tickets.tar.age"
    made = daemon.cli("models", "export", "tickets", "--format", "onnx", "--out", str(out),
                      "--recipient", str(identity.to_public()))
    assert made.returncode == 0, made.stderr
    assert out.stat().st_mode & 0o777 == 0o600 and not list(tmp_path.glob(".*.partial"))
    checked = daemon.cli("models", "verify", str(out), "--identity", str(tmp_path / "key.txt"))
    assert checked.returncode == 0, checked.stderr
    assert "archive OK: tickets:1 (text-classification, onnx, variant torch)" in checked.stdout

    again = daemon.cli("models", "export", "tickets", "--format", "onnx", "--out", str(out), "--plaintext")
    assert again.returncode == 2 and "exists: an archive is never written over a file" in again.stderr
    wrong = daemon.cli("models", "export", "tickets", "--format", "hf", "--out", str(tmp_path / "x"),
                       "--recipient", "age1nope")
    assert wrong.returncode == 1 and "is not an age X25519 recipient" in wrong.stderr
    assert "Traceback" not in again.stderr + wrong.stderr

    def with_passphrase(passphrase: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=300,
                              env={**daemon.env, "APPLIANCE_EXPORT_PASSPHRASE": passphrase}, check=False)

    short = with_passphrase("too short", "models", "export", "tickets", "--format", "hf", "--out", str(tmp_path / "s"))
    assert short.returncode == 1 and "shorter than 12 characters" in short.stderr
    sealed = tmp_path / "tickets-hf.tar.age"
    made = with_passphrase("correct horse battery", "models", "export", "tickets", "--format", "hf", "--out",
                           str(sealed))
    assert made.returncode == 0, made.stderr
    checked = with_passphrase("correct horse battery", "models", "verify", str(sealed), "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["card"]["format"] == "hf", checked.stderr

    with store.open(daemon.settings) as opened:
        exported, _hf = sorted((job for job in jobs.list_jobs(opened, None) if job.kind == "export"),
                               key=lambda job: job.submitted_at)
        downloads = audit.rows(opened, action="model.export.download")
        record = json.loads(audit.rows(opened, action="model.export")[0]["details"])
    assert record["protection"] == "recipient" and record["sha256"] == exported.result["sha256"]
    assert json.loads(downloads[0]["details"])["job"] == exported.id
    with daemon.api() as api:
        twice = api.get(f"/v1/exports/{exported.id}")
    assert twice.status_code == 400 and "downloaded already" in twice.text

    with daemon.api() as api:
        waiting = api.post("/v1/jobs", json=export).json()["id"]
    assert daemon.ended(waiting)["status"] == "finished"
    with daemon.api(operator) as api:  # its archive waits for an admin: an operator neither cancels nor deletes it
        assert api.delete(f"/v1/jobs/{waiting}").status_code == 403
        assert api.post(f"/v1/jobs/{waiting}/cancel").status_code == 403
    with daemon.api() as api:
        assert api.get(f"/v1/jobs/{waiting}").json()["status"] == "finished"
        assert api.delete(f"/v1/jobs/{waiting}").status_code == 200
    daemon.stop()  # which writes the count of refusals repeated within their window
    with store.open(daemon.settings) as opened:
        deleted = json.loads(audit.rows(opened, action="job.delete")[-1]["details"])
        refusals = [json.loads(row["details"]) for row in audit.rows(opened, action="api.refused")
                    if row["actor"] == "user:ops"]
    assert deleted["archive"] == "deleted, never downloaded"
    assert sum(refusal.get("repeated", 1) for refusal in refusals) == 3  # on the record, the repeats as a count
