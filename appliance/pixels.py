"""Images in, pixels out: how an image model sees a photo, the same in training, optimisation and serving.

numpy and Pillow only, so the inference kernel can read images without torch. Orientation from
EXIF is applied first (a phone stores a portrait photo sideways), and a JPEG much larger than
the model's input is decoded at 1/2, 1/4 or 1/8 scale (Image.draft). Evaluation and serving
take the centre CENTRE of the shorter side; training draws a random crop of CROP_AREA of the
image at an aspect in CROP_ASPECT and a horizontal flip, from a seed, so a resumed epoch sees
what the uninterrupted one did. A batch's images are decoded by DECODE_THREADS threads (Pillow
releases the GIL while it decodes and resizes).

A caller who prepares pixels itself sends the model's input for each image instead (an
3 x size x size float32 array, normalised): `Pictures.see` takes either, so one batch can
hold both. What the drift monitor watches of each image is measured while it is read: the
shorter side it was sent at and its mean brightness.
"""

from __future__ import annotations

import io
import math
import os
import random
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from appliance.core import files
from appliance.core.errors import BadRequest, PayloadTooLarge

CROP_AREA, CROP_ASPECT = (0.25, 1.0), (3 / 4, 4 / 3)
CENTRE = 0.875
DECODE_THREADS = len(os.sched_getaffinity(0))  # one per CPU this process may use: Pillow decodes without the GIL
INPUT = "pixel_values"  # the one input of an image model's graph
MAX_IMAGE_BYTES = 20 * 2**20  # an image file's size, in a dataset or a request
MAX_PIXELS = 50_000_000  # a 50-megapixel photo: 150 MB decoded, so a small file cannot claim gigabytes
_decoders = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="decode")  # threads start on first use


@dataclass(frozen=True)
class Pictures:
    """An image model's input: its size (a square side) and the per-channel mean and std of pixels in 0..1."""

    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> Pictures:
        """What a model's manifest (appliance.json) says it takes."""
        return cls(int(manifest["image_size"]), tuple(manifest["mean"]), tuple(manifest["std"]))

    def feeds(self, images: Sequence[bytes], seeds: Sequence[str | None] | None = None) -> dict[str, np.ndarray]:
        """The model's float32 NCHW input for encoded images: each augmented from its seed, or centred."""
        drawn = seeds if seeds is not None else [None] * len(images)
        decoded = np.stack(list(_decoders.map(lambda image, seed: read(image, self.size, seed), images, drawn)))
        return {INPUT: self._normalised(decoded)}

    def see(self, images: Sequence[bytes | np.ndarray]) -> Seen:
        """What serving feeds the model for a batch (encoded images centred, prepared ones as they are), and what
        drift watches of them."""
        looked = list(_decoders.map(self._look, images))
        stacked = np.stack([values for values, _ in looked])
        mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.std, dtype=np.float32)[:, None, None]
        brightness = ((stacked * std + mean) * 255).mean(axis=(1, 2, 3))
        return Seen({INPUT: stacked}, np.asarray([side for _, side in looked]), brightness)

    def check_prepared(self, values: np.ndarray, where: str) -> None:
        """Refuse a caller's prepared input for one image unless it is 3 x size x size finite numbers."""
        if values.shape != (3, self.size, self.size):
            raise BadRequest(f"{where} has shape {list(values.shape)}, not [3, {self.size}, {self.size}]",
                             hint=f"send each image as its {self.size}x{self.size} RGB pixels, channels first, "
                                  f"normalised with mean {list(self.mean)} and std {list(self.std)}")
        if not np.isfinite(values).all():
            raise BadRequest(f"{where} holds a value that is not a finite number", hint="send finite pixel values")

    def _look(self, image: bytes | np.ndarray) -> tuple[np.ndarray, int]:
        """One image as the model's input (a prepared one as it is), and its shorter side as sent."""
        if isinstance(image, np.ndarray):
            return image, self.size
        rgb, side = _read(image, self.size, None)
        return self._normalised(rgb[None])[0], side

    def _normalised(self, decoded: np.ndarray) -> np.ndarray:
        """uint8 NHWC pixels as the model's float32 NCHW input."""
        scale = 255 * np.asarray(self.std, dtype=np.float32)
        normalised = (decoded.astype(np.float32) - 255 * np.asarray(self.mean, dtype=np.float32)) / scale
        return np.ascontiguousarray(normalised.transpose(0, 3, 1, 2))


@dataclass(frozen=True)
class Seen:
    """A batch as the model sees it, and per image what the drift monitor watches."""

    feeds: dict[str, np.ndarray]
    sides: np.ndarray  # the shorter side the image was sent at, in pixels (a prepared one: the model's size)
    brightness: np.ndarray  # the mean of its pixels as the model sees them, 0..255


def encoded(rgb: np.ndarray) -> bytes:
    """An RGB array (height x width x 3 bytes) as a PNG file."""
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "PNG")
    return buffer.getvalue()


def load(path: Path) -> bytes:
    """An image file a user named, checked as checked() checks one a caller sent. Only the CLI and the TUI call it,
    on the user's side: no server opens a path it was sent."""
    try:
        files.regular_file(path, "the image", error=BadRequest)  # a pipe would hang the reader
        with path.open("rb") as file:
            content = file.read(MAX_IMAGE_BYTES + 1)  # one byte past the limit, for checked() to refuse
    except OSError as exc:
        raise BadRequest(f"cannot read {path}: {exc.strerror}", hint="name an image file") from None
    return checked(content, str(path))


def checked(content: bytes, where: str) -> bytes:
    """An image a caller sent, refused when admitted() refuses it or Pillow cannot decode it."""
    admitted(content, where)
    if (why := problem(content)) is not None:
        raise BadRequest(f"{where} is not a readable image ({why})",
                         hint="send a JPEG, PNG, WebP, BMP or TIFF file as it was saved")
    return content


def admitted(content: bytes, where: str) -> bytes:
    """An image a request holds, checked as far as its header goes (size, format, pixel count): what the request
    path can afford. Decoding it is the batch's work; an image that then fails to decode fails its request alone."""
    if len(content) > MAX_IMAGE_BYTES:
        raise PayloadTooLarge(f"{where} is over the {MAX_IMAGE_BYTES // 2**20} MiB limit for an image",
                              hint="send it smaller: the model sees it at a few hundred pixels a side")
    try:
        with Image.open(io.BytesIO(content)) as image:
            oversized = _oversized(*image.size)
    except Image.DecompressionBombError:  # Pillow's own limit, far past ours
        oversized = BOMB
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise BadRequest(f"{where} is not a readable image (not a format Pillow knows)",
                         hint="send a JPEG, PNG, WebP, BMP or TIFF file as it was saved") from None
    if oversized:
        raise PayloadTooLarge(f"{where} is {oversized}", hint="scale it down first: the model sees a few hundred"
                                                               " pixels a side")
    return content


BOMB = (f"said by its header to hold over {2 * Image.MAX_IMAGE_PIXELS // 10**6} megapixels (where Pillow stops),"
        f" over the limit of {MAX_PIXELS // 10**6}")


def _oversized(width: int, height: int) -> str | None:
    """Why an image of this size is refused, or None."""
    if width * height <= MAX_PIXELS:
        return None
    return f"{width}x{height} pixels, over the limit of {MAX_PIXELS // 10**6} megapixels"


def problem(content: bytes) -> str | None:
    """Why an image cannot be used: Pillow cannot decode it, or it claims more than MAX_PIXELS (a decompression bomb,
    refused from its header before a pixel is decoded); None when it can be used."""
    try:
        with Image.open(io.BytesIO(content)) as image:
            if oversized := _oversized(*image.size):
                return oversized
            image.verify()  # checks structure and checksums
        with Image.open(io.BytesIO(content)) as image:
            image.load()  # decodes every pixel: catches a truncated file that verify() lets through
    except UnidentifiedImageError:
        return "not a format Pillow knows"
    except Image.DecompressionBombError:  # Pillow's own limit, far past ours
        return BOMB
    except (OSError, SyntaxError, ValueError) as exc:
        return str(exc).split(" <")[0] or type(exc).__name__  # no object reprs
    return None


def read(image: bytes, size: int, seed: str | None = None) -> np.ndarray:
    """An image as size x size x 3 bytes: a random crop and flip drawn from seed, or the centre without one."""
    return _read(image, size, seed)[0]


def _read(image: bytes, size: int, seed: str | None) -> tuple[np.ndarray, int]:
    """read(), and the image's shorter side as it was stored."""
    with Image.open(io.BytesIO(image)) as opened:
        stored = min(opened.size)
        if opened.format == "JPEG":  # decode at 1/2, 1/4 or 1/8 scale where that still leaves enough pixels
            opened.draft("RGB", (size * 2, size * 2) if seed is not None else (size, size))
        upright = ImageOps.exif_transpose(opened).convert("RGB")
    width, height = upright.size
    if seed is None:
        side = min(width, height) * CENTRE
        box = ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
        return np.asarray(upright.resize((size, size), Image.Resampling.BILINEAR, box=box)), stored
    rng = random.Random(seed)
    resized = upright.resize((size, size), Image.Resampling.BILINEAR, box=_random_crop(width, height, rng))
    if rng.random() < 0.5:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized), stored


def _random_crop(width: int, height: int, rng: random.Random) -> tuple[float, float, float, float]:
    """A box of CROP_AREA of the image at an aspect in CROP_ASPECT, placed anywhere; the centre square when ten
    draws do not fit."""
    for _ in range(10):
        area = width * height * rng.uniform(*CROP_AREA)
        aspect = math.exp(rng.uniform(math.log(CROP_ASPECT[0]), math.log(CROP_ASPECT[1])))
        w, h = math.sqrt(area * aspect), math.sqrt(area / aspect)
        if w <= width and h <= height:
            left, top = rng.uniform(0, width - w), rng.uniform(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)
    return (width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2
