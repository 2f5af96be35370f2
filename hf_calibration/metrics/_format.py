"""Input formatting for every metric: validation, ignore_index, logits or probabilities, float64.

``prepare`` validates once and decides ``from_logits`` (an explicit bool wins; ``None`` detects
probabilities with :func:`hf_calibration._core.checks.looks_like_probabilities`). Two paths then share it:

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

from typing import Any

import numpy as np

from hf_calibration._core import rowpass as _rowpass
from hf_calibration._core.checks import (
    PROBABILITY_DETECTION_TOLERANCE,
)
from hf_calibration._core.inputs import Inputs, read_inputs, read_multiclass
from hf_calibration._core.rowpass import TopLabel, raise_row_error, top_label

_raise_row_error = raise_row_error  # the name the metrics' passes use

__all__ = [  # the metrics' input toolkit: the core's input type and top-label pass, and the metrics' own helpers
    "AVERAGES",
    "Inputs",
    "TopLabel",
    "check_average_for",
    "check_rows",
    "markdown_table",
    "prepare",
    "probability_chunks",
    "read_inputs",
    "read_metric_inputs",
    "top_label",
    "top_label_bin_sums",
]

_CHUNK_ELEMENTS = 1 << 22  # ~32 MB of float64 per chunk


AVERAGES = ("macro", "micro", "none")  # how a multi-label head's per-label values are averaged


def check_average_for(task: str, average: Any) -> str:
    """``average`` checked for the head ``task``: it means something for multi-label heads only."""
    if task == "multiclass":
        if average != "macro":
            raise ValueError(
                f"Expected argument `average` to be left at 'macro' for a multi-class (softmax) head, but got "
                f"{average!r}: averaging over labels applies to task='multilabel'."
            )
        return average
    if average not in AVERAGES:
        raise ValueError(f"Expected argument `average` to be one of {sorted(AVERAGES)}, but got {average!r}.")
    return average


def read_metric_inputs(
    preds: Any, target: Any, *, task: str | None, average: str, from_logits: bool | None, ignore_index: int | None
) -> Inputs:
    """A metric function's inputs, read once: head type, kind and labels (:func:`~hf_calibration._core.inputs.read_inputs`),
    and ``average`` checked for that head."""
    inputs = read_inputs(preds, target, task=task, from_logits=from_logits, ignore_index=ignore_index)
    check_average_for(inputs.task, average)
    return inputs


prepare = read_multiclass  # the metrics' name for the multi-class reader (checked, ignored rows dropped)


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
    preds, from_logits, preds_name = inputs.preds, inputs.from_logits, inputs.name
    for rows in _chunks(*preds.shape):
        _check_chunk(preds[rows], rows, from_logits, preds_name)


def top_label_bin_sums(inputs: Inputs, n_bins: int):
    """Per equal-width bin ``(count, sum of confidences, sum of correctness)`` of prepared inputs, as
    :class:`~hf_calibration.metrics.binning.BinSums`, from the same pass as :func:`top_label` with no per-row arrays."""
    from hf_calibration.metrics.binning import BinSums

    preds, target, from_logits, preds_name = inputs.preds, inputs.target, inputs.from_logits, inputs.name
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
    preds, from_logits, preds_name = inputs.preds, inputs.from_logits, inputs.name
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


def markdown_table(header: list[str], body: list[list[str]]) -> list[str]:
    """The lines of a Markdown table: ``header``, the rule (first column left-aligned, the others right-aligned) and
    the ``body`` rows, each column padded to its widest cell."""
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
            + " |"
        )

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return [line(header), rule] + [line(row) for row in body]
