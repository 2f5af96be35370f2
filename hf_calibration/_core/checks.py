"""Shared argument validators: one wording for every bad input, torch or numpy."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
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
    """Any torch tensor (any device, bf16 included), numpy array or nested list (or other sequence: the ``Column``
    that ``dataset["label"]`` is in datasets 4 and later) → numpy array.

    Floating tensors keep a numpy float dtype (bf16 → float32, exactly); nothing is upcast here.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):  # lists, tuples, a datasets Column
        try:
            return np.asarray(x if isinstance(x, (list, tuple)) else list(x))
        except ValueError as err:  # ragged rows
            raise ValueError(f"Expected `{name}` to be a rectangular array, but got ragged rows: {err}") from None
    raise TypeError(f"Expected `{name}` to be a torch.Tensor, numpy array or list, but got {type(x).__name__}.")


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"Expected argument `{name}` to be a bool, but got {value!r}.")
    return value


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Expected argument `{name}` to be an integer, but got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"Expected argument `{name}` to be an integer >= {minimum}, but got {value}.")
    return int(value)


def check_seed(value: Any, name: str = "seed", limit: int = 2**64) -> int:
    """A seed in [0, ``limit``): torch's generators take [0, 2**64), numpy's RandomState [0, 2**32). Negative seeds are
    refused everywhere (torch would map -1 to 2**64 - 1: two spellings of one stream)."""
    value = check_int(value, name, minimum=0)
    if value >= limit:
        bound = {2**64: "2**64", 2**32: "2**32"}.get(limit, str(limit))
        raise ValueError(f"Expected argument `{name}` to be an integer in [0, {bound} - 1], but got {value}.")
    return value


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
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        value = float(str(value))  # the decimal a float32 prints as (0.95), not its binary value (0.949999988...)
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


def check_folder_or_hub_id(name_or_path: Any, name: str, kind: str = "model") -> None:
    """``name_or_path`` is an existing folder or could be a Hub ``kind`` id (``name`` or ``owner/name``); else a
    ``ValueError`` naming the argument (a missing ``./folder`` must not read as a malformed Hub id)."""
    import os

    if os.path.isdir(name_or_path):
        return
    if os.path.exists(name_or_path):
        raise ValueError(
            f"Expected argument `{name}` to be a folder or a Hub {kind} id, but {str(name_or_path)!r} is a file."
        )
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(str(name_or_path))
    except HFValidationError:
        raise ValueError(
            f"Expected argument `{name}` to be a folder or a Hub {kind} id ('owner/name'), but there is no "
            f"folder {str(name_or_path)!r} (and it cannot be a Hub id)."
        ) from None


MULTILABEL_HINT = (
    " (N, L) 0/1 labels belong to a multi-label head (one sigmoid per label, config.problem_type="
    "'multi_label_classification'), which this softmax path does not score: pass task='multilabel' to the metrics, "
    "fit a sigmoid calibrator (platt, sigmoid_temperature_scaling, ...) and train with a multi-label loss "
    "(BinaryCrossEntropyLoss, SigmoidFocalLoss, AsymmetricLoss)."
)


def check_classification_shapes(
    preds: Any, target: Any, preds_name: str = "preds", target_name: str = "target"
) -> None:
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
            + (MULTILABEL_HINT if target.ndim == 2 else "")
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
            raise TypeError(
                f"Expected `{target_name}` to be an integer tensor of class indices, but got {target.dtype}."
            )
    else:
        if preds.dtype.kind != "f":
            raise TypeError(f"Expected `{preds_name}` to be a floating array, but got {preds.dtype}.")
        if target.dtype.kind not in "iu":
            raise TypeError(
                f"Expected `{target_name}` to be an integer array of class indices, but got {target.dtype}."
            )


def check_labels_in_range(
    target: Any, num_classes: int, target_name: str = "target", ignore_index: int | None = IGNORE_INDEX
) -> None:
    """Every label is in [0, K) or equal to `ignore_index`."""
    if isinstance(target, np.ndarray) and target.size and 0 <= target.min() and target.max() < num_classes:
        return  # the common case in two reductions, without masking out ignored labels first
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


CHANCE_RATIO = 5  # logits in [0, 1]^K sum to 1 +- 1e-2 by chance for a few percent of such rows, well below 1 in 5


def _count_rows(preds: Any, *, stop_at_other: bool = False):
    """:class:`hf_calibration._core.row_kinds.RowCounts` of the (N, K) ``preds``. Numpy arrays and CPU tensors are read in
    place by the compiled scan; tensors on another device are counted there (min, max and sum per row)."""
    from hf_calibration._core.row_kinds import RowCounts, count_rows

    if hasattr(preds, "raw_blocks"):  # rows read in blocks (a fit's FitRows: in memory or on disk)
        total = np.array([0, 0, 0, -1, -1], dtype=np.int64)
        for start, block in preds.raw_blocks():
            part = count_rows(block, PROBABILITY_DETECTION_TOLERANCE, stop_at_other=stop_at_other)
            total[:3] += part[:3]
            for i in (3, 4):
                if total[i] < 0 and part[i] >= 0:
                    total[i] = start + part[i]
            if stop_at_other and total[4] >= 0:
                break
        return RowCounts(*map(int, total))
    if isinstance(preds, torch.Tensor):
        preds = preds.detach()
        if preds.device.type != "cpu":
            low, high = torch.aminmax(preds, dim=1)
            boxed = (low >= 0) & (high <= 1)
            simplex = boxed & ((preds.sum(dim=1, dtype=torch.float64) - 1).abs() <= PROBABILITY_DETECTION_TOLERANCE)
            quarters = preds.double() * 4
            coarse = simplex & (quarters == quarters.floor()).all(dim=1)
            prob = simplex & ~coarse
            first = [int(rows[0, 0]) if rows.numel() else -1 for rows in (prob.nonzero(), (~simplex).nonzero())]
            return RowCounts(int(prob.sum()), int(coarse.sum()), int((boxed & ~simplex).sum()), *first)
        preds = (preds.float() if preds.dtype == torch.bfloat16 else preds).numpy()
    return count_rows(preds, PROBABILITY_DETECTION_TOLERANCE, stop_at_other=stop_at_other)


def _describe_row(preds: Any, row: int, name: str) -> str:
    """Why row ``row`` is not a probability vector: its range or its sum (a non-finite row raises the finiteness error)."""
    values = to_numpy(preds[row : row + 1], name)[0].astype(np.float64)
    if not np.isfinite(values).all():
        raise ValueError(f"Expected `{name}` to be finite, but row {row} contains NaN or inf.")
    with np.errstate(over="ignore"):
        low, high, total = values.min(), values.max(), values.sum()
    if not low >= 0:
        return f"holds {float(low)!r}"
    if not high <= 1:
        return f"holds {float(high)!r}"
    return f"sums to {float(total)!r}"


def looks_like_probabilities(preds: Any, name: str = "preds") -> bool:
    """True when every row of the (N, K) ``preds`` is a probability vector (values in [0, 1], sum 1 ± 1e-2).

    Every row is looked at, in one compiled pass that leaves a logit row at its first value outside [0, 1]
    (for logits a small fraction of the array is read). Non-finite values are not probabilities (they are
    reported by the finiteness check later). Some rows probability vectors and others not, wherever they are,
    raise ``ValueError``: such an array is neither (probabilities with a malformed row, or logits and
    probabilities concatenated), and guessing would give a silently wrong number. Two exceptions, where logits look
    like probabilities by chance: coarse rows (exact quarters: one-hot rows, ``[0.5, 0.5]``, as hand-written or
    rounded logits have) read either way and are no evidence beside other rows; and small logits (all in [0, 1], as
    with K = 2 or 3 and logits near 0) sum to 1 within 1e-2 in a few percent of such rows, so probability rows that
    are fewer than the other rows and at most 1 + 1/5 of the other rows in [0, 1]^K are taken for logits.
    """
    if preds.ndim != 2 or preds.shape[0] == 0:
        return False
    counts = _count_rows(preds)
    if counts.first_other < 0:
        return True  # every row a probability vector (coarse rows included)
    others = preds.shape[0] - counts.probability - counts.coarse
    if counts.probability == 0 or (
        counts.probability < others and counts.probability <= 1 + counts.boxed_other / CHANCE_RATIO
    ):
        return False  # logits: beside them, coarse rows read as logits, and as few probability rows as chance gives
    raise ValueError(
        f"Expected `{name}` to hold either logits or probabilities, but {counts.probability + counts.coarse} of its {preds.shape[0]} rows "
        f"are probability vectors (values in [0, 1] summing to 1 within {PROBABILITY_DETECTION_TOLERANCE:g}; row "
        f"{counts.first_probability} is one) and row {counts.first_other} is not (it {_describe_row(preds, counts.first_other, name)}). "
        "Pass `from_logits=True` or `False` explicitly (False: every row must then be a probability vector)."
    )


def resolve_from_logits(preds: Any, from_logits: bool | None, name: str = "preds") -> bool:
    """The ``from_logits`` to use: an explicit bool wins; ``None`` detects probabilities (``looks_like_probabilities``).

    ``from_logits=True`` on rows that look like probabilities warns once: softmax of probabilities is an
    almost uniform distribution, and every confidence computed from it is wrong.
    """
    if from_logits is None:
        return not looks_like_probabilities(preds, name)
    if not isinstance(from_logits, bool):
        raise TypeError(f"Expected argument `from_logits` to be None (detect), True or False, but got {from_logits!r}.")
    if from_logits and preds.ndim == 2 and preds.shape[0] and _count_rows(preds, stop_at_other=True).first_other < 0:
        import warnings

        warnings.warn(
            f"`{name}` looks like probabilities (rows in [0, 1] summing to 1) but `from_logits=True` was given: "
            "they are treated as logits and softmax-ed again. Pass `from_logits=None` (detect) or False if they are probabilities.",
            UserWarning,
            stacklevel=3,
        )
    return from_logits
