"""Serving calibrated detectors and segmenters: a temperature on the head's logits, attached to the model.

``attach_logit_calibrator(model, calibrator)`` adds a forward hook that replaces ``outputs.logits`` by calibrated
logits, so that ``transformers.pipeline("object-detection", model=model, ...)`` and
``post_process_object_detection`` / ``post_process_semantic_segmentation`` report calibrated scores (and
``model(...).logits`` are calibrated probability maps):

* ``DetectionTemperatureScaling``: ``z / T`` on the class logits of a DETR-style head (every query);
* a package calibrator fitted on pixel rows (``TemperatureScaling().fit(*pixel_rows(...))``): applied per pixel;
* ``LocalTemperatureScaling``: ``z / T(x)``, the image read from the call's ``pixel_values`` resized to the logits.

The score maps that need a detection's box or post-processed score (Platt, isotonic, box logistic) act on the
pipeline's results instead: ``calibrate_results(results, calibrator, image_size)``. ``detach_logit_calibrator``
removes the hook.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration.detection import DetectionTemperatureScaling
from hf_calibration.detection.calibrators import DetectionCalibrator
from hf_calibration.segmentation import LocalTemperatureScaling, calibrate_pixels

__all__ = ["attach_logit_calibrator", "calibrate_results", "detach_logit_calibrator"]

_HOOK = "_hf_calibration_logit_hook"


def _calibrated(calibrator: Any, logits: torch.Tensor, pixel_values: torch.Tensor | None) -> torch.Tensor:
    if isinstance(calibrator, DetectionTemperatureScaling):
        return logits / calibrator.log_temperature.detach().exp().to(logits.dtype)
    if isinstance(calibrator, LocalTemperatureScaling):
        image = None
        if calibrator.image_channels:
            if pixel_values is None:
                raise ValueError(
                    "Expected the model to be called with `pixel_values` (the image LocalTemperatureScaling reads)."
                )
            image = nn.functional.interpolate(
                pixel_values.to(logits.dtype), size=logits.shape[-2:], mode="bilinear", align_corners=False
            )
        return calibrator(logits, image).to(logits.dtype)
    if logits.ndim == 4:
        return calibrate_pixels(calibrator, logits).to(logits.dtype)
    raise TypeError(
        f"Expected a DetectionTemperatureScaling, LocalTemperatureScaling or pixel-row calibrator, but got {type(calibrator).__name__}."
    )


def attach_logit_calibrator(model: nn.Module, calibrator: Any) -> nn.Module:
    """Make ``model``'s ``outputs.logits`` calibrated (see the module docstring); returns the model."""
    if isinstance(calibrator, DetectionCalibrator) and not isinstance(calibrator, DetectionTemperatureScaling):
        raise TypeError(
            f"Expected a map of logits, but {type(calibrator).__name__} maps post-processed scores: use `calibrate_results`."
        )
    detach_logit_calibrator(model)

    def hook(module, args, kwargs, outputs):
        pixel_values = kwargs.get("pixel_values", args[0] if args else None)
        outputs.logits = _calibrated(calibrator, outputs.logits, pixel_values)
        return outputs

    model.__dict__[_HOOK] = model.register_forward_hook(hook, with_kwargs=True)
    return model


def detach_logit_calibrator(model: nn.Module) -> nn.Module:
    """Remove the hook ``attach_logit_calibrator`` added (nothing when there is none)."""
    handle = model.__dict__.pop(_HOOK, None)
    if handle is not None:
        handle.remove()
    return model


def calibrate_results(
    results: list[dict],
    calibrator: DetectionCalibrator,
    image_size: tuple[int, int],
    label2id: dict[str, int] | None = None,
) -> list[dict]:
    """An object-detection pipeline's results for one image (``score``, ``label``, ``box`` with xmin / ymin / xmax /
    ymax) with calibrated scores (the pipeline's own kept as ``uncalibrated_score``); ``image_size`` is (height,
    width); ``label2id`` (``model.config.label2id``) is needed by the per-class isotonic map."""
    if not results:
        return []
    if "labels" in calibrator.needs and label2id is None:
        raise ValueError(
            f"Expected `label2id` (the model config's) for {type(calibrator).__name__}, which maps each class apart."
        )

    boxes = np.array([[r["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")] for r in results], dtype=np.float64)
    height, width = image_size
    x1, x2 = boxes[:, 0].clip(0, width), boxes[:, 2].clip(0, width)
    y1, y2 = boxes[:, 1].clip(0, height), boxes[:, 3].clip(0, height)
    features = np.stack([(x1 + x2) / (2 * width), (y1 + y2) / (2 * height), (x2 - x1) / width, (y2 - y1) / height], 1)
    labels = np.array([label2id[r["label"]] if label2id else 0 for r in results], dtype=np.int64)
    scores = calibrator(np.array([r["score"] for r in results]), labels, features).numpy()
    return [{**r, "score": float(s), "uncalibrated_score": r["score"]} for r, s in zip(results, scores)]
