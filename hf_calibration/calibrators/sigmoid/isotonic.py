"""Isotonic regression (Zadrozny & Elkan 2002) of each label of a sigmoid head."""

from __future__ import annotations

import numpy as np

from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.sigmoid.piecewise import PiecewiseSigmoidCalibrator
from hf_calibration.calibrators.isotonic import CITATION, fit_isotonic


@register_calibrator
class SigmoidIsotonicRegression(
    PiecewiseSigmoidCalibrator,
    tags=["isotonic-regression", "sigmoid", "multi-label"],
    paper_url="https://doi.org/10.1145/775047.775151",
):
    """Isotonic regression of a binary or multi-label head: one non-decreasing map of each label's probability to its 0/1
    label, fitted by pool-adjacent-violators (scikit-learn's ``IsotonicRegression(out_of_bounds="clip")``: linear between
    its thresholds, constant beyond them), the probability then kept off 0 and 1 (``_machinery/sigmoid/piecewise.py``).
    Deterministic. Needs at least ``min_samples = 10`` labelled samples per label.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import SigmoidIsotonicRegression
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = (torch.rand(1000, 2, generator=g) < 0.3).long()
        >>> logits = 3 * (2 * labels - 1) + 2 * torch.randn(1000, 2, generator=g)
        >>> iso = SigmoidIsotonicRegression().fit(logits, labels, progress_bar=False)
        >>> iso.predict_proba(logits).shape
        torch.Size([1000, 2])
    """

    kind = "sigmoid_isotonic"
    default_objective = "isotonic_pav"
    objectives = ("isotonic_pav",)
    paper_citation = CITATION

    def _fit_one(self, p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fit_isotonic(p, y)

    def _card_description(self) -> str:
        return "It maps each label's probability through its own isotonic (non-decreasing) map, fitted by PAV."
