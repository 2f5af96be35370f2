"""Equal-width binned calibration errors: ECE, MCE, the over/under split, classwise ECE.

All follow Guo et al. 2017 ("On Calibration of Modern Neural Networks", eqs. 3 and 5):
``n_bins`` equal-width bins on (0, 1], bin ``b`` holds ``lo < p <= hi`` (``p = 0`` in the first
bin, ``p = 1`` in the last), and

    ECE = sum_b |B_b|/N * |acc_b - conf_b|,        MCE = max_{b: |B_b| > 0} |acc_b - conf_b|.

The private ``_..._compute`` functions take the top-label ``(confidence, correct)`` arrays so a
caller that already has them (``calibration_report``) never re-runs the softmax.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._checks import IGNORE_INDEX
from ._format import prepare, probability_chunks, top_label
from .binning import _bin_means, _bin_sums, _calibration_gaps, _check_n_bins, _uniform_bin_index


class ECESplit(NamedTuple):
    """ECE split by the sign of each bin's gap (FeDLaS Table 4); ``over + under == ece``."""

    over: float  # O-ECE: sum_b |B_b|/N * max(conf_b - acc_b, 0), over-confidence
    under: float  # U-ECE: sum_b |B_b|/N * max(acc_b - conf_b, 0), under-confidence


def _uniform_gaps(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> np.ndarray:
    index = _uniform_bin_index(confidence, n_bins)
    return _calibration_gaps(_bin_sums(index, confidence, correct, n_bins), confidence.shape[0])


def _ece_compute(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    return float(np.abs(_uniform_gaps(confidence, correct, n_bins)).sum())


def _ece_split_compute(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> ECESplit:
    gaps = _uniform_gaps(confidence, correct, n_bins)
    return ECESplit(float(np.clip(gaps, 0, None).sum()), float(np.clip(-gaps, 0, None).sum()))


def _mce_compute(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    index = _uniform_bin_index(confidence, n_bins)
    sums = _bin_sums(index, confidence, correct, n_bins)
    conf, acc = _bin_means(sums)
    filled = sums.count > 0
    return float(np.abs(acc[filled] - conf[filled]).max())


def ece(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> float:
    """Expected calibration error of the top label, equal-width bins (Guo et al. 2017, eq. 3).

    Args:
        preds: ``(N, K)`` logits or probabilities, torch or numpy, any float dtype (computed in
            float64; float32-and-below logits take a float32 exp with a float64 sum, within ~1e-7
            of float64 per confidence).
        target: ``(N,)`` integer labels; rows equal to ``ignore_index`` are dropped.
        n_bins: number of equal-width bins on (0, 1], 1 to 10,000; bin b holds ``lo < p <= hi``.
        from_logits: ``None`` (default) detects: when every kept row has all values in [0, 1]
            and sums to 1 within 1e-2 (float16 / bfloat16 softmax output passes, even stored
            as float32), ``preds`` are probabilities, otherwise logits (softmax is applied), as
            torchmetrics does. ``True`` / ``False`` say so explicitly and win; ``True`` on rows
            that look like probabilities warns. ``False`` requires the same rule (values in
            [0, 1], rows summing to 1 within 1e-2) and raises ``ValueError`` otherwise, so
            detection and validation never disagree.
        ignore_index: label of rows to drop (default -100, the transformers convention); an
            integer or None.

    Returns:
        ECE as a fraction in [0, 1].

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]])
        >>> round(ece(probs, np.array([0, 1, 1]), n_bins=10), 4)  # probabilities, detected
        0.4
        >>> round(ece(np.log(probs), np.array([0, 1, 1]), n_bins=10), 4)  # logits: the same
        0.4
    """
    n_bins = _check_n_bins(n_bins)
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return _ece_compute(top.confidence, top.correct, n_bins)


def mce(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> float:
    """Maximum calibration error: the largest ``|acc_b - conf_b|`` over non-empty equal-width bins
    (Guo et al. 2017, eq. 5). Arguments as :func:`ece` (``from_logits=None`` detects probabilities)."""
    n_bins = _check_n_bins(n_bins)
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return _mce_compute(top.confidence, top.correct, n_bins)


def ece_split(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> ECESplit:
    """Over- and under-confidence parts of the ECE, ``ECESplit(over, under)`` (O-ECE / U-ECE of
    FeDLaS Table 4): ``sum_b |B_b|/N * max(conf_b - acc_b, 0)`` and ``max(acc_b - conf_b, 0)``.
    They add up to :func:`ece`. Arguments as :func:`ece` (``from_logits=None`` detects probabilities)."""
    n_bins = _check_n_bins(n_bins)
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    return _ece_split_compute(top.confidence, top.correct, n_bins)


def _classwise_ece_update(probs: np.ndarray, target: np.ndarray, n_bins: int) -> np.ndarray:
    """Signed per-(class, bin) sums ``sum_i [bin] * (p_ik - [y_i == k])`` for one row chunk, (K, B)."""
    n, k = probs.shape
    index = _uniform_bin_index(probs, n_bins)  # (n, K) bin of every class probability
    flat = (np.arange(k, dtype=np.int64) * n_bins + index).ravel()  # class-major (class, bin) id
    out = np.bincount(flat, weights=probs.ravel(), minlength=k * n_bins)
    hit = target * n_bins + index[np.arange(n), target]  # the bin of each sample's true class
    out -= np.bincount(hit, minlength=k * n_bins)
    return out.reshape(k, n_bins)


def _classwise_ece_compute(signed_sums: np.ndarray, n: int) -> float:
    """Mean over classes of ``sum_b |B_kb|/N * |acc_kb - conf_kb|``."""
    return float(np.abs(signed_sums).sum(axis=1).mean() / n)


def classwise_ece(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
) -> float:
    """Classwise ECE: the mean over classes k of the equal-width-binned ECE of ``p_k`` against
    ``[y == k]`` (Kull et al. 2019; Nixon et al. 2019 without thresholding). Every probability,
    zeros included, is binned (``p = 0`` → first bin). Equal-width bins depend on the values
    only, so ties cannot be split by correctness. Arguments as :func:`ece` (``from_logits=None``
    detects probabilities)."""
    n_bins = _check_n_bins(n_bins)
    inputs = prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index)
    total = np.zeros((inputs.preds.shape[1], n_bins))
    for rows, probs, _ in probability_chunks(inputs):
        total += _classwise_ece_update(probs, inputs.target[rows], n_bins)
    return _classwise_ece_compute(total, inputs.preds.shape[0])
