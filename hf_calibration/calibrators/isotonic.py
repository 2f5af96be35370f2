"""Isotonic regression (Zadrozny & Elkan 2002, "Transforming classifier scores into accurate multiclass
probability estimates", KDD): a non-decreasing map of a probability, fitted by pool-adjacent-violators.

Two ways to use it on K classes:

* ``IsotonicRegression`` (top-label): one map of the top-label confidence to the fit set's correctness, the
  other classes rescaled in proportion (``_machinery/toplabel.py``). Keeps the argmax.
* ``OneVsRestIsotonicRegression`` (Zadrozny & Elkan's multiclass reduction): one map per class ``k`` of
  ``p_k`` to ``[y == k]``, then each row normalised to sum 1. May change the argmax (each class has its own
  map), so ``preserves_argmax = False``.

The fits are scikit-learn's ``IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip")`` (ties in the input
averaged, the map linear between its thresholds and constant beyond them); the maps are stored as those
thresholds and evaluated in torch. The PAV solution minimises the squared error and, equally, the Bernoulli
NLL among non-decreasing maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.special import softmax

from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators._machinery.piecewise import PiecewiseCalibrator, PiecewiseMaps
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.toplabel import TopLabelCalibrator

CITATION = (
    "B. Zadrozny, C. Elkan, *Transforming classifier scores into accurate multiclass probability estimates*, KDD 2002"
)
MIN_PROBABILITY = 1e-15  # one-vs-rest: a class's calibrated probability before normalising is at least this


def fit_isotonic(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds ``(x_t, y_t)`` of scikit-learn's isotonic fit of ``y`` on ``x`` (y in [0, 1], clipped ends)."""
    from sklearn.isotonic import IsotonicRegression as SklearnIsotonic

    iso = SklearnIsotonic(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(x, y.astype(np.float64))
    return np.asarray(iso.X_thresholds_, np.float64), np.asarray(iso.y_thresholds_, np.float64)


@register_calibrator
class IsotonicRegression(
    TopLabelCalibrator,
    tags=["isotonic-regression", "top-label"],
    paper_url="https://doi.org/10.1145/775047.775151",
):
    """Top-label isotonic regression: a non-decreasing map of the top confidence to the fit set's accuracy.

    Keeps the argmax (top-label adaptor). Deterministic, no hyper-parameters. Needs at least
    ``min_samples = 10`` labelled samples.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import IsotonicRegression
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (1000,), generator=g)
        >>> logits = 3 * torch.randn(1000, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> iso = IsotonicRegression().fit(logits, labels, progress_bar=False)
        >>> bool(torch.equal(iso(logits).argmax(1), logits.argmax(1)))
        True
    """

    kind = "isotonic"
    smooth = False
    min_samples = 10
    default_objective = "isotonic_pav"
    criterion = "the non-decreasing least-squares fit of correctness on the top-label confidence (PAV)"
    paper_citation = CITATION

    def __init__(self):
        super().__init__()
        self.maps = PiecewiseMaps()

    def _fit_confidence(
        self, confidence: np.ndarray, correct: np.ndarray, top: np.ndarray, num_classes: int
    ) -> dict[str, Any]:
        knots, values = fit_isotonic(confidence, correct)
        self.maps.set([(knots, values)])
        return {"thresholds": int(knots.size)}

    def _map_confidence(self, confidence: np.ndarray, top: np.ndarray) -> np.ndarray:
        return self.maps.evaluate(confidence, step=False)

    def _map_confidence_graph(self, confidence, top):
        return _graph.linear_interp(confidence, torch.zeros_like(top), self.maps.graph_tables())


@register_calibrator
class OneVsRestIsotonicRegression(
    PiecewiseCalibrator,
    tags=["isotonic-regression", "one-vs-rest"],
    paper_url="https://doi.org/10.1145/775047.775151",
):
    """One-vs-rest isotonic regression: one non-decreasing map per class, rows normalised to sum 1.

    ``q_k = max(iso_k(p_k), 1e-15)``, calibrated probabilities ``q_k / sum_j q_j`` (the floor keeps every
    log-probability finite and a row whose maps all return 0 uniform; a sample whose true class maps to 0 has
    its NLL set by that floor, ~34.5 nats). May change the predicted class
    (``preserves_argmax = False``). Deterministic. Needs at least ``min_samples = 10`` labelled samples.
    """

    kind = "isotonic_ovr"
    smooth = False
    min_samples = 10
    default_objective = "isotonic_pav"
    criterion = "one non-decreasing least-squares fit of [y = k] on p_k per class k (PAV)"
    paper_citation = CITATION
    preserves_argmax = False
    per_class_maps = True

    def __init__(self):
        super().__init__()
        self.maps = PiecewiseMaps()

    def _fit(
        self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool
    ) -> dict[str, Any]:
        probs = softmax(logits.astype(np.float64), axis=1)
        self.maps.set([fit_isotonic(probs[:, k], labels == k) for k in range(logits.shape[1])])
        return {"thresholds": int(self.maps.knots.numel())}

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        # numpy on the CPU, like the top-label maps (_machinery/piecewise.py)
        probs = softmax(z.detach().cpu().numpy().astype(np.float64), axis=1)
        calibrated = np.empty_like(probs)
        for k in range(probs.shape[1]):
            calibrated[:, k] = self.maps.evaluate_group(probs[:, k], k, step=False)
        calibrated = np.maximum(calibrated, MIN_PROBABILITY)
        out = np.log(calibrated / calibrated.sum(axis=1, keepdims=True))
        return torch.from_numpy(out).to(device=z.device, dtype=z.dtype)

    def _calibrate_graph(self, z: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(z.double(), dim=1)
        classes = torch.arange(z.shape[1], device=z.device).expand_as(probs)
        calibrated = torch.maximum(
            _graph.linear_interp(probs, classes, self.maps.graph_tables()), _graph.constant(probs, MIN_PROBABILITY)
        )
        return torch.log(calibrated / calibrated.sum(dim=1, keepdim=True)).to(z.dtype)

    def _card_description(self) -> str:
        return "It maps each class's probability through its own isotonic (non-decreasing) map and normalises the row."
