"""Independent references for the top-label calibrators, written from the papers' equations in numpy.

Shared by the histogram, isotonic and spline tests: the float64 softmax, the top-label adaptor's expected
output, Gupta & Ramdas's uniform-mass binning and Gupta et al.'s spline fit (with a different spline basis
than the package's).
"""

from __future__ import annotations

import numpy as np
from _calibrator_data import SHARED_LOGITS, overconfident, shared_files
from scipy.special import softmax

CAP = 1.0 - 1e-12


def splits(seed: int) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(name, val logits, val labels, test logits): synthetic data, then every shared real file (when present)."""
    z, y = overconfident(3000, 10, seed=seed)
    cases = [("synthetic", z[:2000], y[:2000], z[2000:])]
    for path in shared_files():
        d = np.load(SHARED_LOGITS / path.name)
        cases.append((path.stem, d["logits_val"], d["labels_val"], d["logits_test"]))
    return cases


def case_id(value) -> str:
    return value if isinstance(value, (str, int)) else ""


def top_label_view(logits: np.ndarray):
    """(probabilities, top index, confidence, floor) in float64."""
    p = softmax(logits.astype(np.float64), axis=1)
    top = logits.argmax(1)  # the logits' argmax (probabilities may tie where logits do not)
    rows = np.arange(len(p))
    conf = p[rows, top]
    rest = p.copy()
    rest[rows, top] = 0.0
    second = rest.max(1)
    floor = second / (rest.sum(1) + second)  # p_2 / (1 - p_1 + p_2), without forming 1 - p_1
    return p, top, conf, floor


def confidence_as_computed(logits: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The package's top-label confidences, after checking them against scipy's (``reference``) to 1e-15.

    Piecewise maps fitted on confidences turn last-bit differences of their input into larger ones where two
    knots are very close; comparing maps on the very same inputs isolates the fit from the softmax.
    """
    from hf_calibration.calibrators._machinery.toplabel import top_label

    ours = top_label(logits).confidence
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-15)
    return ours


def expected_top(new_confidence: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """The adaptor's top probability: the map's value, at most 1 - 1e-12, at least the tie floor."""
    return np.maximum(np.minimum(new_confidence, CAP), floor)


def uniform_mass_binning(confidence: np.ndarray, correct: np.ndarray, n_bins: int):
    """Gupta & Ramdas's HB_binary: upper edges = max of each np.array_split group of the sorted scores (last: inf);
    a score goes to the number of edges it exceeds; value = mean correctness of the bin."""
    groups = np.array_split(np.sort(confidence), n_bins)
    upper = np.array([g.max() for g in groups[:-1]] + [np.inf])

    def assign(x):
        return (x[:, None] > upper[None, :]).sum(1)

    index = assign(confidence)
    values = np.array([correct[index == b].mean() for b in range(n_bins)])
    return lambda x: values[assign(x)]


def natural_spline_lstsq(t: np.ndarray, y: np.ndarray, knots: np.ndarray):
    """Least-squares natural cubic spline in the truncated-power basis (Hastie, Tibshirani & Friedman, ESL
    Eq. 5.4-5.5); returns the fitted function's derivative."""
    K = knots.size

    def d(x, k, power, scale):
        # d_k(x) = ((x - xi_k)^3_+ - (x - xi_K)^3_+) / (xi_K - xi_k), and its derivative (power 2, scale 3)
        return (
            scale
            * (np.clip(x - knots[k], 0, None) ** power - np.clip(x - knots[-1], 0, None) ** power)
            / (knots[-1] - knots[k])
        )

    def basis(x, derivative=False):
        if derivative:
            cols = [np.zeros_like(x), np.ones_like(x)]
            cols += [d(x, k, 2, 3.0) - d(x, K - 2, 2, 3.0) for k in range(K - 2)]
        else:
            cols = [np.ones_like(x), x]
            cols += [d(x, k, 3, 1.0) - d(x, K - 2, 3, 1.0) for k in range(K - 2)]
        return np.stack(cols, axis=1)

    coef = np.linalg.lstsq(basis(t), y, rcond=None)[0]
    return lambda x: basis(x, derivative=True) @ coef


def spline_recalibration(confidence: np.ndarray, correct: np.ndarray, n_knots: int):
    """Gupta et al. 2021: sort, fractional ranks t_i = linspace(0, 1, N), fit the cumulative accuracy minus the
    cumulative confidence (each / N), recalibrated score s_i + g'(t_i), ties averaged, linear interpolation
    (constant beyond the ends), clipped to [0, 1]."""
    order = np.lexsort((correct, confidence))
    s, a = confidence[order], correct[order].astype(np.float64)
    n = s.size
    t = np.linspace(0.0, 1.0, n)
    slope = natural_spline_lstsq(t, (np.cumsum(a) - np.cumsum(s)) / n, np.linspace(0.0, 1.0, n_knots))
    recalibrated = s + slope(t)
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # runs of equal (sorted) scores
    xs = s[starts]
    ys = np.add.reduceat(recalibrated, starts) / np.diff(np.r_[starts, n])
    return lambda x: np.clip(np.interp(x, xs, ys), 0.0, 1.0)
