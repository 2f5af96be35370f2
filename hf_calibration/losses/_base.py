"""`CalibrationLoss`: the shared contract of every training loss (forward and Trainer's `compute_loss_func`)."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import nn

from .._checks import IGNORE_INDEX, check_classification_shapes, check_labels_in_range

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


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 → float32 for the loss maths; float32/float64 are kept as they are."""
    return x.float() if x.dtype in _HALF_DTYPES else x


def _denominator(mask: torch.Tensor, num_items_in_batch: Any, dtype: torch.dtype) -> torch.Tensor | float:
    """What `_reduce` divides the masked sum by: ``num_items_in_batch`` when given, else the kept count (at least 1)."""
    if num_items_in_batch is None:
        return mask.sum().clamp_min(1)
    if isinstance(num_items_in_batch, torch.Tensor):
        if num_items_in_batch.numel() > 1:  # DataParallel hands a repeated count
            num_items_in_batch = num_items_in_batch.reshape(-1)[0]
        if num_items_in_batch.device != mask.device or num_items_in_batch.dtype != dtype:
            num_items_in_batch = num_items_in_batch.to(device=mask.device, dtype=dtype)
        return num_items_in_batch
    if isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, numbers.Real):
        raise TypeError(
            f"Expected argument `num_items_in_batch` to be a number or a tensor, but got {num_items_in_batch!r}."
        )
    return num_items_in_batch


def _reduce(per_sample: torch.Tensor, mask: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """Masked sum divided by `num_items_in_batch` when given, else by the number of kept samples.

    Dividing by the global count (as transformers' ``loss_utils.fixed_cross_entropy`` does) makes
    gradient accumulation and multi-process training give the gradient of one big batch. With every
    label ignored and no count given, the loss is 0 (not NaN).
    """
    denom = _denominator(mask, num_items_in_batch, per_sample.dtype)
    return torch.where(mask, per_sample, 0.0).sum() / denom  # where, not a product: ignored rows may hold inf


class CalibrationLoss(nn.Module):
    """Base class: validation, float32 upcast, ignore_index masking and reduction; subclasses give per-sample losses.

    Call it either as ``loss(logits, labels, features=None, num_items_in_batch=None)`` or as
    transformers' ``compute_loss_func(outputs, labels, num_items_in_batch=None)``: when the first
    argument is not a tensor, its ``logits`` are used.

    Args:
        ignore_index: label value whose samples are left out of every term (transformers' -100).
        validate_args: check that every label is in ``[0, K)`` or ``ignore_index``. This check is one
            tensor reduction and a single host synchronisation per call (its result decides whether to
            raise); turn it off to remove that synchronisation once the data pipeline is trusted.
            Shapes and dtypes are always checked (they cost nothing).
    """

    requires_features: bool = False

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
        logits, labels, mask = self._format(logits, labels)
        features = self._format_features(features, logits.shape[0])
        per_sample = self.per_sample_loss(logits, labels, mask, features)
        return _reduce(per_sample, mask, num_items_in_batch)

    def per_sample_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor:
        """Loss of each sample, shape ``(N,)``; ``labels`` has ignored entries replaced by 0, ``mask`` marks kept rows."""
        raise NotImplementedError

    # -- validation and formatting --------------------------------------------------------------
    def _format(self, logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"Expected argument `logits` to be a torch.Tensor, but got {type(logits).__name__}.")
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"Expected argument `labels` to be a torch.Tensor, but got {type(labels).__name__}.")
        check_classification_shapes(logits, labels, "logits", "labels")
        if labels.dtype != torch.long or labels.device != logits.device:  # a no-op `to` still costs a dispatch
            labels = labels.to(device=logits.device, dtype=torch.long)
        mask = labels != self.ignore_index
        safe_labels = labels * mask  # ignored rows → class 0, so gather stays in bounds; they are masked later
        num_classes = logits.shape[1]
        # floor(y / K) is 0 exactly for y in [0, K): one op, one reduction, one host sync; the slow
        # path below only runs to word the error
        if self.validate_args and bool(torch.div(safe_labels, num_classes, rounding_mode="floor").any()):
            check_labels_in_range(labels.cpu(), num_classes, "labels", self.ignore_index)
        return _upcast(logits), safe_labels, mask

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
