"""Post-hoc calibrators, fitted on held-out logits, shared on the Hub, attached to models."""

from ..hub import load_calibrator
from ._base import Calibrator, NotFittedError
from ._registry import create_calibrator, list_calibrators, register_calibrator
from ._scaling import TemperatureCalibrator
from .attach import attached_calibrator
from .objectives import OBJECTIVES, brier, charbonnier_soft_ece, nll, soft_ece
from .smart import SMARTCalibrator, logit_margin
from .temperature import TemperatureScaling

__all__ = [
    "Calibrator",
    "NotFittedError",
    "OBJECTIVES",
    "SMARTCalibrator",
    "TemperatureCalibrator",
    "TemperatureScaling",
    "attached_calibrator",
    "brier",
    "charbonnier_soft_ece",
    "create_calibrator",
    "list_calibrators",
    "load_calibrator",
    "logit_margin",
    "nll",
    "register_calibrator",
    "soft_ece",
]
