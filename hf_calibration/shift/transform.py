"""``corrupt`` one image, or every image of a ``datasets.Dataset`` on the fly (``set_transform`` / ``with_transform``)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from hf_calibration._core.checks import check_int, check_seed
from hf_calibration.shift.parameters import (
    BENCHMARK_CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    FROST_SCALE,
    PRESETS,
    REFERENCE_SIZE,
)

CORRUPTIONS = BENCHMARK_CORRUPTIONS + EXTRA_CORRUPTIONS
SEVERITIES = (1, 2, 3, 4, 5)
_MIN_SIDE = 8


def _check_name(name: Any) -> str:
    if name not in CORRUPTIONS:
        raise ValueError(f"Expected argument `name` to be one of {list(CORRUPTIONS)}, but got {name!r}.")
    return name


def _check_severity(severity: Any) -> int:
    severity = check_int(severity, "severity", minimum=1)
    if severity > 5:
        raise ValueError(f"Expected argument `severity` to be an integer in [1, 5], but got {severity}.")
    return severity


def _check_preset(preset: Any) -> str | None:
    if preset is not None and preset not in PRESETS:
        raise ValueError(
            f"Expected argument `preset` to be None (by image size), 'cifar' or 'imagenet', but got {preset!r}."
        )
    return preset


# PIL modes of 8 bits a channel, which convert("RGB") keeps exactly; 16- and 32-bit integer and float modes ("I;16",
# "I", "F") would be clipped to [0, 255] without a word (a uint16 ramp turns almost all white, [0, 1] floats black)
_EIGHT_BIT_MODES = ("1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr")


def _to_pil(image: Any) -> tuple[Image.Image, str]:
    """An RGB PIL image and the mode to give back (``"L"`` for greyscale input, else ``"RGB"``)."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
            raise ValueError(
                "Expected `image` to be a PIL image or a uint8 array of shape (H, W), (H, W, 1) or (H, W, 3), "
                f"but got {image.dtype} with shape {image.shape}."
            )
        image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    if not isinstance(image, Image.Image):
        raise TypeError(f"Expected `image` to be a PIL image or a numpy uint8 array, but got {type(image).__name__}.")
    if image.mode not in _EIGHT_BIT_MODES:
        raise ValueError(
            f"Expected `image` to be an 8-bit image (mode L, RGB, RGBA, P, ...), but got mode {image.mode!r}, which "
            "converting to RGB would clip to [0, 255]: scale it to 8 bits first (the corruptions' parameters are for "
            "0-255 pixel values)."
        )
    if min(image.size) < _MIN_SIDE:
        raise ValueError(
            f"Expected `image` to be at least {_MIN_SIDE} × {_MIN_SIDE} pixels, but got {image.size[0]} × {image.size[1]}."
        )
    mode = "L" if image.mode in ("L", "1") else "RGB"
    return image.convert("RGB"), mode


def preset_for_size(height: int, width: int) -> str:
    """``"cifar"`` (32-px parameters) or ``"imagenet"`` (224-px): the table whose size is nearer to
    ``min(height, width)`` on a log scale (the boundary is √(32·224) ≈ 85 px)."""
    side = min(height, width)
    return "cifar" if abs(math.log(side / 32)) <= abs(math.log(side / 224)) else "imagenet"


def _corrupt(
    image: Image.Image, name: str, severity: int, rng: np.random.RandomState, preset: str | None
) -> np.ndarray:
    from hf_calibration.shift.corruptions import CORRUPTION_FUNCTIONS  # needs the `shift` extra (OpenCV, scikit-image)

    width, height = image.size
    preset = preset or preset_for_size(height, width)
    c = PRESETS[preset][name][severity - 1]
    out = CORRUPTION_FUNCTIONS[name](
        image, c, rng, frost_scale=FROST_SCALE[preset], size_scale=min(height, width) / REFERENCE_SIZE[preset]
    )
    return np.uint8(out)  # as the scripts store it: np.uint8 of values in [0, 255] truncates the fraction


def corrupt(image: Any, name: str, severity: int, seed: int = 0, *, preset: str | None = None) -> Image.Image:
    """Apply one of the Hendrycks & Dietterich (2019) corruptions at a severity in 1-5.

    Args:
        image: a PIL image or a uint8 array (H, W), (H, W, 1) or (H, W, 3); any size of at least 8 × 8.
            ImageNet-C corrupts 224 × 224 crops (``Resize(256)``, ``CenterCrop(224)``) and CIFAR-10-C the
            32 × 32 images; crop before corrupting to reproduce them.
        name: one of :data:`CORRUPTIONS` (the 15 benchmark corruptions, then ``speckle_noise``,
            ``gaussian_blur``, ``spatter``, ``saturate``).
        severity: 1 (mildest) to 5.
        seed: the output is a function of (image, name, severity, seed, preset); ``seed`` seeds a
            ``numpy.random.RandomState``, so seed s reproduces the authors' script run after ``np.random.seed(s)``.
        preset: ``"cifar"`` (``make_cifar_c.py``'s parameters), ``"imagenet"`` (``make_imagenet_c.py``'s), or
            None: by image size (:func:`preset_for_size`: 32-px parameters up to 84 px, 224-px above).

    Returns:
        The corrupted image, a PIL image of the same size (mode ``"L"`` for greyscale input, else ``"RGB"``).

    Example:
        >>> from PIL import Image
        >>> out = corrupt(Image.new("RGB", (32, 32), (128, 64, 32)), "contrast", 5)  # a flat image keeps its mean...
        >>> out.size, out.getpixel((0, 0))  # ...less the float rounding that np.uint8 truncates, as in CIFAR-10-C
        ((32, 32), (127, 63, 31))
    """
    name, severity = _check_name(name), _check_severity(severity)
    seed, preset = check_seed(seed, limit=2**32), _check_preset(preset)
    pil, mode = _to_pil(image)
    out = Image.fromarray(_corrupt(pil, name, severity, np.random.RandomState(seed), preset))
    return out.convert(mode) if mode != "RGB" else out


def _image_seed(seed: int, image: Image.Image) -> list[int]:
    return [seed, zlib.crc32(image.tobytes())]


class ImageChangingProcessor:
    """Base of the image processors that change each image, then call the model's own processor (``self.processor``).
    Each image's change is seeded by ``self.seed`` and its pixels (``_image_seed``), so any batch order or worker gives
    the same; ``to_dict()`` adds the change to the inner processor's configuration, so a logits cache keyed on it keeps
    one entry per change. A subclass gives ``_change(pil_rgb_image, seed) -> uint8 array`` and ``_what() -> (key,
    record)``."""

    processor: Any
    seed: int

    def _change(self, image: Image.Image, seed: list[int]) -> np.ndarray:
        raise NotImplementedError

    def _what(self) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def __call__(self, images, **kwargs):
        out = []
        for image in images:
            pil, mode = _to_pil(image)
            changed = Image.fromarray(self._change(pil, _image_seed(self.seed, pil)))
            out.append(changed.convert(mode) if mode != "RGB" else changed)
        return self.processor(images=out, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        inner = self.processor.to_dict() if hasattr(self.processor, "to_dict") else repr(self.processor)
        key, record = self._what()
        return {"processor": inner, key: record}


def corruption_transform(
    name: str,
    severity: int,
    *,
    seed: int = 0,
    preset: str | None = None,
    image_column: str | None = None,
    then: Callable[[dict], dict] | None = None,
) -> Callable[[dict], dict]:
    """A batch transform for ``Dataset.set_transform`` / ``with_transform`` that corrupts every image on access.

    Each image gets its own noise, a function of ``seed`` and the image's pixels (a ``RandomState`` seeded
    with ``[seed, crc32(pixels)]``), so the corrupted dataset is the same on every access, in every worker and
    in any order. ``image_column`` defaults to ``"image"``, ``"img"`` or the first column holding PIL images.
    ``then`` runs after the corruption (e.g. an image processor's transform). Other columns pass unchanged.

    Example:
        >>> import datasets
        >>> from PIL import Image
        >>> ds = datasets.Dataset.from_dict({"img": [Image.new("RGB", (32, 32), (90, 90, 90))], "label": [0]})
        >>> ds = ds.with_transform(corruption_transform("gaussian_noise", 3))
        >>> ds[0]["img"].size, ds[0]["label"]
        ((32, 32), 0)
    """
    name, severity = _check_name(name), _check_severity(severity)
    seed, preset = check_seed(seed, limit=2**32), _check_preset(preset)

    def transform(batch: dict) -> dict:
        column = image_column or _find_image_column(batch)
        if column not in batch:
            raise KeyError(f"Expected an image column `{column}` in the batch, but it has {list(batch)}.")
        out = dict(batch)
        images = []
        for image in batch[column]:
            pil, mode = _to_pil(image)
            img = Image.fromarray(_corrupt(pil, name, severity, np.random.RandomState(_image_seed(seed, pil)), preset))
            images.append(img.convert(mode) if mode != "RGB" else img)
        out[column] = images
        return then(out) if then is not None else out

    return transform


def _find_image_column(batch: dict) -> str:
    for column in ("image", "img"):
        if column in batch:
            return column
    for column, values in batch.items():
        if len(values) and isinstance(values[0], Image.Image):
            return column
    raise ValueError(
        f"Expected a column of PIL images in the batch (pass `image_column=`), but got columns {list(batch)}."
    )
