"""Input formatting for every metric: validation, ignore_index, logits or probabilities, float64.

``prepare`` validates once and decides ``from_logits`` (an explicit bool wins; ``None`` detects
probabilities with :func:`hf_calibration._checks.looks_like_probabilities`). Two paths then share it:

* ``top_label`` gives the top-label confidence ``p_i = max_k softmax(z_i)_k`` and the
  correctness ``a_i = [argmax z_i == y_i]``. It works in row chunks, upcasting each chunk to
  float64, so N = 1e6, K = 1000 float32 logits never materialise an (N, K) float64 copy.
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

from .._checks import (
    IGNORE_INDEX,
    PROBABILITY_DETECTION_TOLERANCE,
    check_classification_shapes,
    check_labels_in_range,
    resolve_from_logits,
    to_numpy,
)

_CHUNK_ELEMENTS = 1 << 22  # ~32 MB of float64 per chunk
_TOP_CHUNK_ELEMENTS = 1 << 18  # ~1-2 MB: the top-label pass stays in cache


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


def check_rows(inputs: Inputs) -> None:
    """The checks ``top_label`` and ``probability_chunks`` make on the way (finite rows; probabilities by the one
    rule), alone, in row chunks: for a pass that computes neither."""
    preds, _, from_logits, preds_name = inputs
    for rows in _chunks(*preds.shape):
        _check_chunk(preds[rows], rows, from_logits, preds_name)


def top_label(inputs: Inputs) -> TopLabel:
    """Top-label confidence and correctness of prepared inputs, computed in float64 in row chunks."""
    preds, target, from_logits, preds_name = inputs
    n, k = preds.shape
    confidence = np.empty(n, dtype=np.float64)
    prediction = np.empty(n, dtype=np.int64)
    # Logits: exp in float64 for float64 input, else in float32 with a float64 sum. Against the
    # all-float64 pass this moves a confidence by <= ~1e-7 (the size of float32 rounding of the
    # logits themselves) and makes the pass ~3x faster; small cache-resident chunks, one buffer.
    work = np.float64 if preds.dtype.itemsize >= 8 else np.float32  # by size: big-endian float64 ('>f8') is float64 too
    step = max(1, _TOP_CHUNK_ELEMENTS // k)
    buf = np.empty((min(n, step), k), dtype=work) if from_logits else None
    # a difference z_k - z_max of finite logits can overflow to -inf (near the float limit): exp gives 0, as it should
    with np.errstate(over="ignore"):
        for start in range(0, n, step):
            rows = slice(start, min(n, start + step))
            if from_logits:
                chunk = preds[rows].astype(work, copy=False)
                arg = chunk.argmax(axis=1)
                top = np.take_along_axis(chunk, arg[:, None], axis=1)
                _check_finite_rows(top[:, 0], chunk.min(axis=1), start, preds_name)
                # max softmax = 1 / sum_k exp(z_k - z_max)
                b = buf[: chunk.shape[0]]
                np.subtract(chunk, top, out=b)
                np.exp(b, out=b)
                confidence[rows] = 1.0 / b.sum(axis=1, dtype=np.float64)
            else:
                chunk = preds[rows].astype(np.float64, copy=False)
                _check_chunk(chunk, rows, from_logits, preds_name)
                arg = chunk.argmax(axis=1)
                confidence[rows] = np.take_along_axis(chunk, arg[:, None], axis=1)[:, 0]
            prediction[rows] = arg
    correct = (prediction == target).astype(np.float64)
    return TopLabel(confidence, correct, prediction)


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
