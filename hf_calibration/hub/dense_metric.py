"""``evaluate`` metrics of detectors and semantic segmenters: detection ECE, D-ECE, LaECE and pixel ECE.

As :mod:`hf_calibration.hub.evaluate_metric` does for the classification metrics, a bundled script
(``metric_scripts/<name>/<name>.py``) is :func:`dense_metric_class` with its name and card; ``_compute`` hands the
batches to the package's functions and returns their numbers bit for bit, refusing what they refuse with their
messages:

* ``detection_ece`` / ``d_ece`` / ``laece``: one example per image, ``predictions`` ``{"boxes": (M, 4) xyxy pixels,
  "scores": (M,), "labels": (M,)}`` and ``references`` ``{"boxes": (G, 4) xyxy pixels, "labels": (G,),
  "image_size": (height, width)}``; ``match_detections`` (IoU >= ``iou_threshold``, greedy by score within class, as
  COCO), then :func:`~hf_calibration.detection.detection_ece` / ``d_ece`` / ``laece`` at ``score_threshold``.
* ``pixel_ece``: one example per image, ``predictions`` the ``(K, H, W)`` logits or probabilities and ``references``
  the ``(H, W)`` label map (``ignore_index`` skipped); :func:`~hf_calibration.segmentation.pixel_calibration_report`
  over the images (one batch when they share a size, else streamed image by image in O(bins) memory). Every value
  goes through Arrow as float64 (exact); ``add_batch`` keeps every pixel on disk until ``compute``: for a large
  evaluation, feed ``PixelCalibrationAccumulator`` directly.
"""

from __future__ import annotations

from typing import Any

import datasets
import evaluate
import numpy as np

from hf_calibration.detection import d_ece, detection_ece, laece, match_detections
from hf_calibration.hub.evaluate_metric import metric_card_prose
from hf_calibration.segmentation import PixelCalibrationAccumulator, pixel_calibration_report

__all__ = ["DENSE_METRICS", "dense_metric_class"]

_BOXES = datasets.Sequence(datasets.Sequence(datasets.Value("float64")))
_DETECTION_FEATURES = datasets.Features(
    {
        "predictions": {
            "boxes": _BOXES,
            "scores": datasets.Sequence(datasets.Value("float64")),
            "labels": datasets.Sequence(datasets.Value("int64")),
        },
        "references": {
            "boxes": _BOXES,
            "labels": datasets.Sequence(datasets.Value("int64")),
            "image_size": datasets.Sequence(datasets.Value("float64")),
        },
    }
)
_PIXEL_FEATURES = datasets.Features(
    {
        "predictions": datasets.Sequence(datasets.Sequence(datasets.Sequence(datasets.Value("float64")))),
        "references": datasets.Sequence(datasets.Sequence(datasets.Value("int64"))),
    }
)
_DETECTION_ARGS = """Args:
    predictions (`list` of `dict`): per image, "boxes" (M, 4) xyxy in pixels, "scores" (M,) in [0, 1], "labels" (M,).
    references (`list` of `dict`): per image, "boxes" (G, 4) xyxy in pixels, "labels" (G,), "image_size"
        (height, width) in pixels.
    iou_threshold (`float`, defaults to 0.5): a detection is a true positive when it takes a ground truth of its class
        with IoU >= this (greedy by score within class, as COCO).
    score_threshold (`float`, defaults to 0.5): only detections scoring at least this count; every number is a
        statement about the detector at that threshold.
{extra}
Returns:
    {name} (`float`): a fraction in [0, 1].
"""
_PIXEL_ARGS = """Args:
    predictions (`list`): per image, the (K, H, W) logits or probabilities.
    references (`list`): per image, the (H, W) label map.
    n_bins (`int`, defaults to 15): number of confidence bins.
    ignore_index (`int` or `None`, defaults to 255): the label of pixels not counted.
    boundary_width (`int` or `None`, defaults to `None`): also the ECE of the pixels within this many pixels of a
        class edge (pixel_boundary_ece).
    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities, as the classification metrics do.

Returns:
    pixel_ece (`float`), pixel_adaece, pixel_classwise_ece, pixel_accuracy, pixel_pixels (and pixel_boundary_ece,
    pixel_boundary_pixels with `boundary_width`): pixel_calibration_report's values, prefixed.
"""
# name -> (function of the matched detections, its own arguments' documentation); "pixel_ece": the pixel report
DENSE_METRICS: dict[str, tuple[Any, str]] = {
    "detection_ece": (detection_ece, "    n_bins (`int`, defaults to 10): equal-width confidence bins."),
    "d_ece": (
        d_ece,
        "    n_bins (`int` or `list`, defaults to 5): bins per dimension (one count, or one per dimension).\n"
        '    features (`list`, defaults to ["cx", "cy", "w", "h"]): the box geometry binned with the confidence.',
    ),
    "laece": (laece, "    n_bins (`int`, defaults to 25): equal-width confidence bins per class."),
    "pixel_ece": (pixel_calibration_report, ""),
}


def _array(values: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    out = np.asarray(values, dtype=dtype)
    return out.reshape(shape) if out.size == 0 else out


class _DenseMetric(evaluate.Metric):
    """The script of ``metric_name`` (set by :func:`dense_metric_class`)."""

    metric_name: str = ""
    card: dict[str, Any] = {}

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=self.card["description"],
            citation=self.card["citation"],
            inputs_description=self.card["inputs"],
            features=_PIXEL_FEATURES if self.metric_name == "pixel_ece" else _DETECTION_FEATURES,
            reference_urls=self.card["reference_urls"],
        )

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch (``evaluate.Metric.add_batch``); empty predictions are refused."""
        if predictions is not None and len(predictions) == 0:
            raise ValueError(f"Expected `predictions` to be non-empty (at least one image), but got {predictions!r}.")
        super().add_batch(predictions=predictions, references=references, **kwargs)

    def _compute(self, predictions, references, **kwargs):
        if self.metric_name == "pixel_ece":
            return {f"pixel_{key}": value for key, value in pixel_report(predictions, references, **kwargs).items()}
        iou_threshold = kwargs.pop("iou_threshold", 0.5)
        preds = [
            {
                "boxes": _array(p["boxes"], (0, 4), np.float64),
                "scores": _array(p["scores"], (0,), np.float64),
                "labels": _array(p["labels"], (0,), np.int64),
            }
            for p in predictions
        ]
        target = [
            {"boxes": _array(t["boxes"], (0, 4), np.float64), "labels": _array(t["labels"], (0,), np.int64)}
            for t in references
        ]
        sizes = [tuple(t["image_size"]) for t in references]
        detections = match_detections(preds, target, iou_threshold=iou_threshold, image_sizes=sizes)
        return {self.metric_name: DENSE_METRICS[self.metric_name][0](detections, **kwargs)}


def pixel_report(predictions: list, references: list, **kwargs: Any) -> dict[str, float]:
    """``pixel_calibration_report`` of per-image (K, H, W) ``predictions`` and (H, W) ``references``: one batch when
    the images share a size, else ``PixelCalibrationAccumulator`` fed image by image."""
    preds = [np.asarray(p, dtype=np.float64) for p in predictions]
    target = [np.asarray(t, dtype=np.int64) for t in references]
    if len({p.shape for p in preds}) == 1 and len({t.shape for t in target}) == 1:
        return pixel_calibration_report(np.stack(preds), np.stack(target), **kwargs)
    if any(p.ndim != 3 for p in preds):
        raise ValueError(f"Expected each prediction of shape (K, H, W), but got {[p.shape for p in preds][:3]} ...")
    accumulator = PixelCalibrationAccumulator(preds[0].shape[0], **kwargs)
    for p, t in zip(preds, target):
        accumulator.update(p[None], t[None])
    return accumulator.compute()


def dense_metric_class(
    name: str, module: str, *, reference_urls: list[str] | None = None, class_name: str | None = None
) -> type[evaluate.Metric]:
    """The ``evaluate.Metric`` class of ``name`` (a key of :data:`DENSE_METRICS`), defined in the script ``module``
    (its ``__name__``); its description, example (a doctest) and citation are read from the metric card beside the
    script, as for the table's metrics; ``reference_urls`` complete it."""
    if name not in DENSE_METRICS:
        raise ValueError(f"Expected argument `name` to be one of {sorted(DENSE_METRICS)}, but got {name!r}.")
    function, extra = DENSE_METRICS[name]
    prose = metric_card_prose(name)
    inputs = _PIXEL_ARGS if name == "pixel_ece" else _DETECTION_ARGS.format(extra=extra, name=name)
    if prose["examples"]:
        inputs += f"\nExamples:\n{prose['examples']}"
    card = dict(
        description=prose["description"] or (function.__doc__ or "").split("\n\n")[0],
        citation=prose["citation"],
        inputs=inputs,
        reference_urls=list(reference_urls or []),
    )
    attributes = {"metric_name": name, "card": card, "__module__": module, "__doc__": card["description"] + inputs}
    return type(class_name or "".join(part.title() for part in name.split("_")), (_DenseMetric,), attributes)
