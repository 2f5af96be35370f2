"""hf_calibration: calibration metrics, calibrated training losses and post-hoc calibrators for Hugging Face classifiers.

Public names are imported on first use, so ``import hf_calibration`` (and the command line)
does not pay for transformers' Trainer until a name that needs it is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hf_calibration._core import moved as _moved
from hf_calibration._core import post_import as _post_import
from hf_calibration._core.version import __version__

# public name -> submodule that defines it
_EXPORTS = {
    "metrics": ["metrics"],
    "hub.metric_scripts": ["list_metric_scripts", "metric_path"],
    "losses": [
        "LOSS_MAPPING",
        "AsymmetricLoss",
        "BinaryCrossEntropyLoss",
        "BinaryLabelSmoothingLoss",
        "CalibrationLoss",
        "CrossEntropyLoss",
        "FLSD53Loss",
        "FeDLaSLoss",
        "FocalLoss",
        "LabelSmoothingLoss",
        "MbLSLoss",
        "SigmoidFocalLoss",
        "get_loss",
    ],
    "calibrators": [
        "AutoCalibrator",
        "BetaCalibration",
        "ClassBasedTemperatureScaling",
        "DirichletCalibration",
        "EnsembleTemperatureScaling",
        "HeldOutWorseWarning",
        "HistogramBinning",
        "IsotonicRegression",
        "MatrixScaling",
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
    ],
    "training": ["CalibrationCallback", "CalibrationTrainer"],
    "maccal": ["MaCCalConfig", "MaCCalResult", "MaskedBottleneckHead", "load_maccal_model", "maccal_stage"],
    "conformal": ["ConformalPredictor"],
    "io": ["predict_logits"],
    "_core.tasks": ["resolve_task"],
    "serving": [
        "CalibratedClassifier",
        "export_onnx",
        "load_calibrated_model",
        "pipeline",
        "push_endpoint_handler",
        "write_endpoint_handler",
    ],
    "metrics.accumulator": ["CalibrationAccumulator"],
}
_NAME_TO_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", *_NAME_TO_MODULE]

# a MaC-Cal checkpoint's config names its head: register that model type with transformers' AutoConfig when
# transformers loads it, so `AutoModelForImageClassification.from_pretrained` / `pipeline` rebuild the head
_post_import.call_after_import(
    "transformers.models.auto.configuration_auto", "hf_calibration.maccal.persistence:register_auto_config"
)


# modules imported by the paths of earlier releases (``hf_calibration.trainer``, ...) still load, with a FutureWarning
_moved.install()


def __getattr__(name: str):
    module = _NAME_TO_MODULE.get(name)
    if module is None and f"{__name__}.{name}" in _moved.MOVED_MODULES:  # ``from hf_calibration import trainer``
        return importlib.import_module(f"{__name__}.{name}")
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    submodule = importlib.import_module(f".{module}", __name__)
    value = submodule if name == module else getattr(submodule, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from hf_calibration import metrics
    from hf_calibration._core.tasks import resolve_task
    from hf_calibration.calibrators import (
        AutoCalibrator,
        BetaCalibration,
        ClassBasedTemperatureScaling,
        DirichletCalibration,
        EnsembleTemperatureScaling,
        HeldOutWorseWarning,
        HistogramBinning,
        IsotonicRegression,
        MatrixScaling,
        OneVsRestIsotonicRegression,
        ParameterizedTemperatureScaling,
        PlattScaling,
        SigmoidHistogramBinning,
        SigmoidIsotonicRegression,
        SigmoidTemperatureScaling,
        SMARTCalibrator,
        SplineCalibration,
        StructuredMatrixScaling,
        StructuredVectorScaling,
        TemperatureScaling,
        UncalibratedWarning,
        VectorScaling,
        attached_calibrator,
        compare_calibrators,
        create_calibrator,
        list_calibrators,
        load_calibrator,
    )
    from hf_calibration.conformal import ConformalPredictor
    from hf_calibration.hub.metric_scripts import list_metric_scripts, metric_path
    from hf_calibration.io.inference import predict_logits
    from hf_calibration.losses import (
        LOSS_MAPPING,
        AsymmetricLoss,
        BinaryCrossEntropyLoss,
        BinaryLabelSmoothingLoss,
        CalibrationLoss,
        CrossEntropyLoss,
        FeDLaSLoss,
        FLSD53Loss,
        FocalLoss,
        LabelSmoothingLoss,
        MbLSLoss,
        SigmoidFocalLoss,
        get_loss,
    )
    from hf_calibration.maccal import MaCCalConfig, MaCCalResult, MaskedBottleneckHead, load_maccal_model, maccal_stage
    from hf_calibration.metrics.accumulator import CalibrationAccumulator
    from hf_calibration.serving import CalibratedClassifier, export_onnx, push_endpoint_handler, write_endpoint_handler
    from hf_calibration.serving.calibrated_model import load_calibrated_model, pipeline
    from hf_calibration.training import CalibrationCallback, CalibrationTrainer
