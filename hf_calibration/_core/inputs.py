"""What a public entry receives, read once: the scores, their kind, the head type and the labels, checked.

Every public entry point (the metric functions, a calibrator's ``fit`` / ``forward`` / ``predict_*``, the conformal
predictors, the accumulator's ``update``, the ``evaluate`` scripts, the command line, ``predict_logits`` and
``LogitsWriter``, the trainer's hooks and the serving paths) builds an :class:`Inputs` (or, without labels, asks
:func:`scores_kind`) once and hands it down. Internal calls take it as it is: they neither check nor detect again
(torchmetrics' ``validate_args=False``).

The rules, each written once here:

* **Head type** (``task``): an explicit ``task=`` wins; else the data decide (:func:`hf_calibration._core.tasks.resolve_task`:
  ``(N, L)`` 0/1 labels are multi-label, one score per sample is binary, anything else multi-class). Labels of shape
  ``(N, K)`` with exactly one 1 in every row are refused without ``task=``: they are as likely one-hot class indices of
  a softmax head as a multi-label head whose images carry one label each, and the two give different numbers. So are
  ``(N, L)`` 0/1 labels beside scores whose rows are probability vectors (a softmax output).
* **Kind** (``from_logits``): an explicit bool wins; else what a fitted object recorded at ``fit``; else detection
  (softmax heads: :func:`hf_calibration._core.checks.looks_like_probabilities`; sigmoid heads: every kept value in
  [0, 1], an entry whose label is ignored never decides).
* **Labels**: class indices of a softmax head are integers in ``[0, K)``; labels of a sigmoid head are 0 or 1 (any
  integer, boolean or float dtype holding exactly those); ``ignore_index`` (-100) marks a label to leave out. Anything
  else (0.9 for a binary head, 1.7 or NaN for a class index) is a ``ValueError`` naming the argument and the value.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

from hf_calibration._core.checks import (
    IGNORE_INDEX,
    MULTILABEL_HINT,
    PROBABILITY_DETECTION_TOLERANCE,
    check_classification_shapes,
    check_labels_in_range,
    resolve_from_logits,
    to_numpy,
)
from hf_calibration._core.tasks import SIGMOID_TASKS, check_shapes_for_task, check_task, resolve_task

__all__ = [
    "Inputs",
    "binary_labels",
    "check_from_logits",
    "check_ignore_index",
    "class_labels",
    "logits_and_labels",
    "model_logits",
    "read_inputs",
    "read_multiclass",
    "read_task",
    "scores_kind",
    "whole_labels",
]


class Inputs(NamedTuple):
    """A classifier's scores and labels as a public entry read them.

    ``preds``: the scores as numpy, not upcast (multi-class: ``(N, K)`` with ignored rows dropped; binary: ``(N,)``,
    ``(N, 1)`` or ``(N, 2)`` two softmax scores, ignored samples dropped; multi-label: ``(N, L)``). ``target``:
    multi-class ``(N,)`` int64 class indices; sigmoid heads ``(N, L)`` float64 0/1 (0 where ignored; binary ``L = 1``).
    ``mask``: sigmoid heads, the ``(N, L)`` kept labels; None for multi-class. ``from_logits`` and ``task`` resolved.
    """

    preds: np.ndarray
    target: np.ndarray
    from_logits: bool
    name: str = "preds"  # the scores' argument name, for messages
    task: str = "multiclass"
    mask: np.ndarray | None = None
    target_name: str = "target"

    @property
    def two_softmax(self) -> bool:
        """A binary head given as two softmax scores (its log-odds ``z_1 - z_0``)."""
        return self.task == "binary" and self.preds.ndim == 2 and self.preds.shape[1] == 2


# ----------------------------------------------------------------------------------------------- arguments


def logits_and_labels(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Accept ``(logits, labels)``, or a transformers ``PredictionOutput`` / ``EvalPrediction`` alone (tuple predictions:
    the logits come first), or a ``DiskLogits`` with its labels stored beside it."""
    if hasattr(logits, "predictions") and hasattr(logits, "label_ids"):
        if labels is None:
            labels = logits.label_ids
        logits = logits.predictions
    if isinstance(logits, tuple):  # predictions with extra outputs (hidden states, ...): logits come first
        if not logits:
            raise ValueError("Expected `logits` to be an (N, K) array, but got an empty tuple.")
        logits = logits[0]
    if isinstance(labels, tuple):
        labels = labels[0]
    if labels is None and getattr(logits, "labels", None) is not None and hasattr(logits, "blocks"):
        labels = logits.labels
    if labels is None:
        raise ValueError(
            "Expected argument `labels` (or a PredictionOutput / EvalPrediction carrying label_ids), but got None."
        )
    return logits, labels


def check_from_logits(from_logits: Any) -> bool | None:
    if from_logits is not None and not isinstance(from_logits, bool):
        raise TypeError(f"Expected argument `from_logits` to be None (detect), True or False, but got {from_logits!r}.")
    return from_logits


def check_ignore_index(ignore_index: Any) -> int | None:
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral)):
        raise TypeError(f"Expected argument `ignore_index` to be an integer or None, but got {ignore_index!r}.")
    return None if ignore_index is None else int(ignore_index)


# ----------------------------------------------------------------------------------------------- labels


def class_labels(
    target: Any,
    num_classes: int,
    *,
    ignore_index: int | None = IGNORE_INDEX,
    name: str = "target",
    integral_floats: bool = False,
) -> np.ndarray:
    """(N,) class indices of a softmax head as int64: integers in ``[0, num_classes)`` or ``ignore_index``.

    ``integral_floats``: also take a float array whose values are whole numbers (a column a file or an ``evaluate``
    script stored as floats); a fractional value or NaN is then a ``ValueError`` naming it, never truncated.
    """
    y = to_numpy(target, name)
    if y.ndim != 1:
        raise ValueError(
            f"Expected `{name}` to have shape (N,) (rank 1), but got rank {y.ndim} with shape {tuple(y.shape)}."
            + (MULTILABEL_HINT if y.ndim == 2 else "")
        )
    if integral_floats and y.dtype.kind == "f":
        whole = np.isfinite(y) & (y == np.round(y))
        if not whole.all():
            raise ValueError(
                f"Expected `{name}` to hold class indices (whole numbers in [0, {num_classes}) or {ignore_index}), "
                f"but found {y[~whole][0]!r}."
            )
        y = y.astype(np.int64)
    if y.dtype.kind not in "iu":
        raise TypeError(f"Expected `{name}` to be an integer array of class indices, but got {y.dtype}.")
    check_labels_in_range(y, num_classes, name, ignore_index)
    return y.astype(np.int64, copy=False)


def whole_labels(values: Any, name: str = "references") -> np.ndarray:
    """Labels that travelled as floats (an ``evaluate`` script's Arrow column, a file) back as int64: every value must be a
    whole number (a class index, 0 / 1, or -100); a fractional value or NaN is a ``ValueError`` naming it, never
    rounded or truncated. Integer and boolean arrays pass as they are."""
    y = to_numpy(values, name)
    if y.dtype.kind != "f":
        return y
    whole = np.isfinite(y) & (y == np.round(y))
    if not whole.all():
        raise ValueError(
            f"Expected `{name}` to hold class indices or 0/1 labels (whole numbers; -100 is ignored), but found "
            f"{y[~whole].flat[0].item()!r}."
        )
    return y.astype(np.int64)


def binary_labels(
    target: Any, *, ignore_index: int | None = IGNORE_INDEX, name: str = "target", hint: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """0/1 labels of a sigmoid head (any integer, boolean or float dtype holding 0 and 1) as float64, and the kept
    mask (``ignore_index`` left out). Anything else (0.9, 2, NaN) is a ``ValueError`` naming it (``hint``: what to say
    about the other reading of the arrays)."""
    y = to_numpy(target, name)
    if y.dtype == bool:
        return y.astype(np.float64), np.ones(y.shape, dtype=bool)
    if y.dtype.kind not in "iuf":
        raise TypeError(
            f"Expected `{name}` to hold 0/1 labels (integers, booleans or floats), but got dtype {y.dtype}."
        )
    mask = np.ones(y.shape, dtype=bool) if ignore_index is None else y != ignore_index
    kept = y[mask]
    bad = (kept != 0) & (kept != 1)  # NaN is neither
    if bad.any():
        value = kept[bad][0]
        raise ValueError(
            f"Expected `{name}` to hold 0/1 labels"
            + (f" (or {ignore_index}, ignored)" if ignore_index is not None else "")
            + f" for a binary / multi-label head, but found {value.item()!r}."
            + (hint or " Class indices of a multi-class problem are task='multiclass'.")
        )
    return np.where(mask, y, 0).astype(np.float64), mask


# ----------------------------------------------------------------------------------------------- head type


def _one_hot_rows(y: np.ndarray, ignore_index: int | None) -> bool:
    """Every row of the (N, L) labels holds exactly one 1 and otherwise 0 (ignored entries aside)."""
    if y.ndim != 2 or y.shape[1] < 2 or y.shape[0] == 0 or y.dtype.kind not in "iufb":
        return False
    kept = np.ones(y.shape, dtype=bool) if ignore_index is None or y.dtype == bool else y != ignore_index
    ones = (y == 1) & kept
    zeros = (y == 0) & kept
    return bool(((ones | zeros | ~kept).all()) and (ones.sum(axis=1) == 1).all())


def read_task(
    task: Any,
    preds: Any,
    target: Any,
    *,
    ignore_index: int | None = IGNORE_INDEX,
    from_logits: bool | None = None,
    preds_name: str = "preds",
    target_name: str = "target",
) -> str:
    """The head type of labelled scores (module docstring): an explicit ``task`` (checked against the shapes), else the
    data; one-hot labels, or 0/1 label rows beside probability rows, are refused without ``task=``."""
    if task is not None:
        return resolve_task(check_task(task), preds=preds, target=target)
    found = resolve_task(preds=preds, target=target)
    if found != "multilabel":
        return found
    y = to_numpy(target, target_name)
    if _one_hot_rows(y, ignore_index):
        raise ValueError(
            f"Expected `{target_name}` to say which head it belongs to, but its shape {tuple(y.shape)} with exactly one 1 in every "
            "row reads two ways: one-hot class indices of a softmax head, or a multi-label head whose samples carry one label "
            f"each, and the two give different numbers. Pass task='multiclass' with class indices (`{target_name}.argmax(1)`) "
            "or task='multilabel'."
        )
    p = to_numpy(preds, preds_name)
    if from_logits is not True and p.ndim == 2 and p.dtype.kind == "f" and _probability_rows(p):
        raise ValueError(
            f"Expected scores of a multi-label head beside the (N, L) 0/1 `{target_name}`, but every row of `{preds_name}` is a "
            "probability vector (values in [0, 1] summing to 1): the output of a softmax head, whose labels are class indices. "
            "Pass task='multilabel' if these are sigmoid probabilities, or task='multiclass' with class indices."
        )
    return found


# ----------------------------------------------------------------------------------------------- kind


def scores_kind(
    preds: Any, from_logits: bool | None, *, task: str = "multiclass", recorded: str | None = None, name: str = "preds"
) -> bool:
    """Whether ``preds`` hold logits: an explicit ``from_logits`` wins; else ``recorded`` (``"logits"`` /
    ``"probabilities"``, what a fitted object saw at ``fit``: a row alone is then read as the same row in a batch);
    else detection. A softmax head's rows that look like probabilities given to an object fitted on logits are read as
    logits, with a warning (pass ``from_logits=False`` if they are probabilities)."""
    check_from_logits(from_logits)
    if from_logits is not None:
        return resolve_from_logits(preds, from_logits, name) if task == "multiclass" else from_logits
    if recorded is not None:
        if recorded not in ("logits", "probabilities"):
            raise ValueError(
                f"Expected the recorded input kind to be 'logits' or 'probabilities', but got {recorded!r}."
            )
        softmax_rows = task == "multiclass" or (task == "binary" and _ndim(preds) == 2 and preds.shape[1] == 2)
        if recorded == "probabilities":
            _check_recorded_probabilities(preds, softmax_rows, name)
        # rows of probabilities given to an object fitted on logits: all of them (one row alone too) are read as
        # logits, with a warning; some of them beside other rows are neither, and refused (looks_like_probabilities)
        if (
            recorded == "logits"
            and task == "multiclass"
            and _ndim(preds) == 2
            and preds.shape[0]
            and _looks_like_probabilities(preds, name)
        ):
            warnings.warn(
                f"`{name}` look like probabilities (every row in [0, 1] summing to 1), but this was fitted on logits: "
                "they are treated as logits. Pass from_logits=False if they are probabilities.",
                UserWarning,
                stacklevel=3,
            )
        return recorded == "logits"
    if task == "multiclass" or (task == "binary" and _ndim(preds) == 2 and preds.shape[1] == 2):
        return resolve_from_logits(preds, None, name)
    return not _in_unit_box(preds)


def _check_recorded_probabilities(preds: Any, softmax_rows: bool, name: str) -> None:
    """Scores given to an object fitted on probabilities must be probabilities: else a ``ValueError`` that names the row
    and says where the kind came from (not a ``from_logits`` the caller never passed)."""
    from hf_calibration._core.checks import _count_rows, _describe_row

    if softmax_rows:
        with np.errstate(over="ignore"):
            bad = _count_rows(preds, stop_at_other=True).first_other if _ndim(preds) == 2 and preds.shape[0] else -1
        if bad < 0:
            return
        detail = f"row {bad} {_describe_row(preds, bad, name)}"
        what = "rows in [0, 1] summing to 1"
    else:
        if _in_unit_box(preds):
            return
        values = to_numpy(preds, name)
        detail = f"values in [{np.nanmin(values):.4g}, {np.nanmax(values):.4g}]"
        what = "values in [0, 1]"
    raise ValueError(
        f"Expected `{name}` to hold probabilities ({what}), the kind this was fitted on (its fit recorded "
        f"input='probabilities'), but {detail}. Pass from_logits=True if they are logits."
    )


def _ndim(x: Any) -> int:
    return len(getattr(x, "shape", ()))


def _looks_like_probabilities(preds: Any, name: str) -> bool:
    from hf_calibration._core.checks import looks_like_probabilities

    with np.errstate(over="ignore"):
        return looks_like_probabilities(preds, name)


def _probability_rows(preds: Any) -> bool:
    if _ndim(preds) != 2 or preds.shape[0] == 0:
        return False
    from hf_calibration._core.checks import _count_rows

    with np.errstate(over="ignore"):
        return _count_rows(preds, stop_at_other=True).first_other < 0


def _in_unit_box(x: Any) -> bool:
    """Every value in [0, 1] (NaN is not): the sigmoid heads' probabilities."""
    if isinstance(x, torch.Tensor):
        return bool(((x >= 0) & (x <= 1)).all())
    x = np.asarray(x)
    return x.size > 0 and bool(((x >= 0) & (x <= 1)).all())


# ----------------------------------------------------------------------------------------------- labelled inputs


def read_inputs(
    preds: Any,
    target: Any,
    *,
    task: str | None = None,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    preds_name: str = "preds",
    target_name: str = "target",
) -> Inputs:
    """Check labelled scores once and decide their head type and kind (module docstring); see :class:`Inputs`."""
    check_from_logits(from_logits)
    ignore_index = check_ignore_index(ignore_index)
    preds = to_numpy(preds, preds_name)
    target = to_numpy(target, target_name)
    task = read_task(
        task,
        preds,
        target,
        ignore_index=ignore_index,
        from_logits=from_logits,
        preds_name=preds_name,
        target_name=target_name,
    )
    if task == "multiclass":
        return _multiclass(preds, target, from_logits, ignore_index, preds_name, target_name)
    return _sigmoid(preds, target, task, from_logits, ignore_index, preds_name, target_name)


def read_multiclass(
    preds: Any,
    target: Any,
    *,
    from_logits: bool | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    preds_name: str = "preds",
    target_name: str = "target",
) -> Inputs:
    """:func:`read_inputs` of an entry that serves softmax heads only (classwise ECE, smCE, a softmax calibrator's fit)."""
    check_from_logits(from_logits)
    return _multiclass(
        to_numpy(preds, preds_name),
        to_numpy(target, target_name),
        from_logits,
        check_ignore_index(ignore_index),
        preds_name,
        target_name,
    )


def _multiclass(preds, target, from_logits, ignore_index, preds_name, target_name) -> Inputs:
    target = whole_labels(target, target_name)  # class indices stored as floats: 2.0 is class 2, 1.7 is refused
    check_classification_shapes(preds, target, preds_name, target_name)
    check_labels_in_range(target, preds.shape[1], target_name, ignore_index)
    if ignore_index is not None and target.size:  # a mask only when ignore_index lies within the labels' range
        keep = target != ignore_index if target.min() <= ignore_index <= target.max() else None
        if keep is not None and not keep.all():
            preds, target = preds[keep], target[keep]
            if preds.shape[0] == 0:
                raise ValueError(
                    f"Expected at least one label in `{target_name}` that is not ignore_index={ignore_index}."
                )
    with np.errstate(over="ignore"):  # a row sum of finite logits near 1e308 may overflow: not probabilities
        from_logits = resolve_from_logits(preds, from_logits, preds_name)
    return Inputs(preds, target.astype(np.int64, copy=False), from_logits, preds_name, "multiclass", None, target_name)


def _sigmoid(preds, target, task, from_logits, ignore_index, preds_name, target_name) -> Inputs:
    check_shapes_for_task(task, preds, target)
    if preds.dtype.kind != "f":
        raise TypeError(f"Expected `{preds_name}` to be a floating array, but got {preds.dtype}.")
    if preds.ndim == 0 or preds.shape[0] == 0:
        raise ValueError(f"Expected `{preds_name}` to be non-empty, but got shape {tuple(preds.shape)}.")
    two_softmax = task == "binary" and preds.ndim == 2 and preds.shape[1] == 2
    if task == "binary":
        target = target.reshape(-1) if target.ndim == 2 else target
        if target.ndim != 1:
            raise ValueError(
                f"Expected `{target_name}` to have shape (N,) for a binary head, but got shape {tuple(target.shape)}."
            )
    if target.shape[0] != preds.shape[0]:
        raise ValueError(
            f"Expected `{preds_name}` and `{target_name}` to have the same number of samples, but got "
            f"{preds.shape[0]} and {target.shape[0]}."
        )
    if task == "multilabel" and preds.shape != target.shape:
        raise ValueError(
            f"Expected `{preds_name}` and `{target_name}` to have the same shape (N, L) for a multi-label head, "
            f"but got {tuple(preds.shape)} and {tuple(target.shape)}."
        )
    hint = ""
    if task == "binary" and not two_softmax:
        hint = (
            f" For class indices, expected `{preds_name}` to have shape (N, K) with K >= 2 (a multi-class head), but got "
            f"shape {tuple(preds.shape)}: one score per sample is a binary head."
        )
    y, mask = binary_labels(target, ignore_index=ignore_index, name=target_name, hint=hint)
    if y.ndim == 1:
        y, mask = y[:, None], mask[:, None]
    if (
        task == "binary" and not mask.all()
    ):  # one label a sample: an ignored sample is dropped, as the multi-class path does
        keep = mask[:, 0]
        preds, y, mask = preds[keep], y[keep], mask[keep]
    if not mask.any():
        raise ValueError(f"Expected at least one label in `{target_name}` that is not ignore_index={ignore_index}.")
    _check_finite(preds, preds_name)
    if two_softmax:
        is_logits = resolve_from_logits(preds, from_logits, preds_name)
    else:
        kept = preds.reshape(preds.shape[0], -1)[mask]
        is_logits = (not _in_unit_box(kept)) if from_logits is None else from_logits
    if not is_logits:
        check_sigmoid_probabilities(
            preds if two_softmax else preds.reshape(preds.shape[0], -1)[mask], preds_name, rows=two_softmax
        )
    return Inputs(preds, y, bool(is_logits), preds_name, task, mask, target_name)


def _check_finite(x: np.ndarray, name: str) -> None:
    finite = np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)
    if not finite.all():
        raise ValueError(
            f"Expected `{name}` to be finite, but row {int(np.flatnonzero(~finite)[0])} contains NaN or inf."
        )


def check_sigmoid_probabilities(p: np.ndarray, name: str, rows: bool = False) -> None:
    """Probabilities of a sigmoid head are in [0, 1] (``rows``: two softmax columns, each row summing to 1)."""
    if p.size and (p.min() < 0 or p.max() > 1):
        raise ValueError(
            f"Expected `{name}` to hold probabilities in [0, 1] (from_logits=False), but found values in "
            f"[{p.min():.4g}, {p.max():.4g}]."
        )
    if rows:
        off = np.abs(p.sum(axis=1, dtype=np.float64) - 1.0)
        if off.max() > PROBABILITY_DETECTION_TOLERANCE:
            bad = int(np.argmax(off))
            raise ValueError(
                f"Expected each row of `{name}` to sum to 1 within {PROBABILITY_DETECTION_TOLERANCE:g} "
                f"(from_logits=False), but row {bad} sums to {p[bad].sum():.6g}."
            )


def is_sigmoid(task: str) -> bool:
    return task in SIGMOID_TASKS


def model_logits(output: Any) -> torch.Tensor:
    """The (N, K) logits of a model's output: a ``ModelOutput`` / dict with ``logits``, a tuple, or a tensor (timm)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, dict) else None
    if logits is None and isinstance(output, tuple):
        logits = next(
            (t for t in output if isinstance(t, torch.Tensor) and t.ndim == 2 and t.is_floating_point()), None
        )
    if logits is None:
        raise ValueError("The model's output holds no (N, K) logits (a `logits` entry, or a rank-2 floating tensor).")
    return logits
