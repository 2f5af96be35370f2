"""Pixel ECE as an `evaluate` metric: the package's function through the one script of hf_calibration.hub.dense_metric."""

from hf_calibration.hub.dense_metric import dense_metric_class

PIXELECE = dense_metric_class(
    "pixel_ece", __name__, reference_urls=["https://arxiv.org/abs/1706.04599"], class_name="PixelECE"
)
