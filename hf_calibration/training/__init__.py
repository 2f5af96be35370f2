"""Training with the calibration losses: ``CalibrationTrainer`` (feature capture, loss state, Mixup, the MaC-Cal stage),
and ``CalibrationCallback``: the calibrator (and conformal sets) fitted on the eval split when any ``Trainer``'s training
ends (``CalibrationTrainer(calibrate_on_eval=...)`` adds one)."""

from hf_calibration.training.callback import CalibrationCallback
from hf_calibration.training.eval_calibration import EvalCalibration, fit_eval_calibration
from hf_calibration.training.trainer import CalibrationLossCallback, CalibrationTrainer

__all__ = [
    "CalibrationCallback",
    "CalibrationLossCallback",
    "CalibrationTrainer",
    "EvalCalibration",
    "fit_eval_calibration",
]
