"""Adaptive (equal-mass) ECE: AdaECE (Nguyen & O'Connor 2015; Mukhoti et al. 2020)."""

from __future__ import annotations

from typing import Any

from hf_calibration._core.checks import IGNORE_INDEX
from hf_calibration.metrics._binned import _adaece_compute, _adaece_replicates, _adaece_statistic  # noqa: F401
from hf_calibration.metrics._boundary import metric_call
from hf_calibration.metrics._format import top_label


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
    call = metric_call("adaece", preds, target, n_bins, locals())
    if call.done:
        return call.head_value
    boot, n_bins = call.boot, call.n_bins
    top = top_label(call.inputs)
    value = _adaece_compute(top.confidence, top.correct, n_bins)
    if boot is None:
        return value
    statistic = _adaece_statistic(top.confidence, top.correct, n_bins)
    return boot.interval(value, boot.replicates([statistic], top.confidence.shape[0])[0], "adaece")
