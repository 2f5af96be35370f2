"""Top-label histogram binning (Zadrozny & Elkan 2001; Gupta & Ramdas 2022, "Top-label calibration and
multiclass-to-binary reductions", ICLR).

The top-label confidences of the fit set are cut into bins; a confidence in bin ``b`` is replaced by the
fraction of bin ``b``'s fit samples that were classified correctly (the bin's frequency: among maps constant on
each bin it minimises both the top-label NLL and the top-label squared error). Bin ``b`` holds
``e_{b-1} < p <= e_b``.

Defaults are Gupta & Ramdas's top-label histogram binning (TL-HB): one binning per predicted class, equal-mass
bins with ``points_per_bin = 50`` fit samples each (``n // 50`` bins for a class predicted ``n`` times; upper
edge = the largest confidence of each ``np.array_split`` group of the sorted confidences).
``per_class=False, binning="equal_width", n_bins=15`` is the confidence binning of Guo et al. 2017 and of netcal's
``HistogramBinning`` (equal-width bins on (0, 1]; an empty bin returns its centre).

Departure from Gupta & Ramdas: their code leaves a predicted class with fewer than ``points_per_bin`` fit
predictions uncalibrated (the identity; it prints a line). On the shared CIFAR-100 validation logits (5,000 samples)
that is 48-65 of the 100 classes (72-95 on a 4,000-sample training fold), and on a small set (270 samples x 10
classes) every class, so the calibrator silently did nothing. Here those classes
share one binning instead: the same rule applied to every fit prediction pooled (``n // points_per_bin`` bins of
all ``n`` top-label confidences, Guo et al.'s confidence binning with a data-driven bin count), the "pooled" map.
Only a fit set with fewer than ``points_per_bin`` samples in all is left as it is, and then the fit warns
(``UncalibratedWarning``) and records why in ``fit_info_["uncalibrated"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import check_bool, check_choice, check_int
from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators._machinery.piecewise import PiecewiseMaps
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.toplabel import TopLabelCalibrator

BINNINGS = ("equal_mass", "equal_width")


def equal_mass_edges(confidence: np.ndarray, n_bins: int) -> np.ndarray:
    """Upper bin edges of ``n_bins`` equal-count groups of the sorted confidences (Gupta & Ramdas); last edge 1."""
    groups = np.array_split(np.sort(confidence), n_bins)
    return np.array([group[-1] for group in groups[:-1]] + [1.0])


def bin_frequencies(confidence: np.ndarray, correct: np.ndarray, upper_edges: np.ndarray) -> np.ndarray:
    """Fraction correct per bin ``e_{b-1} < p <= e_b``; an empty bin gets the centre of its interval."""
    n_bins = upper_edges.size
    index = np.searchsorted(upper_edges[:-1], confidence, side="left")
    count = np.bincount(index, minlength=n_bins)
    hits = np.bincount(index, weights=correct.astype(np.float64), minlength=n_bins)
    lower = np.concatenate([[0.0], upper_edges[:-1]])
    centre = 0.5 * (lower + upper_edges)
    return np.where(count > 0, hits / np.maximum(count, 1), centre)


@register_calibrator
class HistogramBinning(
    TopLabelCalibrator,
    tags=["histogram-binning", "top-label"],
    paper_url="https://arxiv.org/abs/2107.08353",
):
    """Top-label histogram binning: the top confidence becomes its bin's fit-set accuracy.

    Keeps the argmax (top-label adaptor, ``_machinery/toplabel.py``). Deterministic. Needs at least ``min_samples = 10``
    labelled samples; a map with fewer fit samples than bins gets one bin per sample. A predicted class too rare
    for a bin of its own uses the pooled binning of all predictions (module docstring). ``fit_info_`` records the
    bin count of every map: ``bins_per_class`` (0: the class uses the pooled map), ``pooled_bins``,
    ``pooled_classes`` and ``bins`` (their total).

    Args:
        n_bins: bins per map; None (default): ``n // points_per_bin`` for a map fitted on ``n`` samples (at least
            ``points_per_bin`` samples per bin).
        points_per_bin: fit samples per bin when ``n_bins`` is None (50, Gupta & Ramdas).
        binning: ``"equal_mass"`` (default: equal-count bins from the fit set) or ``"equal_width"`` (edges b / B).
        per_class: one binning per predicted class (default, top-label calibration in Gupta & Ramdas's
            sense) or one binning of every prediction's confidence (Guo et al.; netcal).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import HistogramBinning
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (2000,), generator=g)
        >>> logits = 3 * torch.randn(2000, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> hb = HistogramBinning().fit(logits, labels, progress_bar=False)
        >>> bool(torch.equal(hb(logits).argmax(1), logits.argmax(1)))
        True
    """

    kind = "histogram_binning"
    smooth = False
    min_samples = 10
    default_objective = "bin_frequency"
    criterion = "the fraction correct of each confidence bin of the fit set"
    paper_citation = (
        "C. Gupta, A. Ramdas, *Top-label calibration and multiclass-to-binary reductions*, ICLR 2022; "
        "B. Zadrozny, C. Elkan, *Obtaining calibrated probability estimates from decision trees and naive "
        "Bayesian classifiers*, ICML 2001"
    )

    def __init__(
        self, n_bins: int | None = None, points_per_bin: int = 50, binning: str = "equal_mass", per_class: bool = True
    ):
        super().__init__()
        self.n_bins = None if n_bins is None else check_int(n_bins, "n_bins", minimum=1)
        self.points_per_bin = check_int(points_per_bin, "points_per_bin", minimum=1)
        self.binning = check_choice(binning, "binning", BINNINGS)
        self.per_class = check_bool(per_class, "per_class")
        self.maps = PiecewiseMaps()

    @property
    def per_class_maps(self) -> bool:
        return self.per_class

    def _bins_for(self, n: int) -> int:
        bins = n // self.points_per_bin if self.n_bins is None else self.n_bins
        return min(bins, n) if self.binning == "equal_mass" else bins

    def _fit_one(self, confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n_bins = self._bins_for(confidence.size)
        if n_bins == 0:
            return np.zeros(0), np.zeros(0)
        if self.binning == "equal_width":
            edges = np.linspace(0.0, 1.0, n_bins + 1)[1:]
        else:
            edges = equal_mass_edges(confidence, n_bins)
        return edges, bin_frequencies(confidence, correct, edges)

    def _fit_confidence(
        self, confidence: np.ndarray, correct: np.ndarray, top: np.ndarray, num_classes: int
    ) -> dict[str, Any]:
        pooled = (np.zeros(0), np.zeros(0))
        if not self.per_class:
            maps = [self._fit_one(confidence, correct)]
            info = {"bins": len(maps[0][0])}
        else:
            counts = np.bincount(top, minlength=num_classes)
            maps = [
                self._fit_one(confidence[top == k], correct[top == k]) if counts[k] else pooled
                for k in range(num_classes)
            ]
            own = np.array([len(edges) > 0 for edges, _ in maps])
            if not own.all():  # a class too rare for its own bins (or never predicted here) uses the pooled binning
                pooled = self._fit_one(confidence, correct)
            maps.append(pooled)  # group K
            info = {
                "bins": int(sum(len(edges) for edges, _ in maps)),
                "bins_per_class": [len(edges) for edges, _ in maps[:-1]],
                "pooled_bins": len(pooled[0]),
                "pooled_classes": int((~own).sum()),
            }
        self.maps.set(maps)
        if self.n_bins is None:
            info["points_per_bin"] = self.points_per_bin
        return info

    def _identity_reason(self, classes: list[int]) -> str | None:
        n = (self.fit_info_ or {}).get("num_samples")
        if self.n_bins is None and n is not None and n < self.points_per_bin:
            return (
                f"the fit set has {n} samples, fewer than points_per_bin = {self.points_per_bin} for one bin: "
                "pass a smaller points_per_bin (or n_bins) to bin it anyway"
            )
        return None

    def _map_confidence(self, confidence: np.ndarray, top: np.ndarray) -> np.ndarray:
        if not self.per_class:
            return self.maps.evaluate(confidence, None, step=True)
        return self.maps.evaluate(confidence, self._groups(top), step=True)

    def _map_confidence_graph(self, confidence, top):
        tables = self.maps.graph_tables()
        if not self.per_class:
            return _graph.step_lookup(confidence, torch.zeros_like(top), tables)
        sizes = tables[2]
        k = (self.fit_info_ or {}).get("num_classes", sizes.numel())
        if sizes.numel() != k + 1:  # no pooled map (a checkpoint from before it existed): each class's own, or none
            return _graph.step_lookup(confidence, top, tables)
        # as _groups: the class's own binning, else the pooled one (group K) when it has bins, else the identity
        groups = torch.where(sizes[top] > 0, top, torch.full_like(top, k))
        return _graph.step_lookup(confidence, groups, tables)

    def _groups(self, top: np.ndarray) -> np.ndarray:
        """The map of each prediction: its class's own binning, else the pooled one (group K), else none (identity)."""
        sizes = np.diff(self.maps.offsets.cpu().numpy())
        k = (self.fit_info_ or {}).get("num_classes", sizes.size)
        if sizes.size != k + 1 or sizes[k] == 0:  # no pooled map (a checkpoint from before it existed)
            return top
        own = np.zeros(max(k, int(top.max(initial=0)) + 1), dtype=bool)
        own[:k] = sizes[:k] > 0
        return np.where(own[top], top, k)
