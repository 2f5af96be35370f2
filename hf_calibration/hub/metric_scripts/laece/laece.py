"""LaECE as an `evaluate` metric: the package's function through the one script of hf_calibration.hub.dense_metric."""

from hf_calibration.hub.dense_metric import dense_metric_class

LAECE = dense_metric_class("laece", __name__, reference_urls=["https://arxiv.org/abs/2307.00934"], class_name="LaECE")
