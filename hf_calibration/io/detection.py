"""Detections and pixel logits of Hugging Face detectors and segmenters over a ``datasets`` set.

``predict_detections`` runs an ``AutoModelForObjectDetection`` with its own image processor and
``post_process_object_detection`` and returns what :func:`~hf_calibration.detection.match_detections` takes:
predictions (with each detection's class logits, for temperature scaling, where the head scores each query by its
best class as DETR and YOLOS do), COCO-style targets (``objects`` with ``bbox`` [x, y, w, h] in pixels and
``category``), and the image sizes. ``stream_pixel_metrics`` runs an ``AutoModelForSemanticSegmentation`` (or a
universal head: MaskFormer, Mask2Former, OneFormer), takes its pixel logits at each mask's size as
``post_process_semantic_segmentation`` does (``pixel_logits``), and feeds a
:class:`~hf_calibration.segmentation.PixelCalibrationAccumulator` batch by batch (masks stored as images).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration.segmentation import PixelCalibrationAccumulator

__all__ = ["pixel_logits", "predict_detections", "stream_pixel_metrics"]


def _rgb(image: Any):
    return image.convert("RGB") if hasattr(image, "convert") else image


def _size(image: Any) -> tuple[int, int]:
    if hasattr(image, "size") and not isinstance(image, (np.ndarray, torch.Tensor)):
        width, height = image.size
        return height, width
    return tuple(np.asarray(image).shape[:2])


def _query_scores(logits: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    if activation == "softmax":
        return logits.softmax(-1)[..., :-1].max(-1)
    return logits.sigmoid().max(-1)


@torch.inference_mode()
def predict_detections(
    model: nn.Module,
    processor: Any,
    dataset: Any,
    *,
    image_column: str = "image",
    objects_column: str = "objects",
    threshold: float = 0.0,
    batch_size: int = 8,
    activation: str = "softmax",
) -> tuple[list[dict], list[dict], list[tuple[int, int]]]:
    """``(preds, target, image_sizes)`` of ``model`` over ``dataset`` (see the module docstring). ``threshold``: the
    lowest score ``post_process_object_detection`` keeps; ``activation``: how the head scores a query
    ("softmax" with a last "no object" logit: DETR, YOLOS; "sigmoid"). Each prediction carries ``logits`` when the
    processor's scores are those of the queries under ``activation`` (otherwise none do)."""
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"Expected argument `activation` to be 'softmax' or 'sigmoid', but got {activation!r}.")
    for column in (image_column, objects_column):
        if column not in dataset.column_names:
            raise ValueError(f"Expected a `{column}` column in the dataset, but it has {dataset.column_names}.")
    model.eval()
    device = next(model.parameters()).device
    preds, target, sizes = [], [], []
    with_logits = True
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        images = [_rgb(im) for im in rows[image_column]]
        batch_sizes = [_size(im) for im in images]
        inputs = processor(images=images, return_tensors="pt").to(device)
        outputs = model(**inputs)
        results = processor.post_process_object_detection(outputs, threshold=threshold, target_sizes=batch_sizes)
        scores, _ = _query_scores(outputs.logits, activation)
        for b, (res, objects) in enumerate(zip(results, rows[objects_column])):
            keep = scores[b] > threshold
            entry = {
                key: res[key].detach().cpu().double() if key != "labels" else res[key].cpu()
                for key in ("boxes", "scores", "labels")
            }
            if (
                with_logits
                and keep.sum() == entry["scores"].shape[0]
                and torch.allclose(scores[b][keep].double().cpu(), entry["scores"])
            ):
                entry["logits"] = outputs.logits[b][keep].detach().cpu().double()
            else:
                with_logits = False
            preds.append(entry)
            xywh = torch.as_tensor(np.asarray(objects["bbox"], dtype=np.float64).reshape(-1, 4))
            target.append(
                {
                    "boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1),
                    "labels": torch.as_tensor(objects["category"], dtype=torch.int64),
                }
            )
        sizes += batch_sizes
    if not with_logits:
        for entry in preds:
            entry.pop("logits", None)
    return preds, target, sizes


@torch.inference_mode()
def pixel_logits(model: nn.Module, processor: Any, images: list, sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Each image's ``(1, K, H, W)`` logits at its size: a semantic head's logits upsampled (bilinear, as
    ``post_process_semantic_segmentation`` does); for a universal head (MaskFormer, Mask2Former, OneFormer: class and
    mask logits per query), the log of the class-probability map its processor's ``post_process_semantic_segmentation``
    takes the argmax of (``return_segmentation_scores=True``: ``sum_q p_q(k) sigmoid(m_q)``), normalised over the
    classes, so that its softmax is that map and its argmax the processor's segmentation."""
    model.eval()
    device = next(model.parameters()).device
    inputs = processor(images=[_rgb(im) for im in images], return_tensors="pt").to(device)
    outputs = model(**inputs)
    if getattr(outputs, "class_queries_logits", None) is not None:
        post = processor.post_process_semantic_segmentation
        if "return_segmentation_scores" not in inspect.signature(post).parameters:
            raise ValueError(
                f"{type(model).__name__} is a universal segmentation head: its pixel probabilities come from its "
                "processor's post_process_semantic_segmentation(..., return_segmentation_scores=True), which this "
                "transformers release does not have (5.25 has it)."
            )
        scores = [out.segmentation_scores for out in post(outputs, target_sizes=sizes, return_segmentation_scores=True)]
        return [torch.log(s / s.sum(0, keepdim=True)).unsqueeze(0) for s in scores]
    return [
        nn.functional.interpolate(outputs.logits[i : i + 1], size=size, mode="bilinear", align_corners=False)
        for i, size in enumerate(sizes)
    ]


def stream_pixel_metrics(
    model: nn.Module,
    processor: Any,
    dataset: Any,
    *,
    image_column: str = "image",
    mask_column: str = "mask",
    batch_size: int = 8,
    accumulator: PixelCalibrationAccumulator | None = None,
    calibrate: Any = None,
    **accumulator_kwargs: Any,
) -> PixelCalibrationAccumulator:
    """Feed ``model``'s pixel logits over ``dataset`` into ``accumulator`` (a new one with ``accumulator_kwargs``
    when None) without holding them; ``calibrate``: an optional map of (1, K, H, W) logits applied first."""
    for column in (image_column, mask_column):
        if column not in dataset.column_names:
            raise ValueError(f"Expected a `{column}` column in the dataset, but it has {dataset.column_names}.")
    if accumulator is None:
        accumulator = PixelCalibrationAccumulator(model.config.num_labels, **accumulator_kwargs)
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        masks = [torch.as_tensor(np.array(m), dtype=torch.int64) for m in rows[mask_column]]
        for z, mask in zip(pixel_logits(model, processor, rows[image_column], [tuple(m.shape) for m in masks]), masks):
            accumulator.update(calibrate(z) if calibrate is not None else z, mask.unsqueeze(0))
    return accumulator
