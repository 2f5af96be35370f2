"""D-ECE as an `evaluate` metric: the package's function through the one script of hf_calibration.hub.dense_metric."""

from hf_calibration.hub.dense_metric import dense_metric_class

DECE = dense_metric_class("d_ece", __name__, reference_urls=["https://arxiv.org/abs/2004.13546"], class_name="DECE")
