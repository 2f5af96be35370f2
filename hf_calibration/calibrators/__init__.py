"""Post-hoc calibrators, fitted on held-out logits, shared on the Hub, attached to models."""

from ..hub import load_calibrator
from ._base import Calibrator, InsufficientMemoryError, NotFittedError, UncalibratedWarning
from ._held_out import HeldOutWorseWarning
from ._registry import create_calibrator, list_calibrators, register_calibrator
from ._scaling import TemperatureCalibrator
from ._sigmoid import SigmoidCalibrator
from .attach import attached_calibrator
from .beta import BetaCalibration
from .cts import ClassBasedTemperatureScaling
from .dirichlet import DirichletCalibration
from .ets import EnsembleTemperatureScaling
from .histogram import HistogramBinning
from .isotonic import IsotonicRegression, OneVsRestIsotonicRegression
from .matrix import MatrixScaling
from .objectives import OBJECTIVES, brier, charbonnier_soft_ece, nll, soft_ece
from .platt import PlattScaling
from .pts import ParameterizedTemperatureScaling
from .selection import AutoCalibrator, CalibratorComparison, compare_calibrators
from .smart import SMARTCalibrator, logit_margin
from .sigmoid_histogram import SigmoidHistogramBinning
from .sigmoid_isotonic import SigmoidIsotonicRegression
from .sigmoid_temperature import SigmoidTemperatureScaling
from .sms import StructuredMatrixScaling
from .spline import SplineCalibration
from .svs import StructuredVectorScaling
from .temperature import TemperatureScaling
from .vector import VectorScaling

__all__ = [
    "AutoCalibrator",
    "BetaCalibration",
    "Calibrator",
    "CalibratorComparison",
    "ClassBasedTemperatureScaling",
    "DirichletCalibration",
    "EnsembleTemperatureScaling",
    "HeldOutWorseWarning",
    "HistogramBinning",
    "IsotonicRegression",
    "MatrixScaling",
    "InsufficientMemoryError",
    "NotFittedError",
    "OBJECTIVES",
    "OneVsRestIsotonicRegression",
    "ParameterizedTemperatureScaling",
    "PlattScaling",
    "SMARTCalibrator",
    "SigmoidCalibrator",
    "SigmoidHistogramBinning",
    "SigmoidIsotonicRegression",
    "SigmoidTemperatureScaling",
    "SplineCalibration",
    "StructuredMatrixScaling",
    "StructuredVectorScaling",
    "TemperatureCalibrator",
    "TemperatureScaling",
    "UncalibratedWarning",
    "VectorScaling",
    "attached_calibrator",
    "brier",
    "charbonnier_soft_ece",
    "compare_calibrators",
    "create_calibrator",
    "list_calibrators",
    "load_calibrator",
    "logit_margin",
    "nll",
    "register_calibrator",
    "soft_ece",
]
