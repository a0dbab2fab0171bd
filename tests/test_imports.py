"""Models in from elsewhere: Hugging Face folders, OpenVINO IRs and ONNX graphs, and the appliance's own export
archives, checked, measured on a dataset here and stored like trained versions; bad ones refused with nothing kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from appliance import inference, pixels, registry
from appliance.core import archive
from appliance.core.errors import ArtifactError, RegistryError
from appliance.data import datasets, sources
from appliance.operations import imports, pipeline
from appliance.registry import exchange
from appliance.store import Store, audit, blobs, signed
from appliance.train import bundle as bundles
from appliance.train import runs
from tests.conftest import Trained
from tests.daemon import Daemon
from tests.train.test_images import write_shapes

TEXTS = ["where is my parcel", "I was charged twice", "the app crashes again", "Rückerstattung bitte, danke"]


def hf_folder(trained: Trained, folder: Path) -> Path:
    """The trained classifier as a plain Hugging Face checkpoint: what save_pretrained writes, and the tokenizer."""
    folder.mkdir(parents=True)
    for name, data in archive.unpack(trained.bundle).items():
        if name != "appliance.json":
            (folder / name).write_bytes(data)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tickets classifier\n")
    return folder


def optimum_ir(hf: Path, folder: Path) -> Path:
    """An OpenVINO IR exported by optimum-intel from the checkpoint, with the tokenizer's files copied beside it,
    as its documentation shows."""
    from optimum.intel import OVModelForSequenceClassification

    OVModelForSequenceClassification.from_pretrained(hf, export=True, compile=False).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (hf / name).exists():
            shutil.copy(hf / name, folder / name)
    return folder


OPTIMUM_ONNX = Path(sys.prefix) / "optimum-onnx"  # optimum's ONNX exporter, in a folder of its own (installer/venv.sh)


def optimum_onnx(hf: Path, folder: Path) -> Path:
    """The checkpoint exported to ONNX by optimum's exporter, in a process of its own (it pins an older
    transformers), as its documentation shows: model.onnx with config.json and the tokenizer's files."""
    assert OPTIMUM_ONNX.is_dir(), f"{OPTIMUM_ONNX} is missing: run installer/venv.sh"
    code = ("import sys; from optimum.exporters.onnx import main_export; "
            "main_export(sys.argv[1], output=sys.argv[2], task='text-classification', do_validation=False)")
    done = subprocess.run([sys.executable, "-c", code, str(hf), str(folder)], capture_output=True, text=True,
                          timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(OPTIMUM_ONNX), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def torch_logits(trained: Trained, texts: list[str]) -> np.ndarray:
    model, tokenizer, _manifest = bundles.load_text_classifier(archive.unpack(trained.bundle))
    return inference.predict(bundles.TorchRunner(model), tokenizer, texts)


def served_logits(store: Store, version: registry.ModelVersion, texts: list[str]) -> np.ndarray:
    servable = inference.load_ir(blobs.read(store, version.serving_variant().blob_id))
    return inference.predict(servable.compiled, servable.reader, texts)


def lend(store: Store) -> imports.Lend:
    return lambda: nullcontext(store)


def import_from(store: Store, path: Path, name: str = "vendor", dataset: str = "tickets",
                **options: Any) -> registry.ModelVersion:
    return imports.import_model(lend(store), sources.LocalPath(path), name=name, dataset=dataset, **options)


def failed_imports(store: Store) -> list[dict[str, Any]]:
    return [row for row in audit.rows(store) if row["action"] == imports.ACTION and row["outcome"] == "failed"]


def test_a_hugging_face_folder_is_imported_with_its_weights_and_predicts_as_the_original(
        opened: Store, tickets: str, trained: Trained, tmp_path: Path) -> None:
    folder = hf_folder(trained, tmp_path / "hf")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not read: a pickle beside the safetensors")
    version = import_from(opened, folder)

    assert version.ref == "vendor:1" and version.chosen == "fp32" and version.servable
    assert set(version.variants) == {"fp32", "torch"}
    assert np.allclose(served_logits(opened, version, TEXTS), torch_logits(trained, TEXTS), atol=1e-3)
    lineage = version.lineage(opened)
    assert lineage["trained_on"].startswith("imported from sha256:")
    assert lineage["params"]["imported"]["format"] == "hf" and lineage["params"]["imported"]["licence"] == "apache-2.0"
    assert version.variants["fp32"].metrics["accuracy"] > 0.9  # the tickets it learnt, measured here
    record = [row for row in audit.rows(opened) if row["action"] == imports.ACTION][-1]
    assert record["outcome"] == "ok" and json.loads(record["details"])["sha256"] == lineage["trained_on"].rsplit(":", 1)[1]

    # Like a trained version: optimised under the guard, and deleted with its run's weights.
    optimised = pipeline.optimize_version(opened, version.ref, pipeline.OptimizeOptions(int8=False))
    assert optimised.ref == "vendor:2" and optimised.servable and optimised.run_id == version.run_id
    registry.delete(opened, "vendor:2")
    registry.delete(opened, "vendor:1")
    assert runs.get(opened, version.run_id).model_blob is None


def test_an_ir_exported_by_optimum_is_imported_quantised_and_exported_again_as_openvino_only(
        opened: Store, tickets: str, trained: Trained, tmp_path: Path) -> None:
    folder = optimum_ir(hf_folder(trained, tmp_path / "hf"), tmp_path / "ir")
    version = import_from(opened, folder)
    assert set(version.variants) == {"fp32"}
    assert np.allclose(served_logits(opened, version, TEXTS), torch_logits(trained, TEXTS), atol=1e-3)

    optimised = pipeline.optimize_version(opened, version.ref)
    assert {"fp32", "int8"} <= set(optimised.variants) and "torch" not in optimised.variants
    assert "INT8 guard" in optimised.reason
    with pytest.raises(RegistryError, match="distil"):
        pipeline.optimize_version(opened, version.ref, pipeline.OptimizeOptions(distill_layers=1))
    with pytest.raises(RegistryError, match="exported as openvino only"):
        exchange.export(opened, optimised.ref, "onnx", "plaintext")
    card = json.loads(archive.unpack(exchange.export(opened, optimised.ref, "openvino", "plaintext").archive)
                      ["card.json"])
    assert card["trained_on"].startswith("imported from sha256:") and card["labels"] == trained.data.label_names


def test_an_export_archive_keeps_its_card_and_a_tampered_or_cut_one_is_refused(
        opened: Store, tickets: str, trained: Trained, tmp_path: Path) -> None:
    original = import_from(opened, hf_folder(trained, tmp_path / "hf"), name="original")
    exported = exchange.export(opened, original.ref, "onnx", "plaintext")
    path = tmp_path / "original.tar"
    path.write_bytes(exported.archive)

    version = import_from(opened, path, name="copy")
    imported = version.lineage(opened)["params"]["imported"]
    assert version.lineage(opened)["trained_on"] == f"imported from sha256:{exported.sha256}"  # as model.export says
    assert imported["format"] == "archive" and imported["card"]["model"] == original.ref
    assert imported["card"]["dataset"]["sha256"] and imported["signed_by"]
    assert np.allclose(served_logits(opened, version, TEXTS), served_logits(opened, original, TEXTS), atol=1e-3)

    files = archive.unpack(exported.archive)
    onnx = tmp_path / "onnx"  # the graph alone, with its tokenizer: labels given, as no config.json names them
    onnx.mkdir()
    for name, data in files.items():
        if name.startswith("model/"):
            (onnx / name.removeprefix("model/")).write_bytes(data)
    with pytest.raises(RegistryError, match="does not name its labels"):
        import_from(opened, onnx, name="graph")
    graph = import_from(opened, onnx, name="graph", labels=trained.data.label_names)
    assert graph.lineage(opened)["params"]["imported"]["format"] == "onnx"
    assert np.allclose(served_logits(opened, graph, TEXTS), served_logits(opened, original, TEXTS), atol=1e-3)

    # A card may name any base model: its path is never opened here, even to read a licence the card leaves out.
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "README.md").write_text("---\nlicense: read-from-the-daemons-disk\n---\n")
    card = json.loads(files["card.json"]) | {"base_model": {"path": str(secret), "licence": ""}}
    contents = {name: data for name, data in files.items() if name not in (signed.MANIFEST, signed.SIGNATURE)}
    contents["card.json"] = json.dumps(card).encode()
    (tmp_path / "pointing.tar").write_bytes(archive.pack(sorted(
        (contents | signed.sign(opened, contents, format=exchange.FORMAT)).items())))
    pointing = import_from(opened, tmp_path / "pointing.tar", name="pointing")
    again = json.loads(archive.unpack(exchange.export(opened, pointing.ref, "openvino", "plaintext").archive)[
        "card.json"])
    assert again["base_model"] == {"path": str(secret), "licence": "unknown: the imported model's card states none"}

    files["model/model.onnx"] = files["model/model.onnx"][:-10] + b"0123456789"
    (tmp_path / "tampered.tar").write_bytes(archive.pack(sorted(files.items())))
    (tmp_path / "cut.tar").write_bytes(exported.archive[: len(exported.archive) // 2])
    before = registry.list_versions(opened)
    with pytest.raises(RegistryError, match=r"model/model.onnx: changed after the archive was signed"):
        import_from(opened, tmp_path / "tampered.tar", name="tampered")
    with pytest.raises(RegistryError, match="neither a model folder nor a whole export archive"):
        import_from(opened, tmp_path / "cut.tar", name="cut")
    assert registry.list_versions(opened) == before
    assert [row["object"] for row in failed_imports(opened)] == ["graph", "tampered", "cut"]


def onnx_graph(inputs: dict[str, int], outputs: int) -> bytes:
    """A tiny ONNX graph: the named inputs (element types), one float output of width `outputs`."""
    from onnx import TensorProto, helper

    names = list(inputs)
    nodes = [helper.make_node("Sum", names, ["summed_inputs"]),  # so every input is used, and none pruned
             helper.make_node("Cast", ["summed_inputs"], ["as_float"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["as_float", "axes"], ["summed"], keepdims=1),
             helper.make_node("Tile", ["summed", "repeats"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info(name, kind, ["batch", "sequence"]) for name, kind in inputs.items()],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", outputs])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
                     helper.make_tensor("repeats", TensorProto.INT64, [2], [1, outputs])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def onnx_folder(folder: Path, graph: bytes, hf: Path, labels: list[str]) -> Path:
    folder.mkdir()
    (folder / "model.onnx").write_bytes(graph)
    (folder / "config.json").write_text(json.dumps({"id2label": dict(enumerate(labels))}))
    shutil.copy(hf / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_a_graph_that_names_a_file_anywhere_in_it_is_refused_before_openvino_reads_one(tmp_path: Path) -> None:
    """External data can sit in any tensor: an initializer, a sparse one, a node's attribute, a subgraph's."""
    from onnx import TensorProto, helper

    def external(name: str) -> TensorProto:
        tensor = TensorProto(name=name, data_type=TensorProto.UINT8, dims=[16], data_location=TensorProto.EXTERNAL)
        tensor.external_data.add(key="location", value=str(tmp_path / "secret.bin"))
        return tensor

    def model(graph: Any) -> bytes:
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()

    indices = helper.make_tensor("indices", TensorProto.INT64, [16], list(range(16)))
    branch = helper.make_graph([], "branch", [], [], initializer=[external("in_branch")])
    graphs = {
        "sparse": helper.make_graph([], "g", [], [], sparse_initializer=[
            helper.make_sparse_tensor(external("values"), indices, [16])]),
        "attribute": helper.make_graph([helper.make_node("Constant", [], ["c"], value=external("value"))], "g", [], []),
        "subgraph": helper.make_graph([helper.make_node("If", ["cond"], ["out"], then_branch=branch,
                                                        else_branch=branch)], "g", [], []),
    }
    for graph in graphs.values():
        with pytest.raises(ArtifactError, match="keeps the data of [12] tensors? in files outside it"):
            inference.read_onnx(model(graph))
    with pytest.raises(ArtifactError, match="not a readable ONNX graph"):
        inference.read_onnx(b"\xff" * 64)
    with pytest.raises(ArtifactError, match="is not an OpenVINO IR"):  # ONNX bytes read as an IR would be read as ONNX
        inference.read_openvino(inference.Artifact(model(graphs["sparse"]), b""))


def test_bad_models_are_refused_saying_what_and_how_to_fix_with_nothing_stored(
        opened: Store, tickets: str, trained: Trained, tmp_path: Path) -> None:
    from onnx import TensorProto

    hf = hf_folder(trained, tmp_path / "hf")
    labels = json.loads((hf / "config.json").read_text())["id2label"].values()
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(hf / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04...")
    images = onnx_folder(tmp_path / "images", onnx_graph({"pixel_values": TensorProto.FLOAT}, 3), hf, list(labels))
    wrong_width = onnx_folder(tmp_path / "wide", onnx_graph({"input_ids": TensorProto.INT64,
                                                             "attention_mask": TensorProto.INT64}, 5), hf, list(labels))
    unnamed = onnx_folder(tmp_path / "unnamed", onnx_graph({"input_ids": TensorProto.INT64,
                                                            "attention_mask": TensorProto.INT64}, 3), hf,
                          ["LABEL_0", "LABEL_1", "LABEL_2"])
    other_labels = onnx_folder(tmp_path / "other", onnx_graph({"input_ids": TensorProto.INT64,
                                                               "attention_mask": TensorProto.INT64}, 3), hf,
                               ["cats", "dogs", "birds"])
    lone = tmp_path / "lone.onnx"
    lone.write_bytes((images / "model.onnx").read_bytes())
    vast = shutil.copytree(hf, tmp_path / "vast")  # a config claiming a model far larger than its weights
    config = json.loads((vast / "config.json").read_text())
    (vast / "config.json").write_text(json.dumps(config | {"hidden_size": 65536, "num_hidden_layers": 400}))
    garbled = shutil.copytree(hf, tmp_path / "garbled")
    (garbled / "tokenizer.json").write_text('{"model": "not one"}')
    cardless = tmp_path / "cardless.tar"  # signed, but by whoever made it: the card is still checked
    contents = {"card.json": json.dumps({"format": "onnx"}).encode(),
                "model/model.onnx": (images / "model.onnx").read_bytes()}
    contents |= signed.sign(opened, contents, format=exchange.FORMAT)
    cardless.write_bytes(archive.pack(sorted(contents.items())))
    cut_oddly = tmp_path / "cut-oddly.tar"  # a card whose truncation no model reads with: refused, never echoed
    card = {"format": "onnx", "labels": list(labels), "max_length": 32, "base_model": {"path": "x", "licence": "y"},
            "truncation": "middle-secret"}
    contents = {"card.json": json.dumps(card).encode(), "model/model.onnx": (images / "model.onnx").read_bytes()}
    contents |= signed.sign(opened, contents, format=exchange.FORMAT)
    cut_oddly.write_bytes(archive.pack(sorted(contents.items())))
    cases = [
        (cut_oddly, "the archive's card names a truncation that is none of head, head\\+tail$", {}),
        (vast, "the weights do not fit config.json", {}),
        (garbled, "tokenizer.json is not a tokenizer", {}),
        (cardless, "the archive's card lacks 'labels'", {}),
        (lone, "neither a model folder nor a whole export archive", {}),
        (pickled, "are pickles, which run code when loaded", {}),
        (images, "the graph takes pixel_values", {}),
        (wrong_width, r"not one \[batch, 3\] row of logits", {}),
        (unnamed, "does not name its labels", {}),
        (other_labels, "lack the dataset's billing, shipping, technical", {}),
        (hf, "labels .* repeat", {"labels": ["a", "a", "b"]}),
    ]
    for path, message, options in cases:
        with pytest.raises(RegistryError, match=message) as refused:
            import_from(opened, path, name=path.name, **options)
        assert refused.value.hint, path
    with pytest.raises(RegistryError, match="more than this box can check in memory"):
        imports.read(sources.LocalPath(hf), limit=1000)
    assert registry.list_versions(opened) == [] and runs.list_runs(opened) == []
    assert len(failed_imports(opened)) == len(cases)


def test_an_onnx_export_by_optimum_is_uploaded_or_named_in_the_import_folder_then_optimised_and_served(
        daemon: Daemon, trained: Trained, tmp_path: Path) -> None:
    assert daemon.cli("data", "import", str(tmp_path / "tickets.csv"), "--name", "tickets").returncode == 0
    folder = optimum_onnx(hf_folder(trained, tmp_path / "hf"), tmp_path / "onnx")
    done = daemon.cli("models", "import", str(folder), "--name", "vendor", "--dataset", "tickets")
    assert done.returncode == 0, done.stderr
    assert "imported as vendor:1 (imported from sha256:" in done.stdout

    shutil.copytree(folder, daemon.settings.daemon.import_dir / "onnx")
    token = daemon.cli("users", "add", "viewer", "--role", "viewer").stdout.strip()
    with daemon.api() as api:
        answer = api.post("/v1/models:import-dir", json={"file": "onnx", "name": "vendor", "dataset": "tickets"})
        assert answer.status_code == 201 and answer.json()["version"] == 2, answer.text
        outside = api.post("/v1/models:import-dir", json={"file": "../var", "name": "x", "dataset": "tickets"})
        assert outside.status_code == 400 and "not a name inside daemon.import_dir" in outside.json()["error"]
    with daemon.api(token) as viewer:
        assert viewer.post("/v1/models:import-dir", json={"file": "onnx", "name": "v", "dataset": "tickets"}
                           ).status_code == 403

    optimised = daemon.cli("optimize", "vendor:1")
    assert optimised.returncode == 0 and "vendor:3" in optimised.stdout, optimised.stderr
    assert daemon.cli("deploy", "vendor:3").returncode == 0
    with daemon.api() as api:
        key = api.post("/v1/api-keys", json={"name": "test"}).json()["token"]

    def predicted() -> dict[str, Any] | None:
        answer = httpx.post(f"{daemon.settings.inference_url}/v1/models/vendor:predict",
                            json={"instances": ["my invoice is wrong"]},
                            headers={"Authorization": f"Bearer {key}"}, timeout=10)
        return answer.json() if answer.status_code == 200 else None

    answer = daemon.wait(predicted, 60, "the imported model was not served")
    assert answer["model_version"] == "3" and answer["predictions"][0]["label"] in ("billing", "shipping", "technical")
    canary = daemon.cli("deploy", "vendor:2", "--canary", "50")  # the other import, as a trained version would be
    assert canary.returncode == 0, canary.stderr
    daemon.wait(lambda: {"2", "3"} <= {(predicted() or {}).get("model_version") for _ in range(20)}, 60,
                "no canary traffic")

    # An encrypted export goes back in through the CLI, which opens it with the passphrase before sending it.
    daemon.env["APPLIANCE_EXPORT_PASSPHRASE"] = "correct horse battery staple"
    exported = tmp_path / "vendor.age"
    assert daemon.cli("models", "export", "vendor:3", "--format", "openvino", "--out", str(exported)).returncode == 0
    again = daemon.cli("models", "import", str(exported), "--name", "again", "--dataset", "tickets")
    assert again.returncode == 0 and "imported as again:1" in again.stdout, again.stderr
    del daemon.env["APPLIANCE_EXPORT_PASSPHRASE"]
    refused = daemon.cli("models", "import", str(exported), "--name", "again", "--dataset", "tickets")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr  # no terminal to ask at: it names the variable
    assert "no terminal to ask for the passphrase at: set APPLIANCE_EXPORT_PASSPHRASE" in refused.stderr
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04...")
    pickled = daemon.cli("models", "import", str(tmp_path / "pickled"), "--name", "p", "--dataset", "tickets")
    assert pickled.returncode == 1 and "are pickles, which run code when loaded" in pickled.stderr
    assert "Traceback" not in pickled.stderr
    images = daemon.cli("models", "import", str(folder), "--name", "i", "--dataset", "tickets",
                        "--task", "image-classification")
    assert images.returncode == 1 and "task is given as image-classification, and tickets:1's is text-" in \
        images.stderr


def foreign_image_model(folder: Path, labels: list[str]) -> Path:
    """An EfficientNet-Lite0 classifier exported to ONNX by torch as someone would elsewhere (its input named
    "input", its batch fixed at 1), with config.json naming its labels and the image processor's
    preprocessor_config.json (resize to 256, the centre 224, Lite's normalisation)."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    folder.mkdir(parents=True)
    network = EfficientNet.from_name("efficientnet-lite0", num_classes=len(labels)).eval()
    torch.onnx.export(network, (torch.zeros(1, 3, 224, 224),), str(folder / "model.onnx"), dynamo=False,
                      input_names=["input"], output_names=["output"], opset_version=17)
    (folder / "config.json").write_text(json.dumps({"id2label": dict(enumerate(labels))}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_mean": [127 / 255] * 3, "image_std": [128 / 255] * 3, "size": {"shortest_edge": 256},
        "crop_size": {"height": 224, "width": 224}, "do_center_crop": True}))
    return folder


def test_an_image_classifier_from_onnx_or_an_export_archive_is_imported_measured_and_optimised(
        opened: Store, tmp_path: Path) -> None:
    labels = ["circle", "square", "triangle"]
    datasets.import_file(opened, write_shapes(tmp_path / "shapes", per_class=4), name="shapes", task=datasets.IMAGE)
    folder = foreign_image_model(tmp_path / "vendor", labels)
    version = import_from(opened, folder, dataset="shapes")
    assert (version.task, version.chosen, version.servable) == (datasets.IMAGE, "fp32", True)
    assert runs.get(opened, version.run_id).task == datasets.IMAGE

    photos = [(tmp_path / "shapes" / label / "1.jpg").read_bytes() for label in labels]
    servable = inference.load_ir(blobs.read(opened, version.serving_variant().blob_id),
                                 config={"INFERENCE_PRECISION_HINT": "f32"})
    assert servable.reader == pixels.Pictures(224, (127 / 255,) * 3, (128 / 255,) * 3)
    graph = inference.onnx_session((folder / "model.onnx").read_bytes())  # one photo at a time, as exported
    alone = np.concatenate([graph.run(None, {"input": servable.reader.feeds([photo])[pixels.INPUT]})[0]
                            for photo in photos])
    assert np.allclose(inference.predict(servable.compiled, servable.reader, photos), alone, atol=1e-3)  # batched

    optimised = pipeline.optimize_version(opened, version.ref)
    assert "INT8 guard" in optimised.reason and "Images/s at batch 16" in optimised.reason
    again = imports.import_model(lend(opened), sources.Upload("vendor.tar", exchange.export(
        opened, optimised.ref, "openvino", "plaintext").archive, folder=False), name="again", dataset="shapes")
    assert again.task == datasets.IMAGE and again.lineage(opened)["params"]["imported"]["format"] == "archive"

    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(RegistryError, match="comes without preprocessor_config.json"):
        import_from(opened, folder, name="bad", dataset="shapes")
    with pytest.raises(RegistryError, match="task is given as text-classification, and shapes:1's is image-"):
        import_from(opened, folder, name="bad", dataset="shapes", task="text-classification")
    assert not [version for version in registry.list_versions(opened) if version.model == "bad"]
