"""Proper scoring rules: multiclass Brier score and negative log-likelihood."""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX
from hf_calibration.metrics._boundary import metric_call
from hf_calibration.metrics._format import Inputs, top_label
from hf_calibration.metrics._probability_pass import probability_rows
from hf_calibration.metrics.bootstrap import frame, weighted_means


def _brier_update(probs: np.ndarray, target: np.ndarray) -> float:
    """``sum_i sum_k (p_ik - [y_i == k])^2 = sum_i (sum_k p_ik^2 - 2 p_iy + 1)`` for one chunk."""
    p_true = probs[np.arange(probs.shape[0]), target]
    return float(np.einsum("ij,ij->", probs, probs) - 2.0 * p_true.sum() + probs.shape[0])


def _nll_update(log_probs: np.ndarray, target: np.ndarray, n: int) -> float:
    """``-sum_i log p_iy / n`` for one chunk (each term divided first: losses near 1e308 sum without overflow)."""
    return float(-(log_probs[np.arange(log_probs.shape[0]), target] / n).sum())


def _row_scores(inputs: Inputs) -> np.ndarray:
    """Each row's Brier term ``sum_k (p_ik - [y_i == k])^2`` and NLL term ``-log p_iy``, (N, 2): what a
    bootstrap resamples (their means are :func:`brier` and :func:`nll`)."""
    return probability_rows(inputs, classwise=False).scores


def _score(preds, target, from_logits, ignore_index, ci, n_boot, seed, column: int, task=None, average="macro"):
    """Brier (column 0) or NLL (1), with its percentile interval when ``ci`` is given."""
    call = metric_call(("brier", "nll")[column], preds, target, None, locals())
    if call.done:
        return call.head_value
    inputs, boot = call.inputs, call.boot
    order = (
        None if boot is None else frame(top_label(inputs).confidence)
    )  # the frame every metric of these rows resamples in
    rows = probability_rows(inputs, classwise=False, checked=order is not None)  # top_label checked the rows
    value = (rows.brier, rows.nll)[column]
    if boot is None:
        return value
    replicates = boot.replicates([weighted_means(rows.scores[:, column], order)], inputs.preds.shape[0])[0]
    return boot.interval(value, replicates[:, 0], ("brier", "nll")[column])


def brier(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    task: str | None = None,
    average: str = "macro",
) -> float:
    """Multiclass Brier score (Brier 1950): ``mean_i sum_k (p_ik - [y_i == k])^2``, in [0, 2].

    Summed over classes, averaged over samples (the papers' convention; sklearn's
    ``brier_score_loss`` for K > 2 gives the same number). Finite logits of any size (even near
    the float64 limit) are fine: the softmax subtracts the row maximum first. Arguments as
    :func:`hf_calibration.metrics.ece` (``from_logits=None`` detects probabilities; ``ci`` resamples
    each row's Brier term: a mean, unbiased, so the interval is the percentile one, see
    :mod:`hf_calibration.metrics.bootstrap`). A binary or multi-label head (``task``, or read from the shapes) scores
    each label as scikit-learn's ``brier_score_loss``, ``mean (p - y)^2``, averaged over labels by ``average``
    (:mod:`hf_calibration.metrics.multilabel`).
    """
    return _score(preds, target, from_logits, ignore_index, ci, n_boot, seed, 0, task, average)


def nll(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    task: str | None = None,
    average: str = "macro",
) -> float:
    """Mean negative log-likelihood of the true class, ``-mean_i log p_iy`` (nats).

    From logits it is the exact log-softmax, ``z_y - max z - log sum exp(z - max z)``: finite
    unless a true-class logit lies more than ~1.8e308 below its row's maximum (the loss itself
    then exceeds float64). From probabilities a true-class probability of exactly 0 gives
    ``inf`` (no clipping). Arguments as :func:`hf_calibration.metrics.ece` (``from_logits=None``
    detects probabilities; ``ci`` resamples each row's term, percentile interval as :func:`brier`'s, and
    a resample that draws an infinite term is infinite). A binary or multi-label head (``task``, or read from the
    shapes) gets the binary cross-entropy ``-mean [y log p + (1 - y) log(1 - p)]`` per label, averaged by ``average``
    (:mod:`hf_calibration.metrics.multilabel`).
    """
    return _score(preds, target, from_logits, ignore_index, ci, n_boot, seed, 1, task, average)
