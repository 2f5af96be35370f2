"""Temperature scaling of a sigmoid head: ``z_l -> z_l / T`` (one T for every label) or ``z_l / T_l`` (one per label)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_bool, check_int
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.sigmoid.base import SigmoidCalibrator
from hf_calibration.calibrators._machinery.sigmoid.fit import minimise_bce

# a sigmoid head's logits are each label's log-odds, with no softmax normalisation to absorb a scale: under-confident
# heads (label-smoothed training) want T well below the softmax bounds' 0.05, logits of 1e4 want T above 100
T_MIN, T_MAX = 1e-3, 1e3


@register_calibrator
class SigmoidTemperatureScaling(
    SigmoidCalibrator,
    tags=["temperature-scaling", "sigmoid", "multi-label"],
    paper_url="https://arxiv.org/abs/1706.04599",
):
    """Temperature scaling of a binary or multi-label head: ``sigmoid(z_l / T)``, ``T = exp(t)`` in [0.001, 1000] (a
    warning says when the fit stops at a bound).

    ``per_label=False`` (default): one temperature for every label, minimising the mean over labels of each label's
    binary cross-entropy (Guo et al. 2017's one-parameter map, applied to each sigmoid); ``per_label=True``: one
    temperature per label, each minimising its own. Dividing by a positive T keeps each logit's sign, so no label
    crosses the 0.5 threshold (``preserves_argmax``). A binary head has one label: both forms are the same.
    Full-batch float64 LBFGS. Needs at least ``min_samples = 10`` labelled samples per label.

    Args:
        num_labels: L; None until the fit sets it (a loaded checkpoint passes it).
        task: ``"binary"`` / ``"multilabel"``; None until the fit reads it from the data.
        per_label: one temperature per label (True) or one shared (False, default).
        max_iter: LBFGS iterations at most.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import SigmoidTemperatureScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = (torch.rand(2000, generator=g) < 0.5).long()  # a binary head, one logit
        >>> logits = 3 * (2 * labels - 1) + 3 * torch.randn(2000, generator=g)  # over-confident
        >>> ts = SigmoidTemperatureScaling().fit(logits, labels, progress_bar=False)
        >>> ts.fitted_temperature > 1, ts(logits).shape
        (True, torch.Size([2000]))
    """

    kind = "sigmoid_temperature_scaling"
    preserves_argmax = True
    paper_citation = (
        "C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, *On Calibration of Modern Neural Networks*, ICML 2017"
    )

    def __init__(
        self, num_labels: int | None = None, task: str | None = None, per_label: bool = False, max_iter: int = 100
    ):
        self.per_label_temperature = check_bool(per_label, "per_label")
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        super().__init__(num_labels, task)

    def _allocate(self, num_labels: int) -> None:
        self.log_temperature = nn.Parameter(
            torch.zeros(num_labels if self.per_label_temperature else 1, dtype=torch.float64)
        )

    def _clamped(self) -> torch.Tensor:
        return self.log_temperature.detach().clamp(math.log(T_MIN), math.log(T_MAX))

    def _calibrate_logits(self, z: torch.Tensor) -> torch.Tensor:
        return z * torch.exp(-self._clamped()).to(z)

    @property
    def fitted_temperature(self) -> float | list[float]:
        """The fitted temperature (a list of them with ``per_label=True``)."""
        self._check_fitted()
        t = torch.exp(self._clamped())
        return t.tolist() if self.per_label_temperature else float(t[0])

    def _fit_labels(self, z: np.ndarray, y: np.ndarray, mask: np.ndarray, progress_bar: bool) -> dict[str, Any]:
        zt = torch.from_numpy(z)
        low, high = math.log(T_MIN), math.log(T_MAX)
        start = torch.zeros(z.shape[1] if self.per_label_temperature else 1, dtype=torch.float64)
        params, loss = minimise_bce(
            start,
            lambda t: zt * torch.exp(-t.clamp(low, high)),
            y,
            mask,
            shared=not self.per_label_temperature,
            max_iter=self.max_iter,
        )
        with torch.no_grad():
            self.log_temperature.copy_(params.clamp(low, high))
        temperatures = torch.exp(self._clamped()).tolist()
        at_bound = [t for t in temperatures if t <= T_MIN * (1 + 1e-6) or t >= T_MAX * (1 - 1e-6)]
        if at_bound:
            warnings.warn(
                f"SigmoidTemperatureScaling stopped at its bound T = {at_bound[0]:g} (the range is [{T_MIN:g}, {T_MAX:g}]): "
                "one temperature cannot fit these logits (their scale is off by more than that, or a label is separable). "
                "PlattScaling (a z + b per label) or BetaCalibration fits them.",
                UserWarning,
                stacklevel=4,
            )
        return {
            "temperature": temperatures if self.per_label_temperature else temperatures[0],
            "best_objective": loss,
            "per_label": self.per_label_temperature,
        }

    def _card_description(self) -> str:
        what = (
            "its own temperature per label" if self.per_label_temperature else "one temperature shared by every label"
        )
        return f"It divides each label's logit by {what} (temperature scaling of a sigmoid head), fitted by binary cross-entropy."
