"""Spline calibration (Gupta, Rahimi, Ajanthan, Mensink, Sminchisescu & Hartley 2021, "Calibration of neural
networks using splines", ICLR): a top-label map read off a smooth fit of the cumulative calibration gap.

Sort the fit set's top-label confidences ``s_1 <= ... <= s_N`` (correctness ``a_i``) and put them at fractional
ranks ``t_i = (i - 1) / (N - 1)``. The cumulative accuracy and confidence (Sec. 3, the curves whose largest gap
is the KS calibration error) are

    A(t_i) = (1/N) sum_{j <= i} a_j,        S(t_i) = (1/N) sum_{j <= i} s_j.

A natural cubic spline ``g`` with ``knots`` equally spaced knots on [0, 1] (6 in the paper) is fitted by least
squares to ``A - S``; since ``dA/dt`` is the accuracy and ``dS/dt`` the confidence at rank ``t``, the
recalibrated confidence of ``s_i`` is ``s_i + g'(t_i)`` (as in the authors' released code, which fits the gap
rather than ``A`` itself). New confidences are interpolated linearly between the fit set's (constant beyond
them) and clipped to [0, 1]. Confidences that tie in the fit set share the mean of their values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration._core.checks import check_int
from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators._machinery.piecewise import PiecewiseMaps, clip_linear_map
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.toplabel import TopLabelCalibrator


def ks_spline_map(confidence: np.ndarray, correct: np.ndarray, knots: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sorted unique confidences, recalibrated confidences)`` of the spline fit (module docstring)."""
    from scipy.interpolate import CubicSpline

    order = np.lexsort((correct, confidence))  # ties ordered by correctness: independent of the input order
    s, a = confidence[order], correct[order].astype(np.float64)
    n = s.size
    t = np.linspace(0.0, 1.0, n)
    gap = (np.cumsum(a) - np.cumsum(s)) / n
    basis = CubicSpline(np.linspace(0.0, 1.0, knots), np.eye(knots), bc_type="natural")  # knot values -> spline
    coef = np.linalg.lstsq(basis(t), gap, rcond=None)[0]
    recalibrated = s + basis.derivative()(t) @ coef
    unique, inverse = np.unique(s, return_inverse=True)
    return unique, np.bincount(inverse, weights=recalibrated) / np.bincount(inverse)


@register_calibrator
class SplineCalibration(
    TopLabelCalibrator,
    tags=["spline", "top-label"],
    paper_url="https://arxiv.org/abs/2006.12800",
):
    """Spline calibration: the top confidence recalibrated from a spline fit of the cumulative KS curve.

    Keeps the argmax (top-label adaptor). Deterministic. Needs at least ``min_samples = 10`` labelled samples
    (and at least ``knots``).

    Args:
        knots: number of equally spaced knots of the natural cubic spline (6, the paper's).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import SplineCalibration
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (1000,), generator=g)
        >>> logits = 3 * torch.randn(1000, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> spline = SplineCalibration().fit(logits, labels, progress_bar=False)
        >>> bool(torch.equal(spline(logits).argmax(1), logits.argmax(1)))
        True
    """

    kind = "spline"
    min_samples = 10
    default_objective = "ks_spline"
    criterion = "a least-squares natural cubic spline of the cumulative accuracy-minus-confidence curve"
    paper_citation = (
        "K. Gupta, A. Rahimi, T. Ajanthan, T. Mensink, C. Sminchisescu, R. Hartley, *Calibration of Neural "
        "Networks using Splines*, ICLR 2021"
    )

    def __init__(self, knots: int = 6):
        super().__init__()
        self.knots = check_int(knots, "knots", minimum=2)
        self.maps = PiecewiseMaps()

    def _fit_confidence(
        self, confidence: np.ndarray, correct: np.ndarray, top: np.ndarray, num_classes: int
    ) -> dict[str, Any]:
        if confidence.size < self.knots:
            raise ValueError(
                f"Expected at least `knots` = {self.knots} labelled samples to fit the spline, but got {confidence.size}."
            )
        # stored as applied (clipped to [0, 1], a knot where it reaches a bound): every stored value is a probability
        self.maps.set([clip_linear_map(*ks_spline_map(confidence, correct, self.knots))])
        return {"points": int(self.maps.knots.numel())}

    def _map_confidence(self, confidence: np.ndarray, top: np.ndarray) -> np.ndarray:
        return np.clip(self.maps.evaluate(confidence, step=False), 0.0, 1.0)

    def _map_confidence_graph(self, confidence, top):
        return _graph.linear_interp(confidence, torch.zeros_like(top), self.maps.graph_tables()).clamp(0.0, 1.0)
