"""`CalibrationLoss`: the shared contract of every training loss (forward and Trainer's `compute_loss_func`)."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import torch
from torch import nn

from hf_calibration._core.checks import IGNORE_INDEX, check_classification_shapes, check_labels_in_range

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _logits_of(outputs: Any) -> torch.Tensor:
    """The logits of a transformers `ModelOutput`, a dict or a tuple whose first item is the logits."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and "logits" in outputs:  # ModelOutput is a dict subclass
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    raise TypeError(
        "Expected argument `outputs` to be a logits tensor or a model output with `logits`, "
        f"but got {type(outputs).__name__}."
    )


def _stats_dtype(device: torch.device) -> torch.dtype:
    """float64 for exact counts and statistics, float32 where the device has no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 → float32 for the loss maths; float32/float64 are kept as they are."""
    return x.float() if x.dtype in _HALF_DTYPES else x


_COUNT_MESSAGE = "Expected argument `num_items_in_batch` to be a positive, finite count of the kept labels"


def _count(num_items_in_batch: Any) -> torch.Tensor | float | None:
    """``num_items_in_batch`` as a number or a one-element tensor; its value is checked by `CalibrationLoss._validate`."""
    if num_items_in_batch is None:
        return None
    if isinstance(num_items_in_batch, torch.Tensor):
        if num_items_in_batch.numel() == 0:
            raise ValueError(f"{_COUNT_MESSAGE}, but got an empty tensor.")
        if num_items_in_batch.numel() > 1:  # DataParallel hands a repeated count
            num_items_in_batch = num_items_in_batch.reshape(-1)[0]
        return num_items_in_batch
    if isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, numbers.Real):
        raise TypeError(
            f"Expected argument `num_items_in_batch` to be a number or a tensor, but got {num_items_in_batch!r}."
        )
    return num_items_in_batch


def _denominator(mask: torch.Tensor, count: torch.Tensor | float | None, dtype: torch.dtype) -> torch.Tensor | float:
    """What the masked sum is divided by: ``num_items_in_batch`` when given, else the kept count (at least 1).

    A count of 0 is only valid when no label is kept (`CalibrationLoss._validate`): the sum is then 0 and so is
    the loss, where ``0 / 0`` would be NaN.
    """
    if count is None:
        return mask.sum().clamp_min(1)
    if isinstance(count, torch.Tensor):
        if count.device != mask.device or count.dtype != dtype:
            count = count.to(device=mask.device, dtype=dtype)
        return torch.where(count == 0, 1.0, count)
    return count if count != 0 else 1


def _reduce(per_sample: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor | float) -> torch.Tensor:
    """Masked sum divided by ``denom`` (`_denominator`): ``num_items_in_batch`` when given, else the kept count.

    Dividing by the global count (as transformers' ``loss_utils.fixed_cross_entropy`` does) makes
    gradient accumulation and multi-process training give the gradient of one big batch. With every
    label ignored, the loss is 0 (not NaN).
    """
    return torch.where(mask, per_sample, 0.0).sum() / denom  # where, not a product: ignored rows may hold inf


class _Batch(NamedTuple):
    """A formatted call: upcast logits, labels with ignored entries replaced by 0, the kept-row mask, the reduction's
    denominator, and what `CalibrationLoss._validate` needs to word an error."""

    logits: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    denom: torch.Tensor | float
    raw_labels: torch.Tensor
    count: torch.Tensor | float | None


def _refuse_trainer_call(cls: type, args: tuple, kwargs: dict) -> None:
    """A loss *class* handed to ``Trainer(compute_loss_func=...)`` is called as ``cls(outputs, labels, num_items_in_batch=n)``."""
    first = args[0] if args else None
    if "num_items_in_batch" in kwargs or isinstance(first, (torch.Tensor, dict)) or hasattr(first, "logits"):
        if getattr(cls, "requires_features", False):  # an instance would stop at the next step: say both at once
            raise TypeError(
                f"{cls.__name__} is a loss class that needs the classifier's features, which the plain `Trainer` "
                f"does not capture: train with `hf_calibration.CalibrationTrainer(..., compute_loss={cls.__name__})`."
            )
        raise TypeError(
            f"{cls.__name__} is a loss class, but `compute_loss_func` needs a loss: pass an instance, "
            f"e.g. `compute_loss_func={cls.__name__}()`."
        )


class CalibrationLoss(nn.Module):
    """Base class: validation, float32 upcast, ignore_index masking and reduction; subclasses give per-sample losses.

    Call it either as ``loss(logits, labels, features=None, num_items_in_batch=None)`` or as
    transformers' ``compute_loss_func(outputs, labels, num_items_in_batch=None)``: when the first
    argument is not a tensor, its ``logits`` are used.

    Args:
        ignore_index: label value whose samples are left out of every term (transformers' -100).
        validate_args: check that every label is in ``[0, K)`` or ``ignore_index`` and that a tensor
            ``num_items_in_batch`` is a positive finite count. These checks are a few tensor reductions and a
            single host synchronisation per call (its result decides whether to raise); turn them off to
            remove that synchronisation once the data pipeline is trusted. Shapes, dtypes and a Python-number
            ``num_items_in_batch`` are always checked (they cost nothing).
    """

    requires_features: bool = False

    def __new__(cls, *args: Any, **kwargs: Any):
        _refuse_trainer_call(cls, args, kwargs)
        return super().__new__(cls)

    def __init__(self, *, ignore_index: int = IGNORE_INDEX, validate_args: bool = True):
        super().__init__()
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
            raise TypeError(f"Expected argument `ignore_index` to be an integer, but got {ignore_index!r}.")
        if not isinstance(validate_args, bool):
            raise TypeError(f"Expected argument `validate_args` to be a bool, but got {validate_args!r}.")
        self.ignore_index = int(ignore_index)
        self.validate_args = validate_args

    # -- the two calling conventions ------------------------------------------------------------
    def __call__(self, outputs: Any, labels: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not isinstance(outputs, torch.Tensor):  # Trainer's compute_loss_func(outputs, labels, num_items_in_batch)
            if args:
                kwargs.setdefault("num_items_in_batch", args[0])
                args = args[1:]
            outputs = _logits_of(outputs)
        return super().__call__(outputs, labels, *args, **kwargs)

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        features: torch.Tensor | None = None,
        num_items_in_batch: Any = None,
    ) -> torch.Tensor:
        batch = self._format(logits, labels, num_items_in_batch)
        features = self._format_features(features, batch.logits.shape[0])
        self._validate(batch)
        return self._batch_loss(batch, features)

    def _batch_loss(self, batch: _Batch, features: torch.Tensor | None) -> torch.Tensor:
        """The loss of a formatted, checked ``batch``: the per-sample losses reduced over its kept rows."""
        return _reduce(self.per_sample_loss(batch.logits, batch.labels, batch.mask, features), batch.mask, batch.denom)

    def per_sample_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor:
        """Loss of each sample, shape ``(N,)``; ``labels`` has ignored entries replaced by 0, ``mask`` marks kept rows."""
        raise NotImplementedError

    # -- validation and formatting --------------------------------------------------------------
    def _format(self, logits: Any, labels: Any, num_items_in_batch: Any = None) -> _Batch:
        """Types, shapes, dtype and the ignore mask; no host synchronisation (values are checked by `_validate`)."""
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"Expected argument `logits` to be a torch.Tensor, but got {type(logits).__name__}.")
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"Expected argument `labels` to be a torch.Tensor, but got {type(labels).__name__}.")
        check_classification_shapes(logits, labels, "logits", "labels")
        count = _count(num_items_in_batch)
        if labels.dtype != torch.long or labels.device != logits.device:  # a no-op `to` still costs a dispatch
            labels = labels.to(device=logits.device, dtype=torch.long)
        mask = labels != self.ignore_index
        safe_labels = labels * mask  # ignored rows → class 0, so gather stays in bounds; they are masked later
        logits = _upcast(logits)
        return _Batch(logits, safe_labels, mask, _denominator(mask, count, logits.dtype), labels, count)

    def _validate(self, batch: _Batch, extra: torch.Tensor | None = None) -> bool:
        """Check the values of a call with at most one host synchronisation; return whether ``extra`` held.

        Raises for a label outside ``[0, K)`` (and not ``ignore_index``) and for a ``num_items_in_batch`` that is
        not a positive finite count (0 is accepted only when no label is kept: the loss is then 0). ``extra`` is a
        subclass's own 0-dim boolean flag, read in the same transfer. With ``validate_args=False`` tensor values
        are not checked (no synchronisation) and this returns False.
        """
        count = batch.count
        if count is not None and not isinstance(count, torch.Tensor):  # a Python number: checked on the host
            self._check_count(float(count), batch.mask)
        if not self.validate_args:
            return False
        # floor(y / K) is 0 exactly for y in [0, K): one op and one reduction for the labels
        values = [torch.div(batch.labels, batch.logits.shape[1], rounding_mode="floor").any()]
        if isinstance(count, torch.Tensor):
            values.append(count)
        if extra is not None:
            values.append(extra)
        dtype = _stats_dtype(batch.mask.device)
        host = torch.stack([v.to(device=batch.mask.device, dtype=dtype) for v in values]).tolist()  # the one transfer
        if host[0]:  # the slow path words the error
            check_labels_in_range(batch.raw_labels.cpu(), batch.logits.shape[1], "labels", self.ignore_index)
        if isinstance(count, torch.Tensor):
            self._check_count(host[1], batch.mask)
        return bool(host[-1]) if extra is not None else False

    @staticmethod
    def _check_count(value: float, mask: torch.Tensor) -> None:
        if not 0 < value < float("inf") and not (value == 0 and not bool(mask.any())):
            raise ValueError(f"{_COUNT_MESSAGE}, but got {value!r}.")

    def _format_features(self, features: Any, n: int) -> torch.Tensor | None:
        if features is None:
            return None
        if not isinstance(features, torch.Tensor):
            raise TypeError(f"Expected argument `features` to be a torch.Tensor, but got {type(features).__name__}.")
        if features.ndim < 2:
            raise ValueError(
                f"Expected `features` to have shape (N, d), but got rank {features.ndim} with shape {tuple(features.shape)}."
            )
        if features.shape[0] != n:
            raise ValueError(
                f"Expected `features` and `logits` to have the same batch size, but got {features.shape[0]} and {n}."
            )
        if not features.is_floating_point():
            raise TypeError(f"Expected `features` to be a floating tensor, but got {features.dtype}.")
        return features

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._hparams().items())

    def _hparams(self) -> dict:
        return {}
