"""The published corruption parameters of Hendrycks & Dietterich (2019), one entry per severity 1-5.

Two tables, copied from the authors' generation scripts (github.com/hendrycks/robustness,
``ImageNet-C/create_c/``): ``CIFAR_C`` from ``make_cifar_c.py`` (32 × 32 images: CIFAR-10-C / CIFAR-100-C)
and ``IMAGENET_C`` from ``make_imagenet_c.py`` (224 × 224 images after ``Resize(256)``,
``CenterCrop(224)``: ImageNet-C). The tuples keep the scripts' order of arguments; the corruption
functions in :mod:`hf_calibration.shift.corruptions` name each field.

Besides the per-severity values, ``REFERENCE_SIZE`` is the image side the table was written for, and
``FROST_SCALE`` the factor by which the frost textures are resized before cropping (``make_cifar_c.py``
shrinks them 5×, ``make_imagenet_c.py`` does not).
"""

from __future__ import annotations

import numpy as np

BENCHMARK_CORRUPTIONS = (  # the 15 of the benchmark, in the papers' order: noise, blur, weather, digital
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "spatter", "saturate")  # the 4 held-out (validation) ones

_S32 = 32  # make_cifar_c.py: IMSIZE = 32 (elastic_transform)
_S244 = 244  # make_imagenet_c.py writes 244 where 224 was meant ("ultimately nothing is incorrect"); kept as published

CIFAR_C: dict[str, list] = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],  # std of N(0, c²) added to x in [0, 1]
    "shot_noise": [500, 250, 100, 75, 50],  # Poisson rate scale: Poisson(x·c) / c
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],  # salt-and-pepper fraction of values
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],  # (disk radius, alias blur σ)
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],  # (σ, max delta, iterations)
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],  # (radius, σ)
    "zoom_blur": [
        np.arange(1, 1.06, 0.01),
        np.arange(1, 1.11, 0.01),
        np.arange(1, 1.16, 0.01),
        np.arange(1, 1.21, 0.01),
        np.arange(1, 1.26, 0.01),
    ],  # zoom factors averaged  # fmt: skip
    "snow": [
        (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
        (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
    ],  # fmt: skip
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],  # (image weight, frost weight)
    "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],  # (fog strength, wibble decay)
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],  # added to V in HSV
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],  # (x - mean)·c + mean
    "elastic_transform": [
        (_S32 * 0, _S32 * 0, _S32 * 0.08),
        (_S32 * 0.05, _S32 * 0.2, _S32 * 0.07),
        (_S32 * 0.08, _S32 * 0.06, _S32 * 0.06),
        (_S32 * 0.1, _S32 * 0.04, _S32 * 0.05),
        (_S32 * 0.1, _S32 * 0.03, _S32 * 0.03),
    ],  # (α, σ, affine jitter)  # fmt: skip
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],  # box-downsample factor
    "jpeg_compression": [80, 65, 58, 50, 40],  # JPEG quality
    "speckle_noise": [0.06, 0.1, 0.12, 0.16, 0.2],  # std of the multiplicative noise
    "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1],  # σ
    "spatter": [
        (0.62, 0.1, 0.7, 0.7, 0.5, 0),
        (0.65, 0.1, 0.8, 0.7, 0.5, 0),
        (0.65, 0.3, 1, 0.69, 0.5, 0),
        (0.65, 0.1, 0.7, 0.69, 0.6, 1),
        (0.65, 0.1, 0.5, 0.68, 0.6, 1),
    ],  # fmt: skip
    "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],  # S·c0 + c1 in HSV
}

IMAGENET_C: dict[str, list] = {
    "gaussian_noise": [0.08, 0.12, 0.18, 0.26, 0.38],
    "shot_noise": [60, 25, 12, 5, 3],
    "impulse_noise": [0.03, 0.06, 0.09, 0.17, 0.27],
    "defocus_blur": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
    "glass_blur": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
    "motion_blur": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],
    "zoom_blur": [
        np.arange(1, 1.11, 0.01),
        np.arange(1, 1.16, 0.01),
        np.arange(1, 1.21, 0.02),
        np.arange(1, 1.26, 0.02),
        np.arange(1, 1.31, 0.03),
    ],  # fmt: skip
    "snow": [
        (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
        (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
        (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
        (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
        (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
    ],  # fmt: skip
    "frost": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],
    "fog": [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],
    "brightness": [0.1, 0.2, 0.3, 0.4, 0.5],
    "contrast": [0.4, 0.3, 0.2, 0.1, 0.05],
    "elastic_transform": [
        (_S244 * 2, _S244 * 0.7, _S244 * 0.1),
        (_S244 * 2, _S244 * 0.08, _S244 * 0.2),
        (_S244 * 0.05, _S244 * 0.01, _S244 * 0.02),
        (_S244 * 0.07, _S244 * 0.01, _S244 * 0.02),
        (_S244 * 0.12, _S244 * 0.01, _S244 * 0.02),
    ],  # fmt: skip
    "pixelate": [0.6, 0.5, 0.4, 0.3, 0.25],
    "jpeg_compression": [25, 18, 15, 10, 7],
    "speckle_noise": [0.15, 0.2, 0.35, 0.45, 0.6],
    "gaussian_blur": [1, 2, 3, 4, 6],
    "spatter": [
        (0.65, 0.3, 4, 0.69, 0.6, 0),
        (0.65, 0.3, 3, 0.68, 0.6, 0),
        (0.65, 0.3, 2, 0.68, 0.5, 0),
        (0.65, 0.3, 1, 0.65, 1.5, 1),
        (0.67, 0.4, 1, 0.65, 1.5, 1),
    ],  # fmt: skip
    "saturate": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],
}

PRESETS = {"cifar": CIFAR_C, "imagenet": IMAGENET_C}
REFERENCE_SIZE = {"cifar": 32, "imagenet": 224}
FROST_SCALE = {"cifar": 0.2, "imagenet": 1.0}
