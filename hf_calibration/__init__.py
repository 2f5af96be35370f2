"""hf_calibration: calibration metrics, calibrated training losses and post-hoc calibrators for Hugging Face vision classifiers.

Public names are imported on first use, so ``import hf_calibration`` (and the command line)
does not pay for transformers' Trainer until a name that needs it is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import _post_import

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "metrics": ["metrics"],
    "metric_scripts": ["list_metric_scripts", "metric_path"],
    "losses": [
        "LOSS_MAPPING",
        "CalibrationLoss",
        "CrossEntropyLoss",
        "FLSD53Loss",
        "FeDLaSLoss",
        "FocalLoss",
        "LabelSmoothingLoss",
        "MbLSLoss",
        "get_loss",
    ],
    "calibrators": [
        "AutoCalibrator",
        "ClassBasedTemperatureScaling",
        "DirichletCalibration",
        "EnsembleTemperatureScaling",
        "HistogramBinning",
        "IsotonicRegression",
        "MatrixScaling",
        "OneVsRestIsotonicRegression",
        "ParameterizedTemperatureScaling",
        "SMARTCalibrator",
        "SplineCalibration",
        "StructuredMatrixScaling",
        "StructuredVectorScaling",
        "TemperatureScaling",
        "UncalibratedWarning",
        "VectorScaling",
        "compare_calibrators",
        "create_calibrator",
        "list_calibrators",
        "load_calibrator",
    ],
    "trainer": ["CalibrationTrainer"],
    "maccal": ["MaCCalConfig", "MaCCalResult", "MaskedBottleneckHead", "load_maccal_model", "maccal_stage"],
    "conformal": ["ConformalPredictor"],
    "inference": ["predict_logits"],
    "calibrated_model": ["load_calibrated_model", "pipeline"],
    "serving": ["CalibratedClassifier", "export_onnx", "push_endpoint_handler", "write_endpoint_handler"],
    "metrics.accumulator": ["CalibrationAccumulator"],
}
_NAME_TO_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", *_NAME_TO_MODULE]

# a MaC-Cal checkpoint's config names its head: register that model type with transformers' AutoConfig when
# transformers loads it, so `AutoModelForImageClassification.from_pretrained` / `pipeline` rebuild the head
_post_import.call_after_import("transformers.models.auto.configuration_auto", "hf_calibration.maccal.persistence:register_auto_config")


def __getattr__(name: str):
    module = _NAME_TO_MODULE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    submodule = importlib.import_module(f".{module}", __name__)
    value = submodule if name == module else getattr(submodule, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from . import metrics
    from .calibrators import (
        AutoCalibrator,
        ClassBasedTemperatureScaling,
        DirichletCalibration,
        EnsembleTemperatureScaling,
        HistogramBinning,
        IsotonicRegression,
        MatrixScaling,
        OneVsRestIsotonicRegression,
        ParameterizedTemperatureScaling,
        SMARTCalibrator,
        SplineCalibration,
        StructuredMatrixScaling,
        StructuredVectorScaling,
        TemperatureScaling,
        UncalibratedWarning,
        VectorScaling,
        compare_calibrators,
        create_calibrator,
        list_calibrators,
        load_calibrator,
    )
    from .losses import (
        LOSS_MAPPING,
        CalibrationLoss,
        CrossEntropyLoss,
        FeDLaSLoss,
        FLSD53Loss,
        FocalLoss,
        LabelSmoothingLoss,
        MbLSLoss,
        get_loss,
    )
    from .maccal import MaCCalConfig, MaCCalResult, MaskedBottleneckHead, load_maccal_model, maccal_stage
    from .calibrated_model import load_calibrated_model, pipeline
    from .serving import CalibratedClassifier, export_onnx, push_endpoint_handler, write_endpoint_handler
    from .conformal import ConformalPredictor
    from .inference import predict_logits
    from .metric_scripts import list_metric_scripts, metric_path
    from .metrics.accumulator import CalibrationAccumulator
    from .trainer import CalibrationTrainer
