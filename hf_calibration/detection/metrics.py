"""Calibration of detection scores: detection ECE / D-ECE (Küppers et al. 2020) and LaECE (Oksuz et al. 2023).

All take the :class:`~hf_calibration.detection.matching.Detections` that ``match_detections`` returns and a
``score_threshold``: only detections scoring at least that count, and every number is a statement about the
detector *at that threshold* (Kuzucu et al. 2024).

* **D-ECE** (Küppers et al. 2020, eq. 5): the detections are binned jointly over the confidence and, optionally,
  the box geometry (cx, cy, w, h as fractions of the image), ``n_bins`` equal-width bins per dimension on [0, 1];
  ``D-ECE = sum_b |B_b| / N * |precision(b) - confidence(b)|`` with ``precision(b)`` the share of true positives in
  bin ``b``. With no geometry this is the detection ECE (precision against confidence). It is netcal's
  ``ECE(bins, detection=True)``; the bin edges follow the package's rule (``lo < x <= hi``, 0 in the first bin),
  where numpy's histogram (netcal) puts a value lying exactly on an inner edge in the upper bin.
* **LaECE** (Oksuz et al. 2023, eq. 4): per class ``c``, ``sum_j |D_j^c| / |D^c| * |mean confidence -
  mean(tp_i * IoU_i)|`` over ``n_bins`` (25 in the paper) equal-width confidence bins, ``IoU_i`` the IoU of a true
  positive with its ground truth (0 for a false positive); then the mean over the classes that have detections.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from hf_calibration._core.bins import uniform_bin, uniform_bin_index, uniform_edges
from hf_calibration.detection.matching import Detections, _check_threshold

__all__ = [
    "BOX_FEATURES",
    "d_ece",
    "detection_calibration_report",
    "detection_ece",
    "detection_reliability",
    "laece",
    "ranking_ap",
]

BOX_FEATURES = ("cx", "cy", "w", "h")


def _check_n_bins(n_bins: Any, dims: int) -> tuple[int, ...]:
    bins = (n_bins,) * dims if isinstance(n_bins, (int, np.integer)) and not isinstance(n_bins, bool) else tuple(n_bins)
    if len(bins) != dims or not all(
        isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1 for b in bins
    ):
        raise ValueError(f"Expected argument `n_bins` to be an integer >= 1 or {dims} of them, but got {n_bins!r}.")
    return tuple(int(b) for b in bins)


def _kept(detections: Any, score_threshold: float) -> Detections:
    if not isinstance(detections, Detections):
        raise TypeError(f"Expected `detections` from `match_detections`, but got {type(detections).__name__}.")
    kept = detections.above(score_threshold)
    if len(kept) == 0:
        raise ValueError(f"Expected at least one detection with score >= {score_threshold}, but there are none.")
    return kept


@numba.njit(cache=True, nogil=True)
def _joint_gap_sums(scores, features, columns, edges, n_bins, target, out):  # pragma: no cover - compiled
    """The joint bin of each detection (confidence, then ``features[:, columns]``; ``uniform_bin``'s rule in every
    dimension, ``edges[d, : n_bins[d] + 1]``), one dimension at a time, then per bin ``out[b, 0] += target``,
    ``out[b, 1] += score``."""
    n = scores.shape[0]
    index = np.empty(n, np.int64)
    row = edges[0, : n_bins[0] + 1]
    for i in range(n):
        index[i] = uniform_bin(scores[i], row)
    for d in range(columns.shape[0]):
        row, width, column = edges[d + 1, : n_bins[d + 1] + 1], n_bins[d + 1], columns[d]
        for i in range(n):
            index[i] = index[i] * width + uniform_bin(features[i, column], row)
    for i in range(n):
        out[index[i], 0] += target[i]
        out[index[i], 1] += scores[i]


def _gap_total(kept: Detections, features: Sequence[str], n_bins: tuple[int, ...], target: np.ndarray) -> float:
    """``sum_b |sum_{i in b} target_i - sum_{i in b} score_i|`` over the joint bins: ``N`` times the D-ECE."""
    if features and kept.features is None:
        raise ValueError("Expected detections matched with `image_sizes` (the box geometry), but they have none.")
    geometry = kept.features if features else np.zeros((len(kept), 0))
    edges = np.zeros((len(n_bins), max(n_bins) + 1))
    for d, b in enumerate(n_bins):
        edges[d, : b + 1] = uniform_edges(b)
    sums = np.zeros((int(np.prod(n_bins)), 2))
    columns = np.array([BOX_FEATURES.index(f) for f in features], dtype=np.int64)
    _joint_gap_sums(kept.scores, geometry, columns, edges, np.array(n_bins, dtype=np.int64), target, sums)
    return float(np.abs(sums[:, 0] - sums[:, 1]).sum())


def d_ece(
    detections: Detections,
    *,
    features: Sequence[str] = BOX_FEATURES,
    n_bins: int | Sequence[int] = 5,
    score_threshold: float = 0.5,
) -> float:
    """D-ECE (Küppers et al. 2020, eq. 5) over the confidence and the box ``features`` (any of cx, cy, w, h), at
    ``score_threshold``. ``n_bins``: one count for every dimension, or one per dimension (confidence first).

    Example:
        >>> import numpy as np
        >>> from hf_calibration.detection import Detections
        >>> d = Detections(scores=np.array([0.9, 0.8, 0.6]), labels=np.zeros(3, int), matched=np.array([True, False, True]),
        ...     iou=np.array([0.9, 0.0, 0.7]), image=np.zeros(3, int), features=None, logits=None, iou_threshold=0.5,
        ...     num_ground_truth=2)
        >>> round(d_ece(d, features=(), n_bins=2), 4)   # bin (0.5, 1]: precision 2/3, confidence 0.7667
        0.1
    """
    threshold = _check_threshold(score_threshold, "score_threshold")
    features = tuple(features)
    if any(f not in BOX_FEATURES for f in features) or len(set(features)) != len(features):
        raise ValueError(
            f"Expected argument `features` to be distinct names from {BOX_FEATURES}, but got {features!r}."
        )
    bins = _check_n_bins(n_bins, 1 + len(features))
    kept = _kept(detections, threshold)
    return _gap_total(kept, features, bins, kept.matched.astype(np.float64)) / len(kept)


def detection_ece(detections: Detections, *, n_bins: int = 10, score_threshold: float = 0.5) -> float:
    """Detection ECE: precision against confidence over ``n_bins`` equal-width bins (D-ECE with no box feature)."""
    return d_ece(detections, features=(), n_bins=n_bins, score_threshold=score_threshold)


def laece(detections: Detections, *, n_bins: int = 25, score_threshold: float = 0.5) -> float:
    """LaECE (Oksuz et al. 2023, eq. 4): per class, confidence against ``precision x mean IoU`` in ``n_bins``
    equal-width bins, averaged over the classes with a detection at ``score_threshold``."""
    threshold = _check_threshold(score_threshold, "score_threshold")
    (bins,) = _check_n_bins(n_bins, 1)
    kept = _kept(detections, threshold)
    target = np.where(kept.matched, kept.iou, 0.0)
    index = uniform_bin_index(kept.scores, bins)
    classes, inverse, counts = np.unique(kept.labels, return_inverse=True, return_counts=True)
    joint = inverse * bins + index
    gaps = np.abs(
        np.bincount(joint, target, classes.size * bins) - np.bincount(joint, kept.scores, classes.size * bins)
    )
    return float((gaps.reshape(classes.size, bins).sum(1) / counts).mean())


def detection_reliability(
    detections: Detections, *, n_bins: int = 10, score_threshold: float = 0.5
) -> dict[str, np.ndarray]:
    """The per-bin table of a detection reliability diagram: ``edges`` (n_bins + 1), and per bin ``count``,
    ``confidence`` (mean score), ``precision`` (share of true positives), ``gap`` (confidence - precision); empty bins
    hold NaN."""
    threshold = _check_threshold(score_threshold, "score_threshold")
    (bins,) = _check_n_bins(n_bins, 1)
    kept = _kept(detections, threshold)
    index = uniform_bin_index(kept.scores, bins)
    count = np.bincount(index, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.bincount(index, kept.scores, bins) / count
        precision = np.bincount(index, kept.matched.astype(np.float64), bins) / count
    return {
        "edges": uniform_edges(bins),
        "count": count,
        "confidence": confidence,
        "precision": precision,
        "gap": confidence - precision,
    }


def detection_calibration_report(
    detections: Detections, *, score_threshold: float = 0.5, n_bins: int = 10, d_ece_bins: int = 5, laece_bins: int = 25
) -> dict[str, float]:
    """Every detection calibration number at one ``score_threshold`` (stated in the result): detection ECE,
    D-ECE over (confidence, cx, cy, w, h) when the geometry is known, LaECE, precision and the detection count."""
    kept = _kept(detections, _check_threshold(score_threshold, "score_threshold"))
    out = {
        "score_threshold": float(score_threshold),
        "iou_threshold": kept.iou_threshold,
        "detections": float(len(kept)),
        "precision": float(kept.matched.mean()),
        "detection_ece": detection_ece(kept, n_bins=n_bins, score_threshold=score_threshold),
        "laece": laece(kept, n_bins=laece_bins, score_threshold=score_threshold),
    }
    if kept.features is not None:
        out["d_ece"] = d_ece(kept, n_bins=d_ece_bins, score_threshold=score_threshold)
    return out


def ranking_ap(detections: Detections, *, score_threshold: float = 0.5) -> float:
    """How well the scores rank true positives above false ones: the average precision of ``matched`` against the
    score (scikit-learn's ``average_precision_score``), averaged over the predicted classes that have a true and a
    false positive at ``score_threshold``; NaN where none has. COCO's AP of a class reads the same order of that
    class's detections (its recall also counts the missed objects), so a map that lowers this lowers mAP, and a map
    increasing in the score within each class leaves both unchanged."""
    from sklearn.metrics import average_precision_score

    kept = _kept(detections, _check_threshold(score_threshold, "score_threshold"))
    aps = [
        average_precision_score(kept.matched[keep], kept.scores[keep])
        for keep in (kept.labels == c for c in np.unique(kept.labels))
        if 0 < kept.matched[keep].sum() < keep.sum()
    ]
    return float(np.mean(aps)) if aps else float("nan")
