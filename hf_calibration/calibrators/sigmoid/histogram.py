"""Histogram binning (Zadrozny & Elkan 2001) of each label of a sigmoid head."""

from __future__ import annotations

import numpy as np

from hf_calibration._core.checks import check_choice, check_int
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.sigmoid.piecewise import PiecewiseSigmoidCalibrator
from hf_calibration.calibrators.histogram import BINNINGS, bin_frequencies, equal_mass_edges


@register_calibrator
class SigmoidHistogramBinning(
    PiecewiseSigmoidCalibrator,
    tags=["histogram-binning", "sigmoid", "multi-label"],
    paper_url="https://dl.acm.org/doi/10.5555/645530.655813",
):
    """Histogram binning of a binary or multi-label head: each label's probability becomes the fraction of positives
    among the fit samples of its bin (``e_{b-1} < p <= e_b``; an empty bin returns its centre), kept off 0 and 1
    (``_machinery/sigmoid/piecewise.py``).

    Args:
        num_labels, task, num_knots: set by the fit (a loaded checkpoint passes them).
        n_bins: bins per label; None (default): ``n // points_per_bin`` for a label fitted on ``n`` samples (at least 1).
        points_per_bin: fit samples per bin when ``n_bins`` is None (50, as the top-label histogram binning).
        binning: ``"equal_mass"`` (default: equal-count bins of the fit set's probabilities) or ``"equal_width"``
            (edges b / B, netcal's ``HistogramBinning``).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import SigmoidHistogramBinning
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = (torch.rand(1000, generator=g) < 0.3).long()
        >>> logits = 3 * (2 * labels - 1) + 2 * torch.randn(1000, generator=g)
        >>> hb = SigmoidHistogramBinning(n_bins=10, binning="equal_width").fit(logits, labels, progress_bar=False)
        >>> hb.fit_info_["knots_per_label"]
        [10]
    """

    kind = "sigmoid_histogram_binning"
    default_objective = "bin_frequency"
    objectives = ("bin_frequency",)
    step = True
    paper_citation = (
        "B. Zadrozny, C. Elkan, *Obtaining calibrated probability estimates from decision trees and naive "
        "Bayesian classifiers*, ICML 2001"
    )

    def __init__(
        self,
        num_labels: int | None = None,
        task: str | None = None,
        num_knots: int | None = None,
        n_bins: int | None = None,
        points_per_bin: int = 50,
        binning: str = "equal_mass",
    ):
        self.n_bins = None if n_bins is None else check_int(n_bins, "n_bins", minimum=1)
        self.points_per_bin = check_int(points_per_bin, "points_per_bin", minimum=1)
        self.binning = check_choice(binning, "binning", BINNINGS)
        super().__init__(num_labels, task, num_knots)

    def _fit_one(self, p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n_bins = self.n_bins or max(1, p.size // self.points_per_bin)
        n_bins = min(n_bins, p.size) if self.binning == "equal_mass" else n_bins
        edges = equal_mass_edges(p, n_bins) if self.binning == "equal_mass" else np.linspace(0, 1, n_bins + 1)[1:]
        edges[-1] = 1.0
        edges = np.maximum.accumulate(
            edges
        )  # equal-mass edges of tied probabilities repeat: bins then empty, never reversed
        return edges, bin_frequencies(p, y, edges)

    def _card_description(self) -> str:
        return "It replaces each label's probability by the frequency of positives in its bin of the fit set (histogram binning)."
