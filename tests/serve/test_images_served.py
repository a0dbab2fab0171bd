"""An image model served by the real server: the Open Inference Protocol through Triton's clients (REST and gRPC),
the plain endpoint with base64 images, pixels prepared by the caller, drift on image statistics, feedback that
becomes training data, and every kind of bad image refused with a 4xx that names it."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from appliance import inference, pixels, registry
from appliance.access import auth
from appliance.core import config
from appliance.data import datasets
from appliance.operations import pipeline
from appliance.registry import feedback
from appliance.store import blobs, lifecycle
from appliance.train import engine
from appliance.train.params import TrainParams
from tests.daemon import free_port
from tests.serve.conftest import Server, State, start_server, stop_server
from tests.test_datasets import claiming
from tests.train.test_images import write_shapes

LABELS = ["circle", "square", "triangle"]


@dataclass(frozen=True)
class Served:
    server: Server
    grpc: str  # host:port
    photos: dict[str, bytes]  # one JPEG per label, from the training folder
    servable: inference.Servable  # the served variant, loaded here as the server loads it


def deploy_shapes(settings: config.Settings, folder: Path) -> tuple[inference.Servable, str]:
    """A store at settings serving shapes:2 (EfficientNet-Lite0 tuned for an epoch on folder, FP32 IR); the served
    variant as the server loads it, and an API key that may call it."""
    with lifecycle.init(settings) as opened:
        datasets.import_file(opened, folder, name="shapes", task="image-classification")
        trained = engine.start(opened, dataset="shapes", base_dir=settings.image_base_model,
                               params=TrainParams(epochs=1, batch_size=8, seed=1))
        pipeline.register_run(opened, trained.run_id, "shapes")
        optimised = pipeline.optimize_version(opened, "shapes:1", pipeline.OptimizeOptions(int8=False))
        assert "would be the lever" not in optimised.reason  # fp32 alone, but no student of an image model is proposed
        registry.deploy(opened, optimised.ref)
        servable = inference.load_ir(blobs.read(opened, optimised.serving_variant().blob_id))
        _, token = auth.create(opened, "tests", may_label=True)
    return servable, token


@pytest.fixture(scope="module")
def served(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("images-served")
    settings = config.Settings(state_dir=root / "var", key_file=root / "var" / "master.key", config_file=None,
                               base_model=tiny_base)
    folder = write_shapes(root / "shapes", per_class=8)
    servable, token = deploy_shapes(settings, folder)
    state = State(settings, token, token, token)
    port = free_port()
    server = start_server(state, grpc_port=str(port), drift_window="12")
    photos = {label: (folder / label / "0.jpg").read_bytes() for label in LABELS}
    yield Served(server, f"127.0.0.1:{port}", photos, servable)
    stop_server(server)


def headers(served: Served) -> dict[str, str]:
    return {"authorization": f"Bearer {served.server.state.token}"}  # gRPC metadata keys are lower case


def jpeg(size: tuple[int, int], colour: tuple[int, int, int] = (90, 140, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "JPEG")
    return buffer.getvalue()


def test_triton_clients_classify_image_files_over_rest_and_grpc_as_the_model_does_in_process(served: Served) -> None:
    photos = list(served.photos.values())
    expected = inference.predict(served.servable.compiled, served.servable.reader, photos)

    rest = httpclient.InferenceServerClient(served.server.url.removeprefix("http://"))
    metadata = rest.get_model_metadata("shapes", headers=headers(served))
    assert [(tensor["name"], tensor["datatype"]) for tensor in metadata["inputs"]] == [
        ("image", "BYTES"), ("pixel_values", "FP32")]
    assert metadata["parameters"]["labels"] == LABELS and metadata["parameters"]["image_size"] == 224
    image = httpclient.InferInput("image", [len(photos)], "BYTES")
    image.set_data_from_numpy(np.array(photos, dtype=object), binary_data=True)
    answer = rest.infer("shapes", [image], headers=headers(served))
    assert [label.decode() for label in answer.as_numpy("label")] == [LABELS[i] for i in expected.argmax(axis=1)]
    np.testing.assert_allclose(answer.as_numpy("probabilities"), inference.softmax(expected), atol=2e-3)
    assert not answer.as_numpy("truncated").any()

    grpc = grpcclient.InferenceServerClient(served.grpc)
    tensor = grpcclient.InferInput("image", [len(photos)], "BYTES")
    tensor.set_data_from_numpy(np.array(photos, dtype=object))
    over_grpc = grpc.infer("shapes", [tensor], headers=headers(served))
    np.testing.assert_allclose(over_grpc.as_numpy("probabilities"), answer.as_numpy("probabilities"), atol=1e-5)
    with pytest.raises(InferenceServerException, match="instance 0 is not a readable image"):
        tensor.set_shape([1])
        tensor.set_data_from_numpy(np.array([b"plain words"], dtype=object))
        grpc.infer("shapes", [tensor], headers=headers(served))
    grpc.close()
    rest.close()


def test_pixels_prepared_by_the_caller_answer_as_the_image_files_do(served: Served) -> None:
    photos = list(served.photos.values())
    prepared = served.servable.reader.feeds(photos)[pixels.INPUT]
    rest = httpclient.InferenceServerClient(served.server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("pixel_values", list(prepared.shape), "FP32")
    tensor.set_data_from_numpy(prepared, binary_data=True)
    from_pixels = rest.infer("shapes", [tensor], headers=headers(served)).as_numpy("probabilities")
    image = httpclient.InferInput("image", [len(photos)], "BYTES")
    image.set_data_from_numpy(np.array(photos, dtype=object), binary_data=True)
    from_files = rest.infer("shapes", [image], headers=headers(served)).as_numpy("probabilities")
    np.testing.assert_allclose(from_pixels, from_files, atol=1e-4)
    rest.close()

    with served.server.client() as client:  # the wrong size is named, with what the model takes
        wrong = {"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [1, 3, 8, 8],
                             "data": [0.0] * 192}]}
        refused = client.post("/v2/models/shapes/infer", json=wrong)
        assert refused.status_code == 400
        assert "has shape [1, 3, 8, 8], not [n, 3, 224, 224]" in refused.json()["error"]


def test_the_plain_endpoint_takes_base64_images_and_gives_ids_that_feedback_turns_into_training_data(
        served: Served) -> None:
    new_photo = jpeg((300, 200))
    sent = [served.photos["circle"], new_photo]
    with served.server.client() as client:
        answered = client.post("/v1/models/shapes:predict",
                               json={"instances": [{"b64": base64.b64encode(photo).decode()} for photo in sent]})
        assert answered.status_code == 200, answered.text
        predictions = answered.json()["predictions"]
        assert [sorted(p["scores"]) for p in predictions] == [LABELS] * 2 and all(p["id"] for p in predictions)
        labelled = client.post("/v1/feedback", json={"feedback": [  # the training photo relabelled, one new
            {"prediction_id": p["id"], "label": label} for p, label in zip(predictions, ["square", "triangle"],
                                                                           strict=True)]})
        assert labelled.status_code == 200, labelled.text

    with served.server.state.open() as opened:
        extended = feedback.extend_dataset(opened, "shapes", actor="tests")
        assert (extended.ref, extended.task, extended.examples) == ("shapes:2", datasets.IMAGE, 25)
        data = datasets.load(opened, extended)
        labelled_as = dict(zip(data.images, data.labels, strict=True))
        assert labelled_as[new_photo] == "triangle" and labelled_as[served.photos["circle"]] == "square"


def test_bad_images_are_refused_naming_the_instance_and_never_fail_the_others(served: Served) -> None:
    good = served.photos["circle"]
    bomb = io.BytesIO()
    Image.new("1", (10_000, 6_000)).save(bomb, "PNG")  # 60 megapixels in a few kilobytes
    whole = served.photos["square"]
    cut = whole[: len(whole) // 2]  # a readable header, then half the picture

    def predict(*images: bytes | str) -> tuple[int, str]:
        body = {"instances": [image if isinstance(image, str) else {"b64": base64.b64encode(image).decode()}
                              for image in images]}
        with served.server.client() as client:
            answer = client.post("/v1/models/shapes:predict", json=body)
        return answer.status_code, answer.text

    status, text = predict(good, bomb.getvalue())
    assert status == 413 and "instance 1 is 10000x6000 pixels, over the limit of 50 megapixels" in text
    status, text = predict(claiming(good_png(), 20_000, 20_000))  # past Pillow's own limit too
    assert status == 413 and "instance 0 is said by its header to hold over 178 megapixels" in text
    status, text = predict(b"GIF87a but not really")
    assert status == 400 and "instance 0 is not a readable image (not a format Pillow knows)" in text
    status, text = predict(good, "a text")
    assert status == 400 and "instance 1 is a string, and this model classifies images" in text
    with ThreadPoolExecutor(4) as pool:  # the damaged photo fails its own request, in a batch with the others
        answers = list(pool.map(lambda images: predict(*images), [(good, cut), (good,), (good,), (good,)]))
    assert answers[0][0] == 400 and "instance 1 cannot be decoded as an image" in answers[0][1]
    assert [status for status, _ in answers[1:]] == [200, 200, 200]
    with served.server.client() as client:
        huge = client.post("/v1/models/shapes:predict", content=b"{" + b" " * (33 * 2**20) + b"}",
                           headers={"Content-Type": "application/json"})
        assert huge.status_code == 413  # past serve.max_image_body_bytes


def test_drift_is_watched_on_the_size_and_brightness_of_the_images_sent(served: Served) -> None:
    dark = [jpeg((1600, 1200), (shade, shade, shade)) for shade in range(0, 24, 2)]  # large, and nearly black
    with served.server.client() as client:
        for start in range(0, len(dark), 4):
            instances = [{"b64": base64.b64encode(image).decode()} for image in dark[start:start + 4]]
            assert client.post("/v1/models/shapes:predict", json={"instances": instances}).status_code == 200

        def alerted() -> bool:
            metrics = client.get("/metrics").text
            return 'feature="brightness"' in metrics and 'feature="side"' in metrics

        served.server.wait(alerted)
        gauges = {line.split('feature="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                  for line in client.get("/metrics").text.splitlines() if line.startswith("appliance_drift_psi{")}
    assert gauges["side"] > 1 and gauges["brightness"] > 1  # 1600x1200 and black: far from 160x120 shapes


def test_a_canary_of_an_image_model_takes_its_share_of_the_photos(served: Served) -> None:
    with served.server.state.open() as opened:
        candidate = pipeline.optimize_version(opened, "shapes:1", pipeline.OptimizeOptions(int8=False))
        registry.deploy(opened, candidate.ref, canary_percent=50)
    instances = [{"b64": base64.b64encode(served.photos["circle"]).decode()}]
    with served.server.client() as client:
        served.server.wait(lambda: client.get(f"/v2/models/shapes/versions/{candidate.version}/ready").status_code
                           == 200)
        answered = {client.post("/v1/models/shapes:predict", json={"instances": instances}).json()["model_version"]
                    for _ in range(40)}
    assert answered == {"2", str(candidate.version)}


def good_png() -> bytes:
    return pixels.encoded(np.full((8, 8, 3), 100, dtype=np.uint8))
