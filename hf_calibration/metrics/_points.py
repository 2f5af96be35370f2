"""The table's point forms (:mod:`hf_calibration.metrics.table`): each metric's value from top-label confidences ``p``
and correctness ``a`` (or one sigmoid label's probabilities and 0/1 labels), ``(p, a, n_bins)``, where the computation's
own module has none in that form; the sigmoid-only forms also take ``log p`` and ``log (1 - p)``. Named in the table as ``"hf_calibration.metrics._points:<name>"``."""

from __future__ import annotations

import numpy as np

from hf_calibration.metrics import smooth
from hf_calibration.metrics._binned import _ece_split_compute
from hf_calibration.metrics.binning import _bin_sums, _uniform_bin_index


def accuracy(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    return float(np.mean(a))


def rmsce(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    """``sqrt(sum_b |B_b|/N (acc_b - conf_b)^2)`` (Nixon et al. 2019; torchmetrics' ``norm="l2"``)."""
    from hf_calibration.metrics.multilabel import _binned_from_sums

    sums = _bin_sums(_uniform_bin_index(p, n_bins), p, a, n_bins)
    return float(_binned_from_sums(sums.count, sums.confidence, sums.accuracy, "l2"))


def o_ece(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    return _ece_split_compute(p, a, n_bins).over


def u_ece(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    return _ece_split_compute(p, a, n_bins).under


def smce(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    return float(smooth.smce_from_confidence(p, a))


def smece(p: np.ndarray, a: np.ndarray, n_bins: int) -> float:
    return float(smooth.smece_from_confidence(p, a))


def binary_ece(p, y, n_bins, log_p, log_q) -> float:
    from hf_calibration.metrics.multilabel import _binned

    return float(_binned(p, y, n_bins, "l1"))


def binary_mce(p, y, n_bins, log_p, log_q) -> float:
    from hf_calibration.metrics.multilabel import _binned

    return float(_binned(p, y, n_bins, "max"))


def accuracy_at_half(p, y, n_bins, log_p, log_q) -> float:
    """A sigmoid label's accuracy at threshold 0.5."""
    return float(((p > 0.5) == (y > 0.5)).mean())


def binary_brier(p, y, n_bins, log_p, log_q) -> float:
    return float(((p - y) ** 2).mean())


def binary_nll(p, y, n_bins, log_p, log_q) -> float:
    """The binary cross-entropy, from ``log p`` and ``log (1 - p)`` computed stably upstream."""
    return float(-(np.where(y > 0.5, log_p, log_q)).mean())
