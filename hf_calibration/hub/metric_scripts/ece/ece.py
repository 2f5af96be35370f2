"""Expected Calibration Error (ECE) as an `evaluate` metric: the table's metric 'ece' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

ECE = metric_class("ece", __name__, reference_urls=["https://arxiv.org/abs/1706.04599"], class_name="ECE")
