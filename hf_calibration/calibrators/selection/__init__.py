"""Model selection: cross-validate calibrators on the calibration set (``compare_calibrators``), pick one
(``AutoCalibrator``), and compare two methods on the same samples (``CalibratorComparison.paired_bootstrap``)."""

from hf_calibration.calibrators.selection.auto import AutoCalibrator, CalibratorComparison, compare_calibrators

__all__ = ["AutoCalibrator", "CalibratorComparison", "compare_calibrators"]
