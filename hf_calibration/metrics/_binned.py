"""The binned statistics of (confidence, correctness) arrays, and their resampled forms: ECE, its over / under split,
MCE and AdaECE. The multi-class functions (top-label confidences) and the sigmoid heads' per-label metrics (each
label's probability) share them; so do the report, the accumulator and the bootstrap."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from hf_calibration.metrics.binning import (
    _adaptive_bin_index,
    _bin_means,
    _bin_sums,
    _calibration_gaps,
    _run_sizes,
    _uniform_bin_index,
)
from hf_calibration.metrics.bootstrap import Bootstrap, advance, frame, segment_sums


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
    return _mce_from_sums(_bin_sums(index, confidence, correct, n_bins))


def _mce_from_sums(sums) -> float:
    conf, acc = _bin_means(sums)
    filled = sums.count > 0
    return float(np.abs(acc[filled] - conf[filled]).max())


# ------------------------------------------------------------------------------------ resampled forms
# The same sums with row i weighted by its bootstrap count c_i (see ``bootstrap``). In frame order (rows
# sorted by confidence) each equal-width bin is a run of consecutive rows, so a resample's per-bin sums are
# three contiguous weighted sums per bin: O(N), vectorised.


def _binned_statistic(confidence: np.ndarray, correct: np.ndarray, n_bins: int):
    """``counts -> (B, 5)`` ECE, MCE, O-ECE, U-ECE and accuracy of each resample (counts in frame order)."""
    order = frame(confidence)
    n = confidence.shape[0]
    index = _uniform_bin_index(confidence[order], n_bins)  # nondecreasing
    starts = np.searchsorted(index, np.arange(n_bins + 1), side="left")
    columns = np.ascontiguousarray(np.stack([np.ones(n), confidence[order], correct[order]]))

    def statistic(counts: np.ndarray) -> np.ndarray:
        sums = segment_sums(counts, starts, columns)  # (B, bins, [count, confidence, correct])
        gap = (sums[..., 1] - sums[..., 2]) / n
        with np.errstate(invalid="ignore", divide="ignore"):
            bin_gap = np.where(sums[..., 0] > 0, np.abs(sums[..., 2] - sums[..., 1]) / sums[..., 0], 0.0)
        return np.stack(
            [
                np.abs(gap).sum(axis=1),
                bin_gap.max(axis=1),
                np.clip(gap, 0, None).sum(axis=1),
                np.clip(-gap, 0, None).sum(axis=1),
                sums[..., 2].sum(axis=1) / n,
            ],
            axis=1,
        )

    return statistic


BINNED_COLUMNS = ("ece", "mce", "o_ece", "u_ece", "accuracy")  # the columns of _binned_statistic


def _top_label_interval(
    boot: Bootstrap, confidence: np.ndarray, correct: np.ndarray, n_bins: int, column: int, value: float
):
    """``value`` with the interval of column ``column`` of ``_binned_statistic`` (0 ECE, 1 MCE, 2 O-ECE, 3 U-ECE)."""
    if BINNED_COLUMNS[column] == "mce":  # no interval (bootstrap.INTERVALS): no resamples either
        return boot.interval(value, np.zeros(0), "mce")
    replicates = boot.replicates([_binned_statistic(confidence, correct, n_bins)], confidence.shape[0])[0]
    return boot.interval(value, replicates[:, column], BINNED_COLUMNS[column])


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
