"""Input formatting for every metric: validation, ignore_index, logits or probabilities, float64.

``prepare`` validates once and decides ``from_logits`` (an explicit bool wins; ``None`` detects
probabilities with :func:`hf_calibration._checks.looks_like_probabilities`). Two paths then share it:

* ``top_label`` gives the top-label confidence ``p_i = max_k softmax(z_i)_k`` and the
  correctness ``a_i = [argmax z_i == y_i]``, in one compiled pass that also checks the rows
  (``_rowpass``): no (N, K) copy of any kind. ``top_label_bin_sums`` is the same pass reduced to
  equal-width bin sums (ECE, MCE, the over/under split).
* ``probability_chunks`` streams float64 probabilities and log-probabilities (classwise ECE,
  Brier, NLL).

One rule decides what a probability row is, for detection and for ``from_logits=False`` alike:
every value in [0, 1] and a sum within ``PROBABILITY_DETECTION_TOLERANCE`` (1e-2) of 1. So rows
that ``from_logits=None`` takes for probabilities are always accepted by ``from_logits=False``, and
rows that ``from_logits=False`` rejects are always taken for logits by ``from_logits=None``.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from . import _rowpass
from .._checks import (
    IGNORE_INDEX,
    PROBABILITY_DETECTION_TOLERANCE,
    check_classification_shapes,
    check_labels_in_range,
    resolve_from_logits,
    to_numpy,
)

_CHUNK_ELEMENTS = 1 << 22  # ~32 MB of float64 per chunk


class TopLabel(NamedTuple):
    confidence: np.ndarray  # (N,) float64, top-label probability
    correct: np.ndarray  # (N,) float64 in {0, 1}
    prediction: np.ndarray  # (N,) int64, argmax class


class Inputs(NamedTuple):
    """Validated metric inputs: ignored rows dropped, ``from_logits`` decided."""

    preds: np.ndarray  # (N, K) floating, not upcast
    target: np.ndarray  # (N,) int64
    from_logits: bool
    name: str = "preds"  # the argument's name, for messages


def _check_ignore_index(ignore_index: Any) -> None:
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral)):
        raise TypeError(f"Expected argument `ignore_index` to be an integer or None, but got {ignore_index!r}.")


def validate(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    preds_name: str = "preds",
    target_name: str = "target",
) -> tuple[np.ndarray, np.ndarray]:
    """Check shapes, dtypes and labels; drop ignored rows. Returns numpy (preds, target), not upcast."""
    if from_logits is not None and not isinstance(from_logits, bool):
        raise TypeError(f"Expected argument `from_logits` to be None (detect), True or False, but got {from_logits!r}.")
    _check_ignore_index(ignore_index)
    preds = to_numpy(preds, preds_name)
    target = to_numpy(target, target_name)
    check_classification_shapes(preds, target, preds_name, target_name)
    check_labels_in_range(target, preds.shape[1], target_name, ignore_index)
    if ignore_index is not None:
        keep = target != ignore_index
        if not keep.all():
            preds, target = preds[keep], target[keep]
            if preds.shape[0] == 0:
                raise ValueError(f"Expected at least one label in `{target_name}` that is not ignore_index={ignore_index}.")
    return preds, target.astype(np.int64, copy=False)


def prepare(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    preds_name: str = "preds",
    target_name: str = "target",
) -> Inputs:
    """``validate``, then decide ``from_logits`` on the kept rows (ignored rows may hold anything)."""
    preds, target = validate(
        preds, target, from_logits=from_logits, ignore_index=ignore_index, preds_name=preds_name, target_name=target_name
    )
    with np.errstate(over="ignore"):  # a row sum of finite logits near 1e308 may overflow: not probabilities
        from_logits = resolve_from_logits(preds, from_logits, preds_name)
    return Inputs(preds, target, from_logits, preds_name)


def _chunks(n: int, k: int):
    step = max(1, _CHUNK_ELEMENTS // k)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def _check_finite_rows(top: np.ndarray, low: np.ndarray, start: int, preds_name: str) -> None:
    """Row maxima and minima are finite exactly when the row is (NaN propagates through both)."""
    finite = np.isfinite(top) & np.isfinite(low)
    if not finite.all():
        bad = start + int(np.flatnonzero(~finite)[0])
        raise ValueError(f"Expected `{preds_name}` to be finite, but row {bad} contains NaN or inf.")


def _check_chunk(chunk: np.ndarray, rows: slice, from_logits: bool, preds_name: str) -> np.ndarray:
    """Finite values (checked on row maxima and minima, never on a sum, which overflows for finite
    logits near 1e308); probabilities by the one rule. Returns the row maxima, (n, 1)."""
    top, low = chunk.max(axis=1), chunk.min(axis=1)
    _check_finite_rows(top, low, rows.start, preds_name)
    if not from_logits:
        if low.min() < 0 or top.max() > 1:
            raise ValueError(
                f"Expected `{preds_name}` to hold probabilities in [0, 1] (from_logits=False), "
                f"but found values in [{low.min():.4g}, {top.max():.4g}]."
            )
        sums = chunk.sum(axis=1)
        off = np.abs(sums - 1.0)
        if off.max() > PROBABILITY_DETECTION_TOLERANCE:
            bad = int(np.argmax(off))
            raise ValueError(
                f"Expected each row of `{preds_name}` to sum to 1 within {PROBABILITY_DETECTION_TOLERANCE:g} "
                f"(from_logits=False), but row {rows.start + bad} sums to {sums[bad]:.6g}."
            )
    return top[:, None]


def _raise_row_error(preds: np.ndarray, bad: tuple[int, int], preds_name: str) -> None:
    """The ``ValueError`` for the first bad row the top-label pass found (``_rowpass``'s kinds)."""
    row, kind = bad
    if kind == _rowpass.NOT_FINITE:
        raise ValueError(f"Expected `{preds_name}` to be finite, but row {row} contains NaN or inf.")
    values = np.asarray(preds[row], dtype=np.float64)
    if kind == _rowpass.OUT_OF_RANGE:
        raise ValueError(
            f"Expected `{preds_name}` to hold probabilities in [0, 1] (from_logits=False), "
            f"but found values in [{values.min():.4g}, {values.max():.4g}] (row {row})."
        )
    raise ValueError(
        f"Expected each row of `{preds_name}` to sum to 1 within {PROBABILITY_DETECTION_TOLERANCE:g} "
        f"(from_logits=False), but row {row} sums to {values.sum():.6g}."
    )
def check_rows(inputs: Inputs) -> None:
    """The checks ``top_label`` and ``probability_chunks`` make on the way (finite rows; probabilities by the one
    rule), alone, in row chunks: for a pass that computes neither."""
    preds, _, from_logits, preds_name = inputs
    for rows in _chunks(*preds.shape):
        _check_chunk(preds[rows], rows, from_logits, preds_name)


def top_label(inputs: Inputs) -> TopLabel:
    """Top-label confidence and correctness of prepared inputs: one compiled pass (``_rowpass``), float64 results."""
    preds, target, from_logits, preds_name = inputs
    confidence, prediction, _, bad = _rowpass.top_label_pass(preds, target, from_logits)
    if bad is not None:
        _raise_row_error(preds, bad, preds_name)
    correct = (prediction == target).astype(np.float64)
    return TopLabel(confidence, correct, prediction)


def top_label_bin_sums(inputs: Inputs, n_bins: int):
    """Per equal-width bin ``(count, sum of confidences, sum of correctness)`` of prepared inputs, as
    :class:`~hf_calibration.metrics.binning.BinSums`, from the same pass as :func:`top_label` with no per-row arrays."""
    from .binning import BinSums

    preds, target, from_logits, preds_name = inputs
    _, _, sums, bad = _rowpass.top_label_pass(preds, target, from_logits, n_bins=n_bins, arrays=False)
    if bad is not None:
        _raise_row_error(preds, bad, preds_name)
    return BinSums(sums[0].astype(np.int64), sums[1], sums[2])


def probability_chunks(inputs: Inputs):
    """Yield ``(rows, probs, log_probs)`` float64 row chunks of prepared inputs.

    For a streaming pass (classwise ECE, Brier, NLL) without an (N, K) float64 copy. From
    logits, ``log_probs`` is the exact log-softmax, computed after subtracting the row maximum,
    so any finite logits (even near the float64 limit) give finite probabilities; from
    probabilities it is ``log(probs)``.
    """
    preds, _, from_logits, preds_name = inputs
    n, k = preds.shape
    for rows in _chunks(n, k):
        chunk = preds[rows].astype(np.float64, copy=False)
        top = _check_chunk(chunk, rows, from_logits, preds_name)
        if from_logits:
            with np.errstate(over="ignore"):  # z - max(z) below -1.8e308 is -inf: exp gives 0, as it should
                shifted = chunk - top
            e = np.exp(shifted)
            s = e.sum(axis=1, keepdims=True)
            yield rows, e / s, shifted - np.log(s)
        else:
            with np.errstate(divide="ignore"):
                yield rows, chunk, np.log(chunk)
