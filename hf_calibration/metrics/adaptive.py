"""Adaptive (equal-mass) ECE: AdaECE (Nguyen & O'Connor 2015; Mukhoti et al. 2020)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .._checks import IGNORE_INDEX
from ._format import prepare, top_label
from .binning import _adaptive_bin_index, _bin_sums, _calibration_gaps, _check_n_bins, _run_sizes
from .ece import _MULTICLASS, _maybe_sigmoid, _sigmoid_dispatch
from .bootstrap import advance, check_bootstrap, frame


def _adaece_compute(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    index = _adaptive_bin_index(confidence, n_bins)
    sums = _bin_sums(index, confidence, correct, n_bins)
    return float(np.abs(_calibration_gaps(sums, confidence.shape[0])).sum())


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _adaece_replicates(counts, residual, tie_end, closing):  # pragma: no cover - compiled
    """AdaECE of each resample, (B,), counts in frame order (rows sorted by confidence).

    ``closing[u]`` is the number of samples in runs 0..u of the equal-count split of N samples (a resample
    has N too). Running through the counts finds the row holding the resample's sample at position
    ``closing[u] - 1`` (its value is bin u's upper edge); every row up to the end of that row's tie group
    (``tie_end``) has ``p <= hi``, so bin u is the run of rows after the previous bin's end: exactly
    ``_adaptive_bin_index`` on the resample, without sorting it again. Each bin's signed gap is then one
    contiguous weighted sum of ``residual = p - a``.
    """
    chunk, n = counts.shape
    cuts = closing.shape[0]
    out = np.empty(chunk)
    for b in range(chunk):
        row = counts[b]
        cum = 0
        j = 0
        start = 0
        total = 0.0
        for u in range(cuts + 1):
            if u < cuts:
                j, cum = advance(row, j, cum, closing[u])
                end = tie_end[j - 1]
            else:
                end = n
            gap = 0.0
            if end > start:  # else this bin's edge equals the previous one: empty
                weights, values = row[start:end], residual[start:end]
                for i in range(weights.shape[0]):  # range(len) of slices: vectorised (see bootstrap.segment_sums)
                    gap += weights[i] * values[i]
                start = end
            total += abs(gap)
        out[b] = total / n
    return out


def _adaece_statistic(confidence: np.ndarray, correct: np.ndarray, n_bins: int):
    """``counts -> (B,)`` AdaECE of each resample (counts in frame order)."""
    order = frame(confidence)
    p = confidence[order]
    residual = np.ascontiguousarray(p - correct[order])
    tie_end = np.searchsorted(p, p, side="right")  # one past the last row equal to each row
    closing = np.cumsum(_run_sizes(confidence.shape[0], n_bins))[:-1]
    return lambda counts: _adaece_replicates(counts, residual, tie_end, closing)


def adaece(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    task: str | None = None,
    average: str = "macro",
) -> float:
    """Adaptive ECE: ``sum_b |B_b|/N * |acc_b - conf_b|`` over equal-count bins.

    The top-label confidences are sorted and cut into ``n_bins`` consecutive runs whose sizes
    differ by at most one (``np.array_split``: the first ``N mod n_bins`` bins get one extra
    sample); the largest confidence of each run is its bin's upper edge, and a bin holds
    ``lo < p <= hi``. Every sample is in exactly one bin. Equal confidences are never split:
    a tie group lands whole in the lowest bin that reaches it (so a bin can hold more than
    ``N / n_bins`` samples and a later one fewer, or none). Splitting ties by correctness would
    call ``[[0.6, 0.4]] * 1000`` with 600 labels 0 badly calibrated (0.48) although it is
    perfectly calibrated; splitting them by input order would make the value depend on the
    order. With no ties the bins are exactly the equal-count runs.

    Difference from the focal-calibration reference code (``histedges_equalN``): there the
    edges are ``np.interp(linspace(0, N, B + 1), arange(N), sort(p))`` and bin ``b`` holds
    ``lo < p <= hi``. The first edge equals the minimum confidence, so the minimum-confidence
    sample (and every sample tied with it) is in no bin; the weights ``|B_b|/N`` then sum to
    ``(N - 1)/N`` and the bins are shifted by one sample against ours. The two agree only up to
    that one sample (a difference of order ``1/N``); ``tests/metrics/test_adaptive.py`` works a
    six-sample example where they differ.

    Arguments as :func:`hf_calibration.metrics.ece` (``from_logits=None`` detects probabilities;
    ``ci`` / ``n_boot`` / ``seed`` give the basic (bias-corrected) bootstrap interval, as ECE's, the bins
    re-cut on every resample; ``task`` / ``average`` for binary and multi-label heads, the equal-mass bins of each
    label's probability).
    Returns a fraction in [0, 1] (with ``ci``, a :class:`~hf_calibration.metrics.MetricInterval`).

    Example:
        >>> import numpy as np
        >>> from hf_calibration.metrics import ece
        >>> probs = np.tile([0.6, 0.4], (1000, 1))  # every confidence 0.6 ...
        >>> labels = np.repeat([0, 1], [600, 400])  # ... and right 60 % of the time
        >>> round(adaece(probs, labels), 12), round(ece(probs, labels), 12)
        (0.0, 0.0)
    """
    if task is not None or average != "macro" or _maybe_sigmoid(preds, target):
        sigmoid = _sigmoid_dispatch("adaece", preds, target, n_bins, task, average, from_logits, ignore_index, ci, n_boot, seed)
        if sigmoid is not _MULTICLASS:
            return sigmoid
    n_bins = _check_n_bins(n_bins)
    boot = check_bootstrap(ci, n_boot, seed)
    top = top_label(prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index))
    value = _adaece_compute(top.confidence, top.correct, n_bins)
    if boot is None:
        return value
    statistic = _adaece_statistic(top.confidence, top.correct, n_bins)
    return boot.interval(value, boot.replicates([statistic], top.confidence.shape[0])[0], "adaece")
