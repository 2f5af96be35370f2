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

A model folder (or Hub repo) holding a detector or a semantic segmenter and, in ``calibrator/``, its calibrator is
loaded by ``hf_calibration.load_calibrated_model`` / ``hf_calibration.pipeline`` (the task read by
``hf_calibration._core.tasks.dense_task_of_config``) through what this module adds: ``load_dense_calibrator`` (any
detection or segmentation calibrator, or a package calibrator fitted on pixel rows), ``serve_calibrator`` and the two
pipeline classes of ``calibrated_pipeline_class``:

* object detection: transformers' output (``score``, ``label``, ``box``) with calibrated scores. The detector's
  post-processing runs at threshold 0, the calibrator maps every detection's score, and the pipeline's ``threshold``
  (default 0.5) is applied to the *calibrated* score; the detections keep the post-processor's order (as
  transformers'), boxes and labels unchanged. A temperature on the logits is applied by the hook instead, so
  ``model(...).logits`` are calibrated too.
* semantic segmentation: transformers' masks, each with ``score``, the mean calibrated probability of its class over
  its pixels (transformers gives None), and ``probabilities``, the calibrated probability map of its class (float32,
  the image's size: the calibrated logits upsampled as ``post_process_semantic_segmentation`` does, then softmax).
  The masks are those of the calibrated logits (a temperature, local or not, keeps every pixel's class).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.tasks import DENSE_TASKS
from hf_calibration.detection import DetectionTemperatureScaling
from hf_calibration.detection.calibrators import DetectionCalibrator
from hf_calibration.segmentation import LocalTemperatureScaling, calibrate_pixels

__all__ = [
    "attach_logit_calibrator",
    "calibrate_results",
    "calibrated_pipeline_class",
    "detach_logit_calibrator",
    "load_dense_calibrator",
    "serve_calibrator",
    "served_calibrator",
]

_HOOK = "_hf_calibration_logit_hook"
_SERVED = "hf_calibration_calibrator"  # the calibrator a loaded model serves (a plain attribute, not a submodule)


def load_dense_calibrator(folder: Any, **kwargs: Any) -> nn.Module:
    """The calibrator saved in ``folder``: a detection calibrator, ``LocalTemperatureScaling``, or a package
    calibrator fitted on pixel rows (``load_calibrator``), by the kind its ``config.json`` names."""
    import json
    from pathlib import Path

    from hf_calibration.calibrators import load_calibrator
    from hf_calibration.detection import load_detection_calibrator
    from hf_calibration.detection.calibrators import DETECTION_CALIBRATORS

    try:
        kind = json.loads((Path(folder) / "config.json").read_text()).get("calibrator")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind in DETECTION_CALIBRATORS:
        return load_detection_calibrator(folder, **kwargs)
    if kind == LocalTemperatureScaling.kind:
        return LocalTemperatureScaling.from_pretrained(folder, **kwargs)
    return load_calibrator(folder, **kwargs)


def served_calibrator(model: nn.Module) -> Any:
    """The calibrator ``load_calibrated_model`` loaded with a detector or segmenter (None: none)."""
    return model.__dict__.get(_SERVED)


def serve_calibrator(model: nn.Module, calibrator: Any, task: str) -> nn.Module:
    """Make ``model`` serve ``calibrator`` for ``task``: a map of logits is attached with the hook; a map of
    post-processed scores is kept for the pipeline (``served_calibrator``). A calibrator of another task or of
    another number of classes than the model's ``config.num_labels`` is refused."""
    num_labels = getattr(getattr(model, "config", None), "num_labels", None)
    is_detection = isinstance(calibrator, DetectionCalibrator)
    if is_detection != (task == "object-detection"):
        raise ValueError(
            f"Expected a calibrator for {task}, but the model's calibrator/ holds a {type(calibrator).__name__}."
        )
    classes = getattr(calibrator, "num_classes", None)
    if classes is None and not is_detection:
        classes = (getattr(calibrator, "fit_info_", None) or {}).get("num_classes")
    if isinstance(classes, int) and isinstance(num_labels, int) and classes != num_labels:
        raise ValueError(
            f"The {type(calibrator).__name__} in calibrator/ was fitted on {classes} classes, but the model has "
            f"{num_labels} (config.num_labels): it belongs to another model."
        )
    if not is_detection or isinstance(calibrator, DetectionTemperatureScaling):
        attach_logit_calibrator(model, calibrator)
    model.__dict__[_SERVED] = calibrator
    return model


def _geometry(boxes: np.ndarray, height: float, width: float) -> np.ndarray:
    """(N, 4) cx, cy, w, h as fractions of the image, the boxes (x1, y1, x2, y2 pixels) clipped to it."""
    x1, x2 = boxes[:, 0].clip(0, width), boxes[:, 2].clip(0, width)
    y1, y2 = boxes[:, 1].clip(0, height), boxes[:, 3].clip(0, height)
    return np.stack([(x1 + x2) / (2 * width), (y1 + y2) / (2 * height), (x2 - x1) / width, (y2 - y1) / height], 1)


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
    features = _geometry(boxes, *image_size)
    labels = np.array([label2id[r["label"]] if label2id else 0 for r in results], dtype=np.int64)
    scores = calibrator(np.array([r["score"] for r in results]), labels, features).numpy()
    return [{**r, "score": float(s), "uncalibrated_score": r["score"]} for r, s in zip(results, scores)]


_PIPELINES: dict[str, type] = {}  # built on first use: transformers' pipelines take seconds to import


def calibrated_pipeline_class(task: str) -> type:
    """The transformers pipeline class that serves calibrated results for ``task`` (a key of :data:`DENSE_TASKS`):
    ``ObjectDetectionPipeline`` / ``ImageSegmentationPipeline`` with a calibrated ``postprocess``."""
    if task not in DENSE_TASKS:
        raise ValueError(f"Expected argument `task` to be one of {sorted(DENSE_TASKS)}, but got {task!r}.")
    if _PIPELINES:
        return _PIPELINES[task]
    from transformers import ImageSegmentationPipeline, ObjectDetectionPipeline

    class _Detection(ObjectDetectionPipeline):
        """transformers' object-detection pipeline whose ``score``s are calibrated (module docstring)."""

        def postprocess(self, model_outputs, threshold=0.5):
            calibrator = served_calibrator(self.model)
            if calibrator is None or isinstance(calibrator, DetectionTemperatureScaling) or self.tokenizer is not None:
                return super().postprocess(model_outputs, threshold)  # the logits are calibrated by the hook
            target_size = model_outputs["target_size"]
            raw = self.image_processor.post_process_object_detection(model_outputs, 0.0, target_size)[0]
            if raw["scores"].numel() == 0:
                return []
            boxes = raw["boxes"].detach().double().cpu()
            labels = raw["labels"].cpu().numpy()
            height, width = (float(v) for v in target_size[0].tolist())
            scores = calibrator(
                raw["scores"].double().cpu().clamp(0, 1), labels, _geometry(boxes.numpy(), height, width)
            )
            return [
                {"score": float(s), "label": self.model.config.id2label[int(c)], "box": self._get_bounding_box(b)}
                for s, c, b in zip(scores.tolist(), labels, boxes)
                if s > threshold
            ]

    class _Segmentation(ImageSegmentationPipeline):
        """transformers' image-segmentation pipeline with calibrated scores and probability maps (module docstring)."""

        def postprocess(self, model_outputs, subtask=None, **kwargs):
            annotation = super().postprocess(model_outputs, subtask, **kwargs)
            logits = model_outputs.get("logits")
            if logits is None or logits.ndim != 4 or not annotation or annotation[0]["score"] is not None:
                return annotation  # not the semantic path (panoptic / instance heads score their own segments)
            size = [int(v) for v in model_outputs["target_size"][0]]
            up = nn.functional.interpolate(logits[:1].float(), size=size, mode="bilinear", align_corners=False)
            probs = up[0].softmax(0)
            label2id = {v: k for k, v in self.model.config.id2label.items()}
            for entry in annotation:
                p = probs[int(label2id[entry["label"]])]
                mask = torch.from_numpy(np.asarray(entry["mask"]) > 0)
                entry["score"] = float(p[mask].double().mean())
                entry["probabilities"] = p.numpy()
            return annotation

    _PIPELINES.update({"object-detection": _Detection, "image-segmentation": _Segmentation})
    return _PIPELINES[task]
