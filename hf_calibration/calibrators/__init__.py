"""Post-hoc calibrators, fitted on held-out logits, shared on the Hub, attached to models."""

from ..hub import load_calibrator
from ._base import Calibrator, NotFittedError
from ._registry import create_calibrator, list_calibrators, register_calibrator
from ._scaling import TemperatureCalibrator
from .attach import attached_calibrator
from .cts import ClassBasedTemperatureScaling
from .dirichlet import DirichletCalibration
from .ets import EnsembleTemperatureScaling
from .matrix import MatrixScaling
from .objectives import OBJECTIVES, brier, charbonnier_soft_ece, nll, soft_ece
from .pts import ParameterizedTemperatureScaling
from .smart import SMARTCalibrator, logit_margin
from .temperature import TemperatureScaling
from .vector import VectorScaling

__all__ = [
    "Calibrator",
    "ClassBasedTemperatureScaling",
    "DirichletCalibration",
    "EnsembleTemperatureScaling",
    "MatrixScaling",
    "NotFittedError",
    "OBJECTIVES",
    "ParameterizedTemperatureScaling",
    "SMARTCalibrator",
    "TemperatureCalibrator",
    "TemperatureScaling",
    "VectorScaling",
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
