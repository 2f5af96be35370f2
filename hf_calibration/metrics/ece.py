"""Equal-width binned calibration errors: ECE, MCE, the over/under split, classwise ECE.

All follow Guo et al. 2017 ("On Calibration of Modern Neural Networks", eqs. 3 and 5):
``n_bins`` equal-width bins on (0, 1], bin ``b`` holds ``lo < p <= hi`` (``p = 0`` in the first
bin, ``p = 1`` in the last), and

    ECE = sum_b |B_b|/N * |acc_b - conf_b|,        MCE = max_{b: |B_b| > 0} |acc_b - conf_b|.

The private ``_..._compute`` functions take the top-label ``(confidence, correct)`` arrays so a
caller that already has them (``calibration_report``) never re-runs the softmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX
from hf_calibration.metrics._binned import (  # noqa: F401 - the computations live there; imported here by name too
    BINNED_COLUMNS,
    ECESplit,
    _binned_statistic,
    _ece_compute,
    _ece_split_compute,
    _mce_compute,
    _mce_from_sums,
    _top_label_interval,
    _uniform_gaps,
)
from hf_calibration.metrics._boundary import metric_call
from hf_calibration.metrics._format import top_label, top_label_bin_sums
from hf_calibration.metrics._probability_pass import probability_rows
from hf_calibration.metrics.binning import _bin_sums, _calibration_gaps, _uniform_bin_index
from hf_calibration.metrics.bootstrap import (
    frame_position,
)


def ece(
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
        ci: confidence level of a bootstrap interval (0.95), or None (default) for the bare value.
            The rows (after ``ignore_index``) are resampled. The interval is the basic (bias-corrected)
            bootstrap, ``2 * value - quantiles``: the plug-in ECE is biased upwards by bin noise and so are
            its resamples, which put the percentile interval above the true value (coverage measured in
            ``benchmarks/bootstrap_coverage.py``; see :mod:`hf_calibration.metrics.bootstrap`). Its ``note``
            says when the estimate lies outside it or it reaches 0.
        n_boot: number of resamples (default 1,000).
        seed: seed of the resamples (default 0): the same seed gives the same interval.
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``; None (default) reads it from the shapes
            (:func:`hf_calibration._core.tasks.resolve_task`: ``(N, L)`` 0/1 targets are multi-label, one score column is
            binary). Binary and multi-label heads are scored as torchmetrics' ``BinaryCalibrationError`` does (the
            probability ``p`` against the 0/1 label, per label): see :mod:`hf_calibration.metrics.multilabel`.
        average: multi-label only: ``"macro"`` (default, the mean of the per-label ECEs), ``"micro"`` (every
            (sample, label) pair pooled) or ``"none"`` (the per-label values, an ``(L,)`` array).

    Returns:
        ECE as a fraction in [0, 1]; with ``ci``, a :class:`~hf_calibration.metrics.MetricInterval`:
        that float, with ``.low`` and ``.high``.

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]])
        >>> round(ece(probs, np.array([0, 1, 1]), n_bins=10), 4)  # probabilities, detected
        0.4
        >>> round(ece(np.log(probs), np.array([0, 1, 1]), n_bins=10), 4)  # logits: the same
        0.4
        >>> rng = np.random.default_rng(0)
        >>> conf = rng.uniform(0.5, 1.0, 2000)  # over-confident: right with probability conf - 0.1
        >>> probs = np.stack([conf, 1 - conf], axis=1)
        >>> labels = (rng.random(2000) >= conf - 0.1).astype(int)
        >>> value = ece(probs, labels, ci=0.95)  # the true ECE is 0.1
        >>> round(value, 3), round(value.low, 3), round(value.high, 3)
        (0.088, 0.068, 0.107)
    """
    call = metric_call("ece", preds, target, n_bins, locals())
    if call.done:
        return call.head_value
    inputs, n_bins, boot = call.inputs, call.n_bins, call.boot
    if boot is None:  # one fused pass to the bin sums: no per-row arrays
        return float(np.abs(_calibration_gaps(top_label_bin_sums(inputs, n_bins), inputs.preds.shape[0])).sum())
    top = top_label(inputs)
    value = _ece_compute(top.confidence, top.correct, n_bins)
    return _top_label_interval(boot, top.confidence, top.correct, n_bins, 0, value)


def mce(
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
    """Maximum calibration error: the largest ``|acc_b - conf_b|`` over non-empty equal-width bins
    (Guo et al. 2017, eq. 5). Arguments as :func:`ece` (``from_logits=None`` detects probabilities; ``task`` /
    ``average`` for binary and multi-label heads: torchmetrics' ``norm="max"``).
    With ``ci`` there is no interval: a maximum over bins has an inconsistent bootstrap when several bins
    are near the maximum (Andrews 2000; on a uniformly over-confident model the basic interval covered the
    true MCE far below its level, ``benchmarks/bootstrap_coverage.py``), so the value comes back as a
    :class:`~hf_calibration.metrics.MetricInterval` with NaN ends and a ``note`` saying why."""
    call = metric_call("mce", preds, target, n_bins, locals())
    if call.done:
        return call.head_value
    inputs, n_bins, boot = call.inputs, call.n_bins, call.boot
    if boot is None:
        return _mce_from_sums(top_label_bin_sums(inputs, n_bins))
    top = top_label(inputs)
    value = _mce_compute(top.confidence, top.correct, n_bins)
    return _top_label_interval(boot, top.confidence, top.correct, n_bins, 1, value)


def rmsce(
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
    """Root-mean-square calibration error: ``sqrt(sum_b |B_b|/N (acc_b - conf_b)^2)`` over the equal-width bins of
    :func:`ece` (torchmetrics' ``norm="l2"``; Nixon et al. 2019). Arguments as :func:`ece`, binary and multi-label
    heads included.

    Example:
        >>> import numpy as np
        >>> probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]])
        >>> round(rmsce(probs, np.array([0, 1, 1]), n_bins=10), 4)  # bins 0.7, 0.8, 0.9: gaps 0.3, 0.8, 0.1
        0.4967
    """
    from hf_calibration.metrics.multilabel import _binned_statistic as _weighted_binned

    call = metric_call("rmsce", preds, target, n_bins, locals())
    if call.done:
        return call.head_value
    inputs, n_bins, boot = call.inputs, call.n_bins, call.boot
    top = top_label(inputs)
    sums = _bin_sums(_uniform_bin_index(top.confidence, n_bins), top.confidence, top.correct, n_bins)
    from hf_calibration.metrics.multilabel import _binned_from_sums

    value = float(_binned_from_sums(sums.count, sums.confidence, sums.accuracy, "l2"))
    if boot is None:
        return value
    n = top.confidence.shape[0]
    statistic = _weighted_binned(top.confidence, top.correct, np.arange(n), n_bins)
    return boot.interval(value, boot.replicates([statistic], n)[0][:, 2])


def ece_split(
    preds: Any,
    target: Any,
    n_bins: int = 15,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
) -> ECESplit:
    """Over- and under-confidence parts of the ECE, ``ECESplit(over, under)`` (O-ECE / U-ECE of
    FeDLaS Table 4): ``sum_b |B_b|/N * max(conf_b - acc_b, 0)`` and ``max(acc_b - conf_b, 0)``.
    They add up to :func:`ece`. Arguments as :func:`ece` (``from_logits=None`` detects probabilities;
    with ``ci`` both parts are :class:`~hf_calibration.metrics.MetricInterval` from the same resamples)."""
    inputs, n_bins, boot, _ = metric_call("o_ece", preds, target, n_bins, locals())
    if boot is None:
        gaps = _calibration_gaps(top_label_bin_sums(inputs, n_bins), inputs.preds.shape[0])
        return ECESplit(float(np.clip(gaps, 0, None).sum()), float(np.clip(-gaps, 0, None).sum()))
    top = top_label(inputs)
    split = _ece_split_compute(top.confidence, top.correct, n_bins)
    replicates = boot.replicates([_binned_statistic(top.confidence, top.correct, n_bins)], top.confidence.shape[0])[0]
    return ECESplit(
        boot.interval(split.over, replicates[:, 2], "o_ece"), boot.interval(split.under, replicates[:, 3], "u_ece")
    )


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
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
) -> float:
    """Classwise ECE: the mean over classes k of the equal-width-binned ECE of ``p_k`` against
    ``[y == k]`` (Kull et al. 2019; Nixon et al. 2019 without thresholding). Every probability,
    zeros included, is binned (``p = 0`` → first bin). Equal-width bins depend on the values
    only, so ties cannot be split by correctness. Arguments as :func:`ece` (``from_logits=None``
    detects probabilities). With ``ci`` the rows are resampled with all K of their probabilities and the
    interval is the basic (bias-corrected) bootstrap, as :func:`ece`'s; a resample costs O(N·K) (the lowest
    bin's sums of all resamples are one matrix product, see ``_probability_pass``), so the default is 200
    resamples, as smCE's; no (N, K) copy is made."""
    inputs, n_bins, boot, _ = metric_call("classwise_ece", preds, target, n_bins, locals())
    position = None if boot is None else frame_position(top_label(inputs).confidence)
    rows = probability_rows(
        inputs, n_bins, boot=boot, position=position, checked=position is not None
    )  # top_label checked them
    value = _classwise_ece_compute(rows.cells, inputs.preds.shape[0])
    return value if boot is None else boot.interval(value, rows.replicates, "classwise_ece")
