"""Calibrators whose parameters are sized by the number of classes K (vector, matrix, Dirichlet scaling, CTS).

Their weights cannot exist before the fit has seen K, yet ``from_pretrained`` must build a module of the
right shape before it loads the weights. So ``num_classes`` is a constructor argument: None until the fit
sets it (and records it in the checkpoint's config), the fitted K when a checkpoint is loaded. Logits with
another K are refused, since each parameter belongs to one class.

None of these maps is shift-invariant, so (as ``Calibrator`` arranges) they fit and apply on the logits relative
to their row maximum, ``z - max_k z_k``: logits and log-probabilities of one prediction calibrate alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import check_int
from hf_calibration.calibrators._machinery.base import Calibrator, logger


class PerClassCalibrator(Calibrator):
    """A ``Calibrator`` with per-class parameters, allocated by ``_allocate(K)`` for ``num_classes`` = K."""

    preserves_argmax = False

    def __init__(self, num_classes: int | None = None):
        super().__init__()
        self.num_classes = None if num_classes is None else check_int(num_classes, "num_classes", minimum=2)
        self._allocate(self.num_classes or 2)

    def _allocate(self, k: int) -> None:
        """Create the parameters and buffers for ``k`` classes, at their identity (uncalibrated) values."""
        raise NotImplementedError

    def _resize(self, k: int) -> None:
        """Size the parameters for a fit on ``k`` classes and record ``k`` in the checkpoint's config."""
        if self.num_classes is not None and self.num_classes != k:
            logger.info(
                "%s was built for K = %d classes; refitting it for K = %d.", type(self).__name__, self.num_classes, k
            )
        self.num_classes = k
        self._allocate(k)
        if isinstance(self._hub_mixin_config, dict):
            self._hub_mixin_config["num_classes"] = k

    def _check_logits(self, logits: Any) -> torch.Tensor:
        z = super()._check_logits(logits)
        if self.is_fitted and z.shape[1] != self.num_classes:
            raise ValueError(
                f"Expected `logits` to have K = {self.num_classes} classes (one parameter set per class), but got K = {z.shape[1]}."
            )
        return z

    def _fit_inputs(self, logits: Any, labels: Any, from_logits: bool | None) -> tuple[np.ndarray, np.ndarray, bool]:
        z, y, is_logits = super()._fit_inputs(logits, labels, from_logits)
        self._check_fit_labels(y, z.shape[1])
        return z, y, is_logits

    def _check_fit_labels(self, labels: np.ndarray, num_classes: int) -> None:
        missing = np.setdiff1d(np.arange(num_classes), labels)
        if missing.size:
            logger.warning(
                "%d of the %d classes have no calibration sample (first: class %d): their parameters are only set by the "
                "regularisation, if any.",
                missing.size,
                num_classes,
                int(missing[0]),
            )

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, " + super().extra_repr()
