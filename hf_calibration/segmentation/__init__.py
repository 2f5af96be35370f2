"""Calibration of semantic segmenters: streamed per-pixel metrics and pixel-logit calibrators."""

from hf_calibration.segmentation.calibrators import LocalTemperatureScaling, calibrate_pixels, pixel_rows
from hf_calibration.segmentation.metrics import PixelCalibrationAccumulator, pixel_calibration_report

__all__ = [
    "LocalTemperatureScaling",
    "PixelCalibrationAccumulator",
    "calibrate_pixels",
    "pixel_calibration_report",
    "pixel_rows",
]
