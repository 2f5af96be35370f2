"""Shared argument validators: one wording for every bad input, torch or numpy."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100

_FLOAT_TOLERANCE = {  # how far a probability row may sum from 1, by input precision
    np.dtype(np.float64): 1e-6,
    np.dtype(np.float32): 1e-4,
    np.dtype(np.float16): 1e-2,
}


def is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor))


def to_numpy(x: Any, name: str) -> np.ndarray:
    """Any torch tensor (any device, bf16 included), numpy array or nested list → numpy array.

    Floating tensors keep a numpy float dtype (bf16 → float32, exactly); nothing is upcast here.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple)):
        try:
            return np.asarray(x)
        except ValueError as err:  # ragged rows
            raise ValueError(f"Expected `{name}` to be a rectangular array, but got ragged rows: {err}") from None
    raise TypeError(f"Expected `{name}` to be a torch.Tensor, numpy array or list, but got {type(x).__name__}.")


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Expected argument `{name}` to be an integer, but got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"Expected argument `{name}` to be an integer >= {minimum}, but got {value}.")
    return int(value)


def check_float(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected argument `{name}` to be a real number, but got {value!r}.")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"Expected argument `{name}` to be finite, but got {value}.")
    if minimum is not None and (value < minimum or (not min_inclusive and value == minimum)):
        bound = ">=" if min_inclusive else ">"
        raise ValueError(f"Expected argument `{name}` to be {bound} {minimum}, but got {value}.")
    if maximum is not None and (value > maximum or (not max_inclusive and value == maximum)):
        bound = "<=" if max_inclusive else "<"
        raise ValueError(f"Expected argument `{name}` to be {bound} {maximum}, but got {value}.")
    return value


def check_choice(value: Any, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"Expected argument `{name}` to be one of {sorted(choices)}, but got {value!r}.")
    return value


def check_classification_shapes(preds: Any, target: Any, preds_name: str = "preds", target_name: str = "target") -> None:
    """Rank, size, K >= 2 and dtype checks shared by metrics, losses and calibrators.

    Works on torch tensors and numpy arrays without copying them.
    """
    if preds.ndim != 2:
        raise ValueError(
            f"Expected `{preds_name}` to have shape (N, K) (rank 2), but got rank {preds.ndim} with shape {tuple(preds.shape)}."
        )
    if target.ndim != 1:
        raise ValueError(
            f"Expected `{target_name}` to have shape (N,) (rank 1), but got rank {target.ndim} with shape {tuple(target.shape)}."
        )
    n, k = preds.shape
    if n == 0:
        raise ValueError(f"Expected `{preds_name}` to be non-empty, but got shape {tuple(preds.shape)}.")
    if k < 2:
        raise ValueError(f"Expected `{preds_name}` to have K >= 2 classes, but got K = {k}.")
    if target.shape[0] != n:
        raise ValueError(
            f"Expected `{preds_name}` and `{target_name}` to have the same number of samples, but got {n} and {target.shape[0]}."
        )
    if isinstance(preds, torch.Tensor):
        if not preds.is_floating_point():
            raise TypeError(f"Expected `{preds_name}` to be a floating tensor, but got {preds.dtype}.")
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TypeError(f"Expected `{target_name}` to be an integer tensor of class indices, but got {target.dtype}.")
    else:
        if preds.dtype.kind != "f":
            raise TypeError(f"Expected `{preds_name}` to be a floating array, but got {preds.dtype}.")
        if target.dtype.kind not in "iu":
            raise TypeError(f"Expected `{target_name}` to be an integer array of class indices, but got {target.dtype}.")


def check_labels_in_range(target: Any, num_classes: int, target_name: str = "target", ignore_index: int | None = IGNORE_INDEX) -> None:
    """Every label is in [0, K) or equal to `ignore_index`."""
    lib = torch if isinstance(target, torch.Tensor) else np
    valid = target if ignore_index is None else target[target != ignore_index]
    if valid.shape[0] and (bool(lib.any(valid < 0)) or bool(lib.any(valid >= num_classes))):
        bad = valid[(valid < 0) | (valid >= num_classes)][0]
        raise ValueError(
            f"Expected `{target_name}` to hold class indices in [0, {num_classes})"
            + (f" or {ignore_index} (ignored)" if ignore_index is not None else "")
            + f", but found {int(bad)}."
        )


def row_sum_tolerance(dtype: np.dtype) -> float:
    return _FLOAT_TOLERANCE.get(np.dtype(dtype), 1e-4)


# ----------------------------------------------------------------------------- logits or probabilities?

PROBABILITY_DETECTION_TOLERANCE = 1e-2  # float16 / bfloat16 softmax rows, even stored as float32, sum to 1 within this
_DETECTION_CHUNK_ROWS = 4096


def _probability_rows(chunk: Any) -> bool:
    """Every value of ``chunk`` in [0, 1] and every row summing to 1 within the detection tolerance."""
    if isinstance(chunk, torch.Tensor):
        chunk = chunk.detach()
        sums = chunk.sum(dim=1, dtype=torch.float64)
        return bool((chunk.min() >= 0) & (chunk.max() <= 1) & ((sums - 1).abs().max() <= PROBABILITY_DETECTION_TOLERANCE))
    sums = chunk.sum(axis=1, dtype=np.float64)
    return bool(chunk.min() >= 0 and chunk.max() <= 1 and np.abs(sums - 1).max() <= PROBABILITY_DETECTION_TOLERANCE)


def _leading_rows_are_probabilities(preds: Any) -> bool:
    """The first 4,096 rows are probability vectors; the first row alone decides for logits (nearly all fail on
    it), so logits cost one row's look, not three passes over 4,096 rows (half a calibrator's forward at K = 1000)."""
    return _probability_rows(preds[:1]) and _probability_rows(preds[:_DETECTION_CHUNK_ROWS])


def looks_like_probabilities(preds: Any) -> bool:
    """True when every row of the (N, K) ``preds`` is a probability vector (values in [0, 1], sum 1 ± 1e-2).

    Decides for the whole array. It reads only the first 4,096 rows when those already hold a value
    outside [0, 1] or a row sum away from 1 (real logits nearly always do), so logits cost almost nothing.
    Non-finite values are not probabilities (they are reported by the finiteness check later).
    Raises ``ValueError`` when the first rows are probability vectors and a later row is not: such an
    array is neither, and guessing would give a silently wrong number.
    """
    n = preds.shape[0]
    if n == 0 or preds.ndim != 2:
        return False
    if not _leading_rows_are_probabilities(preds):
        return False
    for start in range(_DETECTION_CHUNK_ROWS, n, 1 << 16):
        if not _probability_rows(preds[start : start + (1 << 16)]):
            raise ValueError(
                "Expected `preds` to hold either logits or probabilities, but its first rows are probability vectors "
                f"(in [0, 1], summing to 1) and a row after {start} is not. Pass `from_logits=True` or `False` explicitly."
            )
    return True


def resolve_from_logits(preds: Any, from_logits: bool | None, name: str = "preds") -> bool:
    """The ``from_logits`` to use: an explicit bool wins; ``None`` detects probabilities (``looks_like_probabilities``).

    ``from_logits=True`` on rows that look like probabilities warns once: softmax of probabilities is an
    almost uniform distribution, and every confidence computed from it is wrong.
    """
    if from_logits is None:
        return not looks_like_probabilities(preds)
    if not isinstance(from_logits, bool):
        raise TypeError(f"Expected argument `from_logits` to be None (detect), True or False, but got {from_logits!r}.")
    if from_logits and preds.ndim == 2 and preds.shape[0] and _leading_rows_are_probabilities(preds):
        import warnings

        warnings.warn(
            f"`{name}` looks like probabilities (rows in [0, 1] summing to 1) but `from_logits=True` was given: "
            "they are treated as logits and softmax-ed again. Pass `from_logits=None` (detect) or False if they are probabilities.",
            UserWarning,
            stacklevel=3,
        )
    return from_logits
