"""Calibration of semantic segmenters: streamed per-pixel metrics and pixel-logit calibrators."""

from hf_calibration.segmentation.metrics import PixelCalibrationAccumulator, pixel_calibration_report

__all__ = ["PixelCalibrationAccumulator", "pixel_calibration_report"]
