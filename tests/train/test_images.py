"""Image classification on real image files: the bundled pretrained backbone, other backbones, preprocessing."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import shutil
import tarfile
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFilter

from appliance import inference, pixels
from appliance.core.config import Settings, bundled_image_base_model
from appliance.core.errors import BadRequest, DatasetError, JobError, PayloadTooLarge, RegistryError, TamperDetected
from appliance.data import datasets, sources
from appliance.operations import burst, pipeline
from appliance.store import Store, blobs
from appliance.train import engine, images, runs
from appliance.train.params import TrainParams
from tests.conftest import run_cli


def write_shapes(folder: Path, per_class: int, seed: int = 0) -> Path:
    """Circles, squares and triangles of any colour, size and place on blurred noise, saved as JPEG photos are."""
    rng = random.Random(seed)
    for label in ("circle", "square", "triangle"):
        (folder / label).mkdir(parents=True)
        for n in range(per_class):
            noise = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (15, 20, 3), dtype=np.uint8)
            image = Image.fromarray(noise).resize((160, 120), Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(2))
            r = rng.randint(18, 40)
            x, y = rng.randint(r, 160 - r), rng.randint(r, 120 - r)
            colour = tuple(rng.randrange(256) for _ in range(3))
            draw = ImageDraw.Draw(image)
            if label == "circle":
                draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
            elif label == "square":
                draw.rectangle((x - r, y - r, x + r, y + r), fill=colour)
            else:
                draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
            image.save(folder / label / f"{n}.jpg", quality=90)
    return folder


@pytest.fixture
def shapes(opened: Store, tmp_path: Path) -> str:
    datasets.import_file(opened, write_shapes(tmp_path / "shapes", per_class=16), name="shapes",
                         task="image-classification")
    return "shapes"


def _bundle_files(opened: Store, blob_id: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blobs.read(opened, blob_id))) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


def test_the_pretrained_backbone_learns_shapes_from_a_few_photos_where_a_cnn_from_scratch_cannot(
        opened: Store, shapes: str, settings: Settings, tmp_path: Path) -> None:
    """36 training photos: the ImageNet features carry the task, with the image defaults (rate, schedule)."""
    pretrained = engine.start(opened, dataset=shapes, base_dir=settings.image_base_model,
                              params=TrainParams(epochs=5, batch_size=8, seed=1))
    assert pretrained.status == "finished"
    assert pretrained.metrics["accuracy"] >= 0.85, pretrained.metrics  # 8 of the 9 validation photos
    run = runs.get(opened, pretrained.run_id)
    assert run.base_model == str(settings.image_base_model)
    assert run.params["learning_rate"] == 2e-4 and run.params["schedule"] == "cosine"  # not text's defaults
    assert run.params["freeze"] == 0.5
    manifest = json.loads(_bundle_files(opened, pretrained.model_blob)["appliance.json"])
    assert manifest == {"task": "image-classification", "labels": ["circle", "square", "triangle"],
                        "architecture": "efficientnet-lite0", "image_size": 224,
                        "mean": [127 / 255] * 3, "std": [128 / 255] * 3}

    (tmp_path / "cnn").mkdir()
    (tmp_path / "cnn" / "backbone.json").write_text('{"architecture": "small-cnn", "image_size": 64}')
    scratch = engine.start(opened, dataset=shapes, base_dir=tmp_path / "cnn",
                           params=TrainParams(epochs=5, batch_size=8, seed=1, learning_rate=3e-3))
    assert scratch.status == "finished"
    assert scratch.metrics["accuracy"] < pretrained.metrics["accuracy"]


def test_the_new_head_is_fitted_on_frozen_features_first_and_kept_where_fine_tuning_does_no_better(
        opened: Store, shapes: str, settings: Settings) -> None:
    """The run's epoch 0 is the pretrained network with its head fitted alone; a learning rate that wrecks the
    network in its one epoch leaves the run that model, scored as it was, not the wreck."""
    said: list[str] = []
    reports: list[engine.Progress] = []
    result = engine.start(opened, dataset=shapes, base_dir=settings.image_base_model,
                          params=TrainParams(epochs=1, batch_size=8, seed=1, learning_rate=0.5),
                          log=said.append, progress=reports.append)
    assert any("its stem and first 8 of 16 blocks frozen" in line for line in said), said
    fitted = next(line for line in said if line.startswith("the new head fitted"))
    assert "features of 39 training images" in fitted, fitted
    assert any(report.phase == "fit-head" and report.step == 39 for report in reports)
    epochs = runs.epochs(opened, result.run_id)
    assert len(epochs) == 1 and epochs[0].metrics["accuracy"] < result.metrics["accuracy"]
    assert f"accuracy {result.metrics['accuracy']:.4f}" in fitted
    assert result.outcome is not None and result.outcome.best_epoch == 0
    assert "kept epoch 0 (the head fitted on frozen features) of 1" in said[-1]
    assert result.metrics["accuracy"] >= 0.66, result.metrics  # 6 of the 9 validation photos on frozen features


def test_patience_counts_from_the_best_epoch_trained_not_from_the_fitted_head(
        opened: Store, shapes: str, settings: Settings) -> None:
    """Fine-tuning starts below the head fitted on frozen features; a first epoch under it is not yet a reason to
    stop, though the head stays the model kept while no epoch beats it."""
    result = engine.start(opened, dataset=shapes, base_dir=settings.image_base_model,
                          params=TrainParams(epochs=3, patience=1, batch_size=8, seed=1, learning_rate=0.5))
    assert result.outcome is not None and result.outcome.best_epoch == 0
    assert result.outcome.epochs_run >= 2, result.outcome  # counted from the head, it stopped after epoch 1


def test_a_frozen_share_of_the_backbone_stays_as_pretrained_while_the_rest_learns(
        opened: Store, shapes: str, settings: Settings) -> None:
    """With freeze 0.5 a training step moves the last eight blocks and the head, and leaves the stem and the first
    eight blocks bit for bit as the backbone shipped them; the optimizer holds none of their tensors."""
    data = datasets.load(opened, datasets.get(opened, shapes))
    task = images.ImageClassification(data, images.Backbone.load(settings.image_base_model), freeze=0.5)
    model = task.build_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = engine._optimizer(model, TrainParams(learning_rate=1e-2))
    model.train()
    model(**task.collate(list(range(8)), augment_seed=1)).loss.backward()
    optimizer.step()
    after = model.state_dict()
    frozen = ("net._conv_stem.", "net._bn0.", *(f"net._blocks.{n}." for n in range(8)))
    for name, tensor in after.items():
        if name.startswith(frozen):
            assert torch.equal(tensor, before[name]), name
    moved = {name.split(".")[2] for name, tensor in after.items()
             if name.startswith("net._blocks.") and not torch.equal(tensor, before[name])}
    assert moved == {str(n) for n in range(8, 16)}
    assert not torch.equal(after["net._fc.weight"], before["net._fc.weight"])
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad} and len(held) < len(list(model.parameters()))


def test_a_checkpoint_whose_optimizer_does_not_fit_the_run_is_refused_with_a_reason(
        opened: Store, shapes: str, settings: Settings) -> None:
    """A checkpoint laid out otherwise (here: the run's record altered to freeze a quarter of the blocks where its
    checkpoint holds the optimizer of half; in use, one written by an earlier version) cannot continue: resume says
    so and what to do instead of failing inside torch."""
    said: list[str] = []
    stopped = engine.start(opened, dataset=shapes, base_dir=settings.image_base_model, log=said.append,
                           params=TrainParams(epochs=2, batch_size=8, seed=1),
                           should_stop=lambda: any(line.startswith("the new head fitted") for line in said))
    assert stopped.status == "interrupted" and stopped.steps == 1
    with opened.db.conn:
        opened.db.execute("UPDATE runs SET params = json_set(params, '$.freeze', 0.25) WHERE id = ?",
                          [stopped.run_id])
    with pytest.raises(JobError, match="model or optimizer laid out by an earlier version") as refused:
        engine.resume(opened, stopped.run_id)
    assert f"appliance runs show {stopped.run_id}" in refused.value.hint


def test_the_head_fit_matches_scikit_learns_logistic_regression_on_standardised_features() -> None:
    """The same objective (multinomial, L2 with C=1, standardised inputs) gives the same predictions, and the
    standardisation folded into the layer leaves it taking the features as they come."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    scales = rng.uniform(0.1, 10, 64)  # features on very different scales
    targets = rng.integers(0, 4, 800)
    features = ((rng.normal(0, 1, (4, 64))[targets] + rng.normal(0, 6, (800, 64))) * scales).astype(np.float32)
    weight, bias = images.logistic_regression(torch.from_numpy(features), torch.from_numpy(targets), 4)
    ours = (torch.from_numpy(features) @ weight.T + bias).argmax(1).numpy()
    theirs = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(features, targets)
    assert np.mean(ours == theirs.predict(features)) >= 0.99
    assert 0.6 < np.mean(ours == targets) < 1.0  # a task with overlap, so agreeing is not trivial


def test_a_stopped_image_run_resumes_to_what_an_uninterrupted_one_learns(opened: Store, shapes: str,
                                                                          tmp_path: Path) -> None:
    """Each batch's augmentation is drawn from (seed, epoch, batch), so after a resume the batches are the ones the
    uninterrupted run saw, crops and flips included (a small CNN, for speed: the engine does not tell them apart)."""
    (tmp_path / "cnn").mkdir()
    (tmp_path / "cnn" / "backbone.json").write_text('{"architecture": "small-cnn", "image_size": 48}')
    params = TrainParams(epochs=3, batch_size=8, learning_rate=3e-3, seed=2, checkpoint_every=2)
    straight = engine.start(opened, dataset=shapes, base_dir=tmp_path / "cnn", params=params)
    steps = iter(range(1000))
    stopped = engine.start(opened, dataset=shapes, base_dir=tmp_path / "cnn", params=params,
                           should_stop=lambda: next(steps) == 6)
    assert stopped.status == "interrupted" and stopped.steps == 7
    resumed = engine.resume(opened, stopped.run_id)
    assert resumed.status == "finished" and resumed.steps == straight.steps
    for name, value in straight.metrics.items():
        assert resumed.metrics[name] == pytest.approx(value, abs=1e-5), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_path_fine_tunes_the_pretrained_backbone_with_mixed_precision(opened: Store, shapes: str,
                                                                                settings: Settings) -> None:
    """The default image job on a GPU: the bundled EfficientNet-Lite0, the image defaults, autocast."""
    result = engine.start(opened, dataset=shapes, base_dir=settings.image_base_model,
                          params=TrainParams(epochs=5, batch_size=8, seed=1), device="cuda")
    plan = runs.get(opened, result.run_id).plan
    assert plan["device"].startswith("cuda") and plan["precision"] in ("bf16", "fp16")
    assert result.metrics["accuracy"] >= 0.85, result.metrics


def test_a_training_batch_is_augmented_repeatably_and_an_evaluation_batch_is_the_centre(
        opened: Store, shapes: str, settings: Settings) -> None:
    data = datasets.load(opened, datasets.get(opened, shapes))
    task = images.ImageClassification(data, images.Backbone.load(settings.image_base_model))
    first = task.collate([0, 1, 2], augment_seed=7)["pixel_values"]
    assert first.shape == (3, 3, 224, 224)
    assert (task.collate([0, 1, 2], augment_seed=7)["pixel_values"] == first).all()  # a resumed epoch sees the same
    assert not (task.collate([0, 1, 2], augment_seed=8)["pixel_values"] == first).all()
    centre = task.collate([0, 1, 2])["pixel_values"]
    assert (task.collate([0, 1, 2])["pixel_values"] == centre).all()
    assert -1.0 <= float(centre.min()) and float(centre.max()) <= 1.0  # (x - 127) / 128, as the Lite models take it


def test_an_upright_photo_is_read_the_way_its_camera_says(tmp_path: Path) -> None:
    """A phone stores a portrait photo sideways with an EXIF orientation; the model must see it upright."""
    sideways = Image.new("RGB", (200, 100), (0, 0, 0))
    ImageDraw.Draw(sideways).rectangle((0, 0, 99, 99), fill=(255, 255, 255))  # white on the left half
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    buffer = io.BytesIO()
    sideways.save(buffer, "JPEG", exif=exif)
    read = pixels.read(buffer.getvalue(), 32)
    top, bottom = read[:8].mean(), read[-8:].mean()
    assert top > 200 and bottom < 50  # the left half of the stored image is the top of the upright one


def test_a_base_that_is_no_backbone_or_a_changed_bundled_file_is_refused_saying_what(
        opened: Store, shapes: str, tmp_path: Path) -> None:
    with pytest.raises(JobError, match="has no backbone.json") as no_description:
        engine.start(opened, dataset=shapes, base_dir=tmp_path, params=TrainParams(epochs=1))
    assert "bundled EfficientNet-Lite0" in (no_description.value.hint or "")

    (tmp_path / "lite").mkdir()
    (tmp_path / "lite" / "backbone.json").write_text('{"architecture": "efficientnet-lite0"}')
    with pytest.raises(JobError, match="no model.safetensors"):
        images.Backbone.load(tmp_path / "lite")
    (tmp_path / "lite" / "backbone.json").write_text('{"architecture": "resnet50"}')
    with pytest.raises(JobError, match="names architecture 'resnet50'"):
        images.Backbone.load(tmp_path / "lite")

    changed = tmp_path / "changed"
    shutil.copytree(bundled_image_base_model(), changed)
    weights = changed / images.BUNDLED_WEIGHTS
    content = bytearray(weights.read_bytes())
    content[-100] ^= 1
    weights.write_bytes(bytes(content))
    with pytest.raises(JobError, match="is not the EfficientNet-Lite0 weights this version ships"):
        images.Backbone.load(changed)


def test_an_image_folder_trains_optimises_and_predicts_from_the_command_line(tmp_path: Path) -> None:
    run_cli("keys", "init", check=True)
    write_shapes(tmp_path / "shapes", per_class=6)
    run_cli("data", "import", str(tmp_path / "shapes"), "--name", "shapes", "--task", "image-classification",
            check=True)
    trained = run_cli("train", "--data", "shapes", "--epochs", "1", "--batch-size", "8", check=True)
    assert "image backbone efficientnet-lite0 (pretrained) at 224x224" in trained.stderr
    assert "registered as shapes:1" in trained.stdout, trained.stdout
    optimised = run_cli("optimize", "shapes:1", "--calibration-size", "12", check=True)
    assert "Images/s at batch 16" in optimised.stdout

    photos = [str(tmp_path / "shapes" / label / "0.jpg") for label in ("circle", "square")]
    predicted = run_cli("predict", "shapes:2", *photos, "--json", check=True)
    rows = json.loads(predicted.stdout)["predictions"]
    assert [row["image"] for row in rows] == photos
    assert all(row["label"] in ("circle", "square", "triangle") and len(row["scores"]) == 3 for row in rows)

    (tmp_path / "notes.jpg").write_text("not a photo")
    refused = run_cli("predict", "shapes:2", str(tmp_path / "notes.jpg"))
    assert refused.returncode == 1 and "notes.jpg is not a readable image" in refused.stderr
    assert "Traceback" not in refused.stderr
    deployed = run_cli("deploy", "shapes:2", check=True)
    assert "shapes:2" in deployed.stdout


def test_an_image_model_is_optimised_to_openvino_and_int8_under_the_guard(
        opened: Store, shapes: str, settings: Settings) -> None:
    trained = engine.start(opened, dataset=shapes, base_dir=settings.image_base_model,
                           params=TrainParams(epochs=2, batch_size=8, seed=1))
    optimised = pipeline.optimize_version(opened, pipeline.register_run(opened, trained.run_id, "shapes").ref)
    assert {"torch", "fp32", "int8"} <= set(optimised.variants)
    assert "INT8 guard: " in optimised.reason and "Images/s at batch 16: " in optimised.reason
    for name in ("fp32", "int8"):
        measured = optimised.variants[name].metrics
        assert {"accuracy", "macro_f1", "latency_ms_p50", "throughput_b1", "throughput_b16"} <= set(measured)
    assert optimised.variants["int8"].bytes < optimised.variants["fp32"].bytes / 2  # its weights are 8-bit

    # The FP32 IR, reading the images as serving will, answers what the trained network does in torch.
    data = datasets.load(opened, datasets.get(opened, shapes))
    validation = [data.images[i] for i in data.validation]
    servable = inference.load_ir(blobs.read(opened, optimised.variants["fp32"].blob_id),
                                 config={"INFERENCE_PRECISION_HINT": "f32"})  # the CPU runs bf16 where it is fast
    model, manifest = images.load_image_classifier(_bundle_files(opened, trained.model_blob))
    with torch.no_grad():
        in_torch = model(torch.from_numpy(servable.reader.feeds(validation)[pixels.INPUT])).logits.numpy()
    np.testing.assert_allclose(inference.predict(servable.compiled, servable.reader, validation), in_torch,
                               rtol=1e-3, atol=1e-3)
    assert servable.labels == manifest["labels"] == ["circle", "square", "triangle"]

    with pytest.raises(RegistryError, match="distillation keeps some layers of a text encoder"):
        pipeline.optimize_version(opened, optimised.ref, pipeline.OptimizeOptions(distill_layers=2))


def test_an_image_set_is_read_a_file_at_a_time_from_the_encrypted_store(opened: Store, tmp_path: Path) -> None:
    """A set several times the size of what loading it holds: its files are read when asked, never all at once."""
    rng = np.random.default_rng(0)
    written = {}
    for label in ("noisy", "noisier"):
        (tmp_path / "set" / label).mkdir(parents=True)
        for n in range(250):
            photo = tmp_path / "set" / label / f"{n}.png"
            Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(photo)
            written[hashlib.sha256(photo.read_bytes()).hexdigest()] = label
    assert sum(path.stat().st_size for path in (tmp_path / "set").rglob("*.png")) > 27 * 2**20

    relabelled = (tmp_path / "set" / "noisy" / "0.png").read_bytes()
    new_photo = pixels.encoded(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8))

    def contents(version: datasets.DatasetVersion) -> dict[str, str]:
        data = datasets.load(opened, version)
        return {hashlib.sha256(data.images[i]).hexdigest(): data.labels[i] for i in range(len(data.images))}

    peaks = {}
    tracemalloc.start()
    try:
        version = datasets.import_file(opened, tmp_path / "set", name="noise", task="image-classification")
        peaks["importing"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        data = datasets.load(opened, version)
        read = {hashlib.sha256(data.images[i]).hexdigest(): data.labels[i] for i in range(len(data.images))}
        peaks["loading"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        extended = datasets.extend(opened, version, [(relabelled, "noisier"), (new_photo, "noisy")],
                                   source="feedback")
        peaks["extending"] = tracemalloc.get_traced_memory()[1]
        before_erasing = contents(extended)
        tracemalloc.reset_peak()
        erased = datasets.erase_rows(opened, extended, {0, 500})
        peaks["erasing"] = tracemalloc.get_traced_memory()[1]
        datasets.set_residency(opened, erased.ref, datasets.BURST_ALLOWED)
        tracemalloc.reset_peak()
        backend, base = _KeepingBackend(tmp_path / "uploaded"), tmp_path / "base"
        base.mkdir()
        burst.submit(opened, backend, burst.Request(erased.ref, base, TrainParams(), None, "job1"), _Quiet())
        peaks["sealing for a burst"] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert read == written
    for step, peak in peaks.items():  # a few 1 MiB chunks, not the set
        assert peak < 12 * 2**20, f"{step} held {peak / 2**20:.1f} MiB"
    assert pickle.loads(pickle.dumps(data.images)) == list(data.images)  # what a helper process receives

    digest_of = {name: hashlib.sha256(content).hexdigest() for name, content in (("old", relabelled),
                                                                                 ("new", new_photo))}
    assert extended.examples == 501 and extended.parent == version.id
    assert before_erasing == {**written, digest_of["old"]: "noisier", digest_of["new"]: "noisy"}
    assert erased is not None and erased.examples == 499
    gone = next(iter(before_erasing)), digest_of["new"]  # rows 0 and 500: the first photo and the one added last
    assert contents(erased) == {digest: label for digest, label in before_erasing.items() if digest not in gone}
    shipped = sorted(backend.kept.glob("*/dataset.*"), key=lambda path: path.name)
    key = backend.key
    assert burst.unseal(key, "dataset", [path.read_bytes() for path in shipped]) == blobs.read(opened,
                                                                                             erased.blob_id)

    storage_id, index, sealed = opened.db.execute(
        "SELECT c.storage_id, c.idx, c.data FROM blob_chunks c JOIN blobs b ON b.storage_id = c.storage_id"
        " WHERE b.id = ? AND c.idx = 3", (version.blob_id,)).fetchone()
    opened.db.execute("UPDATE blob_chunks SET data = ? WHERE storage_id = ? AND idx = ?",
                      (sealed[:-1] + bytes([sealed[-1] ^ 1]), storage_id, index))
    with pytest.raises(TamperDetected, match="chunk 3 of"):
        [data.images[i] for i in range(len(data.images))]
    with pytest.raises(TamperDetected, match="chunk 3 of"):
        datasets.load(opened, version)


class _KeepingBackend:
    """A cluster that keeps what a burst uploads (the folders of sealed chunks) and starts nothing."""

    address = "http://127.0.0.1:1"

    def __init__(self, folder: Path) -> None:
        self.kept, self.key = folder, b""

    def submit(self, submission_id: str, packages: list[Path], key: bytes) -> None:
        for package in packages:
            shutil.copytree(package, self.kept / package.name)
        self.key = key

    def where(self, submission_id: str) -> str:
        return f"{self.address}/{submission_id}"


class _Quiet:
    def submitted(self, submission: dict[str, str]) -> None:
        pass

    def log(self, line: str) -> None:
        pass


def test_a_photo_changed_or_gone_while_its_folder_is_imported_fails_the_import(opened: Store, tmp_path: Path) -> None:
    """The files are read twice (checked, then stored a file at a time): what is stored must be what was checked."""
    folder = write_shapes(tmp_path / "shapes", per_class=3)

    class Changing(sources.LocalPath):
        def __init__(self, path: Path, change: Callable[[sources.FolderFile], sources.FolderFile | None]) -> None:
            super().__init__(path)
            self.change, self.passes = change, 0

        def files(self) -> Iterator[sources.FolderFile]:
            self.passes += 1
            for file in super().files():
                changed = self.change(file) if self.passes > 1 else file
                if changed is not None:
                    yield changed

    def edited(file: sources.FolderFile) -> sources.FolderFile:
        return replace(file, read=lambda: file.read() + b"\0") if file.entry == "square/1.jpg" else file

    for change, message in ((edited, "shapes/square/1.jpg changed while it was being imported"),
                            (lambda file: None if file.entry == "triangle/2.jpg" else file,
                             "shapes/triangle/2.jpg went missing while it was being imported")):
        with pytest.raises(DatasetError, match=message):
            datasets.import_data(opened, Changing(folder, change), name="shapes", task="image-classification")
    assert datasets.list_versions(opened) == []  # nothing stored


def test_an_image_too_large_unreadable_or_a_decompression_bomb_is_refused_before_it_is_decoded() -> None:
    bomb = io.BytesIO()
    Image.new("1", (10_000, 6_000)).save(bomb, "PNG")  # 60 megapixels of nothing: a few kilobytes on disk
    assert len(bomb.getvalue()) < 100_000
    with pytest.raises(PayloadTooLarge, match="upload.png is 10000x6000 pixels, over the limit of 50 megapixels"):
        pixels.checked(bomb.getvalue(), "upload.png")
    with pytest.raises(PayloadTooLarge, match="over the 20 MiB limit for an image"):
        pixels.checked(b"\xff\xd8" + bytes(pixels.MAX_IMAGE_BYTES), "huge.jpg")
    with pytest.raises(BadRequest, match="notes.txt is not a readable image \\(not a format Pillow knows\\)"):
        pixels.checked(b"just some text", "notes.txt")
    photo = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(photo, "JPEG")
    truncated = photo.getvalue()[: len(photo.getvalue()) // 2]
    with pytest.raises(BadRequest, match="cut.jpg is not a readable image"):
        pixels.checked(truncated, "cut.jpg")
    assert pixels.checked(photo.getvalue(), "photo.jpg") == photo.getvalue()
