"""hf_calibration: calibration metrics, calibrated training losses and post-hoc calibrators for Hugging Face classifiers.

The top level holds what a first session uses: the metric functions, the calibrator registry and ``AutoCalibrator``,
training (``CalibrationTrainer``, ``CalibrationCallback``, ``FeDLaSLoss``), ``ConformalPredictor`` and serving
(``load_calibrated_model``, ``pipeline``). Everything else is reached through its subpackage
(``hf_calibration.calibrators.TemperatureScaling``, ``hf_calibration.losses.FocalLoss``, ``hf_calibration.io``, ...).
Names are imported on first use, so ``import hf_calibration`` (and the command line) does not pay for transformers'
Trainer until a name that needs it is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hf_calibration._core import post_import as _post_import
from hf_calibration._core.version import __version__

# public name -> submodule that defines it
_EXPORTS = {
    "metrics": [
        "metrics",
        "adaece",
        "brier",
        "calibration_report",
        "classwise_ece",
        "ece",
        "mce",
        "nll",
        "reliability_diagram",
        "smce",
        "smece",
    ],
    "hub.metric_scripts": ["metric_path"],
    "losses": ["FeDLaSLoss"],
    "calibrators": ["AutoCalibrator", "create_calibrator", "list_calibrators", "load_calibrator"],
    "training": ["CalibrationCallback", "CalibrationTrainer"],
    "conformal": ["ConformalPredictor"],
    "serving": ["load_calibrated_model", "pipeline"],
}
_NAME_TO_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["__version__", *_NAME_TO_MODULE]

# a MaC-Cal checkpoint's config names its head: register that model type with transformers' AutoConfig when
# transformers loads it, so `AutoModelForImageClassification.from_pretrained` / `pipeline` rebuild the head
_post_import.call_after_import(
    "transformers.models.auto.configuration_auto", "hf_calibration.maccal.persistence:register_auto_config"
)


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
    from hf_calibration import metrics
    from hf_calibration.calibrators import AutoCalibrator, create_calibrator, list_calibrators, load_calibrator
    from hf_calibration.conformal import ConformalPredictor
    from hf_calibration.hub.metric_scripts import metric_path
    from hf_calibration.losses import FeDLaSLoss
    from hf_calibration.metrics import (
        adaece,
        brier,
        calibration_report,
        classwise_ece,
        ece,
        mce,
        nll,
        reliability_diagram,
        smce,
        smece,
    )
    from hf_calibration.serving import load_calibrated_model, pipeline
    from hf_calibration.training import CalibrationCallback, CalibrationTrainer
