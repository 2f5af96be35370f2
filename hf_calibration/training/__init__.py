"""Training with the calibration losses: ``CalibrationTrainer`` (feature capture, loss state, Mixup, the MaC-Cal stage)
and the calibrator fitted on the eval split when training ends (``calibrate_on_eval``)."""

from hf_calibration.training.eval_calibration import EvalCalibration, fit_eval_calibration
from hf_calibration.training.trainer import LOSS_STATE_NAME, CalibrationLossCallback, CalibrationTrainer

__all__ = [
    "LOSS_STATE_NAME",
    "CalibrationLossCallback",
    "CalibrationTrainer",
    "EvalCalibration",
    "fit_eval_calibration",
]
