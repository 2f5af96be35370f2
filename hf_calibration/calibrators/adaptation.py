"""Label-free adaptation of a fitted calibrator to unlabeled logits from the deployment data (ATC, then a temperature).

A calibrator fitted on held-out data from the training distribution is over-confident on shifted data: the model's
accuracy falls, its confidence much less. Average Thresholded Confidence (ATC; Garg, Balakrishnan, Lipton, Neyshabur
and Sedghi, "Leveraging Unlabeled Data to Predict Out-of-Distribution Performance", ICLR 2022) estimates the accuracy
on the target data without labels: on labelled source data, choose the threshold ``t`` of the (calibrated)
confidence such that the share of samples above it equals the source accuracy (their eq. 1, ATC-MC); on the target,
the share above ``t`` estimates the target accuracy. :meth:`~hf_calibration.calibrators.Calibrator.adapt` then divides
the calibrated logits by the one temperature ``T_a`` whose mean confidence on the target equals that estimate (the
adaptation temperature of this module; its sign keeps every argmax).

When it helps and when it cannot: ATC assumes the shift leaves the relation between confidence ranks and correctness
as on the source (covariate shift, such as corruptions). Under label shift (class frequencies change, images do not)
the estimate is biased, and a single temperature fixes the mean confidence only, not each bin; on data the model
cannot classify at all (accuracy near chance) the estimate may hold while every single confidence stays meaningless.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "ATC_REFERENCE",
    "MIN_SAMPLES",
    "atc_threshold",
    "estimated_accuracy",
    "temperature_at_bound",
    "temperature_for_mean_confidence",
]

ATC_REFERENCE = (
    "S. Garg, S. Balakrishnan, Z. C. Lipton, B. Neyshabur, H. Sedghi, Leveraging Unlabeled Data to Predict "
    "Out-of-Distribution Performance, ICLR 2022 (ATC-MC)"
)
_LOG_T_RANGE = (math.log(1e-3), math.log(1e3))
# the fewest unlabelled rows adapt() takes: as TemperatureScaling's fit (one temperature); ATC's estimate is a share of
# the rows, so on 1 or 2 rows it can only be 0, 0.5 or 1, and the temperature that matches 0 or 1 lies at a bound
MIN_SAMPLES = 10


def _confidence(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), dim=1).amax(dim=1).numpy()


def atc_threshold(confidence: np.ndarray, correct: np.ndarray) -> float:
    """The threshold ``t`` with ``mean(confidence > t) = mean(correct)`` on labelled source data (ATC eq. 1): the
    ``(1 - accuracy)`` quantile of the source confidences, between two of them."""
    confidence = np.sort(np.asarray(confidence, dtype=np.float64))
    n = confidence.shape[0]
    below = int(round((1.0 - float(np.mean(correct))) * n))  # samples at or below t
    if below <= 0:
        return float(np.nextafter(confidence[0], -np.inf))
    if below >= n:
        return float(confidence[-1])
    return float((confidence[below - 1] + confidence[below]) / 2)


def estimated_accuracy(confidence: np.ndarray, threshold: float) -> float:
    """ATC's estimate of the target accuracy: the share of target confidences above the source threshold."""
    return float(np.mean(np.asarray(confidence) > threshold))


def temperature_for_mean_confidence(logits: torch.Tensor, target: float) -> float:
    """The temperature ``T`` whose mean top-label confidence of ``softmax(logits / T)`` is ``target`` (bisection on
    ``log T``: the mean confidence falls as ``T`` grows, from the top confidence's share at ``T -> 0`` to ``1 / K``)."""
    k = logits.shape[1]
    target = min(max(float(target), 1.0 / k + 1e-9), 1.0 - 1e-9)
    z = logits.double()
    lo, hi = _LOG_T_RANGE
    for _ in range(100):
        mid = (lo + hi) / 2
        if float(_confidence(z / math.exp(mid)).mean()) > target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def temperature_at_bound(temperature: float) -> bool:
    """Whether a temperature of :func:`temperature_for_mean_confidence` ended at its search range's end (1e-3 or 1e3):
    no temperature in the range gives the target mean confidence (an estimate of 0 or 1, or logits too flat or too
    peaked to reach it), so the confidences it gives are pushed to uniform or one-hot."""
    log_t = math.log(temperature)
    return not (_LOG_T_RANGE[0] + 1e-6 < log_t < _LOG_T_RANGE[1] - 1e-6)
