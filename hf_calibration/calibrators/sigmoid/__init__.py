"""Calibrators of sigmoid heads (binary and multi-label): one map per label, logits in, logits out."""

from hf_calibration.calibrators.sigmoid.beta import BetaCalibration
from hf_calibration.calibrators.sigmoid.histogram import SigmoidHistogramBinning
from hf_calibration.calibrators.sigmoid.isotonic import SigmoidIsotonicRegression
from hf_calibration.calibrators.sigmoid.platt import PlattScaling
from hf_calibration.calibrators.sigmoid.temperature import SigmoidTemperatureScaling

__all__ = [
    "BetaCalibration",
    "PlattScaling",
    "SigmoidHistogramBinning",
    "SigmoidIsotonicRegression",
    "SigmoidTemperatureScaling",
]
