"""Platt scaling (Platt 1999) of a sigmoid head: ``z_l -> a_l z_l + b_l``, one affine map of each label's logit."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_bool, check_int
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.sigmoid.base import SigmoidCalibrator
from hf_calibration.calibrators._machinery.sigmoid.fit import minimise_bce, platt_targets


@register_calibrator
class PlattScaling(
    SigmoidCalibrator,
    tags=["platt-scaling", "sigmoid", "multi-label"],
    paper_url="https://www.researchgate.net/publication/2594015",
):
    """Platt scaling of a binary or multi-label head: ``sigmoid(a_l z_l + b_l)`` per label ``l``.

    Each label's ``(a_l, b_l)`` minimises the binary cross-entropy of its kept fit samples (full-batch float64 LBFGS,
    all labels at once, ``_machinery/sigmoid/fit.py``), against Platt's smoothed targets ``(N_+ + 1)/(N_+ + 2)`` and
    ``1/(N_- + 2)`` by default, as Platt (1999) and scikit-learn's ``CalibratedClassifierCV(method="sigmoid")`` do
    (``smooth_targets=False``: the 0/1 labels, plain logistic regression on the logit, netcal's
    ``LogisticCalibration``). Logits in, logits out. A negative ``a_l`` would reverse the label's ranking; it does not
    arise on a head better than chance. Needs at least ``min_samples = 10`` labelled samples per label.

    Args:
        num_labels: L; None until the fit sets it (a loaded checkpoint passes it).
        task: ``"binary"`` / ``"multilabel"``; None until the fit reads it from the data.
        smooth_targets: Platt's smoothed targets (default True) or the 0/1 labels.
        max_iter: LBFGS iterations at most.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import PlattScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = (torch.rand(2000, 3, generator=g) < 0.3).long()  # three labels
        >>> logits = 4 * (2 * labels - 1) + 2 * torch.randn(2000, 3, generator=g)  # over-confident
        >>> platt = PlattScaling().fit(logits, labels, progress_bar=False)
        >>> platt(logits).shape, platt.fit_info_["task"]
        (torch.Size([2000, 3]), 'multilabel')
    """

    kind = "platt"
    paper_citation = (
        "J. Platt, *Probabilistic outputs for support vector machines and comparisons to regularized "
        "likelihood methods*, Advances in Large Margin Classifiers, 1999"
    )

    def __init__(
        self, num_labels: int | None = None, task: str | None = None, smooth_targets: bool = True, max_iter: int = 200
    ):
        self.smooth_targets = check_bool(smooth_targets, "smooth_targets")
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        super().__init__(num_labels, task)

    def _allocate(self, num_labels: int) -> None:
        self.weight = nn.Parameter(torch.ones(num_labels, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_labels, dtype=torch.float64))

    def _calibrate_logits(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.weight.detach().to(z) + self.bias.detach().to(z)

    def _fit_labels(self, z: np.ndarray, y: np.ndarray, mask: np.ndarray, progress_bar: bool) -> dict[str, Any]:
        targets = platt_targets(y, mask) if self.smooth_targets else y
        zt = torch.from_numpy(z)
        start = torch.stack([torch.ones(z.shape[1]), torch.zeros(z.shape[1])], dim=1).double()
        params, loss = minimise_bce(start, lambda x: zt * x[:, 0] + x[:, 1], targets, mask, max_iter=self.max_iter)
        with torch.no_grad():
            self.weight.copy_(params[:, 0])
            self.bias.copy_(params[:, 1])
        return {
            "weight": params[:, 0].tolist(),
            "bias": params[:, 1].tolist(),
            "best_objective": loss,
            "smooth_targets": self.smooth_targets,
        }

    def _card_description(self) -> str:
        return "It maps each label's logit z to a z + b (Platt scaling, one a and b per label), fitted by binary cross-entropy."
