"""Matching detections to ground truth, as COCO does: per image and class, greedily by score, at IoU >= τ.

``match_detections`` takes the inputs torchmetrics' ``MeanAveragePrecision`` takes (one dict per image: ``boxes``
(M, 4) xyxy, ``scores`` (M,), ``labels`` (M,); targets ``boxes``, ``labels``) and returns one flat
:class:`Detections` record of every detection: its score, class, whether it is a true positive, its IoU with the
ground truth it matched and, when the image sizes are known, its box geometry (cx, cy, w, h) as fractions of the
image (Küppers et al. 2020, Sec. 3).

Documented handling of awkward inputs:

* an image with no predictions contributes nothing; an image with no ground truth makes every detection a false
  positive;
* a zero-area box (``x2 == x1`` or ``y2 == y1``) overlaps nothing (IoU 0), as in pycocotools: a zero-area
  detection is a false positive, a zero-area ground-truth box is never matched;
* a box partly outside its image is clipped to the image for its geometry features; a box wholly outside its
  image, an inverted box (``x2 < x1``), a NaN / inf coordinate or score, a score outside [0, 1] and a detection
  with ``preds[i]["logits"]`` of another width than the others raise ``ValueError`` naming the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numba
import numpy as np
import torch
from torchvision.ops import box_iou

__all__ = ["Detections", "match_detections"]


@dataclass(frozen=True)
class Detections:
    """Every detection of a data set, flat, after matching (arrays of length N, float64 unless stated).

    ``scores``: confidence; ``labels`` (int64): predicted class; ``matched`` (bool): a true positive at
    ``iou_threshold``; ``iou``: IoU with the matched ground truth (0 for a false positive); ``image`` (int64):
    which image; ``features``: (N, 4) cx, cy, w, h as fractions of the image (None without image sizes);
    ``logits``: (N, C) class logits where the predictions carried them, else None; ``num_ground_truth``: the
    number of ground-truth boxes (all classes); ``score_threshold``: the lowest score kept (0 before ``above``).
    """

    scores: np.ndarray
    labels: np.ndarray
    matched: np.ndarray
    iou: np.ndarray
    image: np.ndarray
    features: np.ndarray | None
    logits: np.ndarray | None
    iou_threshold: float
    num_ground_truth: int
    score_threshold: float = 0.0

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def select(self, keep: Any, **changes: Any) -> Detections:
        """The detections where ``keep`` (a boolean mask or indices) selects them."""

        def cut(a):
            return None if a is None else a[keep]

        fields = dict(
            scores=self.scores[keep],
            labels=self.labels[keep],
            matched=self.matched[keep],
            iou=self.iou[keep],
            image=self.image[keep],
            features=cut(self.features),
            logits=cut(self.logits),
        )
        fields.update(changes)
        return replace(self, **fields)

    def above(self, score_threshold: float) -> Detections:
        """The detections with ``score >= score_threshold``. Greedy matching by score makes this equal to matching
        only those detections: a lower-scored detection never takes a ground truth from a higher-scored one."""
        threshold = _check_threshold(score_threshold, "score_threshold")
        if threshold <= self.score_threshold or (self.scores.size and self.scores.min() >= threshold):
            return replace(self, score_threshold=max(threshold, self.score_threshold))  # every detection stays: no copy
        return self.select(self.scores >= threshold, score_threshold=max(threshold, self.score_threshold))

    def with_scores(self, scores: Any) -> Detections:
        """The same detections with new (e.g. calibrated) scores, matches unchanged (``score_threshold`` back to 0)."""
        new = np.asarray(scores, dtype=np.float64).reshape(-1)
        if new.shape[0] != len(self):
            raise ValueError(f"Expected `scores` to have {len(self)} values, but got {new.shape[0]}.")
        _check_scores(new, "scores")
        return replace(self, scores=new, score_threshold=0.0)  # a threshold on the old scores says nothing of the new


def _check_threshold(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not 0 <= value <= 1:
        raise ValueError(f"Expected argument `{name}` to be a number in [0, 1], but got {value!r}.")
    return float(value)


def _check_scores(scores: np.ndarray, name: str) -> None:
    if not np.isfinite(scores).all():
        raise ValueError(f"Expected `{name}` to be finite, but it holds NaN or inf.")
    if scores.size and (scores.min() < 0 or scores.max() > 1):
        raise ValueError(
            f"Expected `{name}` to be scores in [0, 1], but got values in [{scores.min()}, {scores.max()}]."
        )


def _array(entry: dict, key: str, name: str, dtype, ndim: int, width: int | None = None) -> np.ndarray:
    if not isinstance(entry, dict) or key not in entry:
        raise ValueError(f"Expected `{name}` to be a dict with a `{key}` entry.")
    value = entry[key]
    a = (value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)).astype(dtype)
    if a.size == 0:
        a = a.reshape((0,) if ndim == 1 else (0, width or 0))
    if a.ndim != ndim or (width is not None and a.shape[1] != width):
        shape = "(M,)" if ndim == 1 else f"(M, {width or 'C'})"
        raise ValueError(f"Expected `{name}[{key!r}]` of shape {shape}, but got {tuple(a.shape)}.")
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        raise ValueError(f"Expected `{name}[{key!r}]` to be finite, but it holds NaN or inf.")
    return a


def _check_boxes(boxes: np.ndarray, name: str) -> None:
    if (boxes[:, 2] < boxes[:, 0]).any() or (boxes[:, 3] < boxes[:, 1]).any():
        raise ValueError(
            f"Expected `{name}['boxes']` as (x1, y1, x2, y2) with x2 >= x1 and y2 >= y1, but a box is inverted."
        )


@numba.njit(cache=True, nogil=True)
def _greedy(iou, threshold, out):  # pragma: no cover - compiled
    """pycocotools' ``evaluateImg`` loop: detections in score order take the free ground truth of highest IoU
    (ties: the last), if that IoU >= ``threshold``; ``iou`` is -1 across classes."""
    n_det, n_gt = iou.shape
    taken = np.zeros(n_gt, np.bool_)
    for d in range(n_det):
        best = min(threshold, 1 - 1e-10)
        m = -1
        for g in range(n_gt):
            if taken[g] or iou[d, g] < best:
                continue
            best = iou[d, g]
            m = g
        out[d] = m
        if m >= 0:
            taken[m] = True


def _features(boxes: np.ndarray, size: Any, name: str) -> np.ndarray:
    height, width = (float(v) for v in size)
    if not (height > 0 and width > 0):
        raise ValueError(f"Expected `image_sizes` entries (height, width) > 0, but got {tuple(size)} for {name}.")
    outside = (boxes[:, 0] >= width) | (boxes[:, 2] <= 0) | (boxes[:, 1] >= height) | (boxes[:, 3] <= 0)
    outside &= (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    if outside.any():
        raise ValueError(
            f"Expected `{name}['boxes']` inside the image of size {(height, width)}, but box "
            f"{boxes[np.flatnonzero(outside)[0]].tolist()} lies wholly outside it (absolute xyxy pixels are expected)."
        )
    x1, x2 = np.clip(boxes[:, 0], 0, width), np.clip(boxes[:, 2], 0, width)
    y1, y2 = np.clip(boxes[:, 1], 0, height), np.clip(boxes[:, 3], 0, height)
    return np.stack([(x1 + x2) / (2 * width), (y1 + y2) / (2 * height), (x2 - x1) / width, (y2 - y1) / height], 1)


def match_detections(
    preds: Sequence[dict],
    target: Sequence[dict],
    *,
    iou_threshold: float = 0.5,
    image_sizes: Sequence[Any] | None = None,
) -> Detections:
    """Match each image's detections to its ground truth, per class, greedily by descending score (COCO).

    Args:
        preds: one dict per image with ``boxes`` (M, 4) xyxy, ``scores`` (M,) in [0, 1], ``labels`` (M,), and
            optionally ``logits`` (M, C) (the class logits a score-only calibrator refits).
        target: one dict per image with ``boxes`` (G, 4) xyxy and ``labels`` (G,).
        iou_threshold: a detection is a true positive when it takes a ground truth of its class with IoU >= this.
        image_sizes: (height, width) per image, to give each detection its geometry (cx, cy, w, h) as fractions
            of the image (needed by the box-conditioned metrics and calibrators).

    Example:
        >>> import torch
        >>> preds = [{"boxes": torch.tensor([[0.0, 0, 10, 10], [0, 0, 9, 10]]), "scores": torch.tensor([0.9, 0.8]),
        ...           "labels": torch.tensor([1, 1])}]
        >>> target = [{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "labels": torch.tensor([1])}]
        >>> match_detections(preds, target).matched.tolist()
        [True, False]
    """
    threshold = _check_threshold(iou_threshold, "iou_threshold")
    if not isinstance(preds, Sequence) or not isinstance(target, Sequence) or len(preds) != len(target):
        raise ValueError("Expected `preds` and `target` to be lists of one dict per image, of equal length.")
    if image_sizes is not None and len(image_sizes) != len(preds):
        raise ValueError(f"Expected one `image_sizes` entry per image ({len(preds)}), but got {len(image_sizes)}.")
    parts: dict[str, list] = {k: [] for k in ("scores", "labels", "matched", "iou", "image", "features", "logits")}
    num_gt = 0
    logit_width = None
    for i, (p, t) in enumerate(zip(preds, target)):
        p_name, t_name = f"preds[{i}]", f"target[{i}]"
        boxes = _array(p, "boxes", p_name, np.float64, 2, 4)
        scores = _array(p, "scores", p_name, np.float64, 1)
        labels = _array(p, "labels", p_name, np.int64, 1)
        gt_boxes = _array(t, "boxes", t_name, np.float64, 2, 4)
        gt_labels = _array(t, "labels", t_name, np.int64, 1)
        if not (boxes.shape[0] == scores.shape[0] == labels.shape[0]):
            raise ValueError(
                f"Expected `{p_name}` boxes, scores and labels of one length, but got "
                f"{boxes.shape[0]}, {scores.shape[0]}, {labels.shape[0]}."
            )
        if gt_boxes.shape[0] != gt_labels.shape[0]:
            raise ValueError(
                f"Expected `{t_name}` boxes and labels of one length, but got {gt_boxes.shape[0]}, {gt_labels.shape[0]}."
            )
        _check_scores(scores, f"{p_name}['scores']")
        _check_boxes(boxes, p_name)
        _check_boxes(gt_boxes, t_name)
        if "logits" in p:
            logits = _array(p, "logits", p_name, np.float64, 2)
            if logits.shape[0] != scores.shape[0] or (logit_width is not None and logits.shape[1] != logit_width):
                raise ValueError(
                    f"Expected `{p_name}['logits']` of shape ({scores.shape[0]}, {logit_width or 'C'}), but got {logits.shape}."
                )
            logit_width = logits.shape[1]
            parts["logits"].append(logits)
        elif parts["logits"]:
            raise ValueError(f"Expected `{p_name}` to carry `logits` as the earlier images do.")
        num_gt += gt_boxes.shape[0]
        order = np.argsort(-scores, kind="mergesort")  # pycocotools' order: stable, by descending score
        iou = box_iou(torch.from_numpy(boxes[order]), torch.from_numpy(gt_boxes)).numpy()
        iou = np.nan_to_num(iou, nan=0.0)  # two zero-area boxes: 0 / 0
        iou[labels[order][:, None] != gt_labels[None, :]] = -1.0
        taken = np.empty(order.shape[0], np.int64)
        _greedy(np.ascontiguousarray(iou), threshold, taken)
        matched = np.zeros(order.shape[0], bool)
        best = np.zeros(order.shape[0])
        matched[order] = taken >= 0
        if gt_boxes.shape[0]:
            best[order] = np.where(taken >= 0, iou[np.arange(order.shape[0]), np.maximum(taken, 0)], 0.0)
        parts["scores"].append(scores)
        parts["labels"].append(labels)
        parts["matched"].append(matched)
        parts["iou"].append(best)
        parts["image"].append(np.full(scores.shape[0], i, np.int64))
        if image_sizes is not None:
            _features(gt_boxes, image_sizes[i], t_name)  # the ground truth must lie in its image too
            parts["features"].append(_features(boxes, image_sizes[i], p_name))
    if parts["logits"] and len(parts["logits"]) != len(preds):
        raise ValueError("Expected `logits` in every `preds` entry or in none.")

    def cat(key, dtype, width=None):
        if not parts[key]:
            return np.zeros((0,) if width is None else (0, width), dtype)
        return np.concatenate(parts[key]).astype(dtype)

    return Detections(
        scores=cat("scores", np.float64),
        labels=cat("labels", np.int64),
        matched=cat("matched", bool),
        iou=cat("iou", np.float64),
        image=cat("image", np.int64),
        features=cat("features", np.float64, 4) if image_sizes is not None else None,
        logits=cat("logits", np.float64) if parts["logits"] else None,
        iou_threshold=threshold,
        num_ground_truth=num_gt,
    )
