"""Post-hoc calibrators, fitted on held-out logits, shared on the Hub, attached to models."""

from hf_calibration.calibrators._machinery.base import (
    Calibrator,
    InsufficientMemoryError,
    NotFittedError,
    UncalibratedWarning,
    scores_fingerprint,
)
from hf_calibration.calibrators._machinery.fitting.held_out import HeldOutWorseWarning, held_out_checked
from hf_calibration.calibrators._machinery.registry import (
    create_calibrator,
    get_calibrator_class,
    list_calibrators,
    load_calibrator,
    register_calibrator,
)
from hf_calibration.calibrators._machinery.scaling import TemperatureCalibrator
from hf_calibration.calibrators.attach import attached_calibrator
from hf_calibration.calibrators.cts import ClassBasedTemperatureScaling
from hf_calibration.calibrators.dac import DensityAwareCalibrator
from hf_calibration.calibrators.dirichlet import DirichletCalibration
from hf_calibration.calibrators.ets import EnsembleTemperatureScaling
from hf_calibration.calibrators.histogram import HistogramBinning
from hf_calibration.calibrators.isotonic import IsotonicRegression, OneVsRestIsotonicRegression
from hf_calibration.calibrators.matrix import MatrixScaling
from hf_calibration.calibrators.pts import ParameterizedTemperatureScaling
from hf_calibration.calibrators.selection.auto import AutoCalibrator, CalibratorComparison, compare_calibrators
from hf_calibration.calibrators.sigmoid.beta import BetaCalibration
from hf_calibration.calibrators.sigmoid.histogram import SigmoidHistogramBinning
from hf_calibration.calibrators.sigmoid.isotonic import SigmoidIsotonicRegression
from hf_calibration.calibrators.sigmoid.platt import PlattScaling
from hf_calibration.calibrators.sigmoid.temperature import SigmoidTemperatureScaling
from hf_calibration.calibrators.smart import SMARTCalibrator
from hf_calibration.calibrators.sms import StructuredMatrixScaling
from hf_calibration.calibrators.spline import SplineCalibration
from hf_calibration.calibrators.svs import StructuredVectorScaling
from hf_calibration.calibrators.temperature import TemperatureScaling
from hf_calibration.calibrators.vector import VectorScaling

__all__ = [
    "AutoCalibrator",
    "BetaCalibration",
    "Calibrator",
    "CalibratorComparison",
    "ClassBasedTemperatureScaling",
    "DensityAwareCalibrator",
    "DirichletCalibration",
    "EnsembleTemperatureScaling",
    "HeldOutWorseWarning",
    "HistogramBinning",
    "IsotonicRegression",
    "MatrixScaling",
    "InsufficientMemoryError",
    "NotFittedError",
    "OneVsRestIsotonicRegression",
    "ParameterizedTemperatureScaling",
    "PlattScaling",
    "SMARTCalibrator",
    "SigmoidHistogramBinning",
    "SigmoidIsotonicRegression",
    "SigmoidTemperatureScaling",
    "SplineCalibration",
    "StructuredMatrixScaling",
    "StructuredVectorScaling",
    "TemperatureScaling",
    "UncalibratedWarning",
    "VectorScaling",
    "attached_calibrator",
    "compare_calibrators",
    "create_calibrator",
    "list_calibrators",
    "load_calibrator",
    "register_calibrator",
    "TemperatureCalibrator",
    "get_calibrator_class",
    "held_out_checked",
    "scores_fingerprint",
]
