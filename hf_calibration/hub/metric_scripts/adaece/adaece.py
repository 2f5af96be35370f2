"""Adaptive ECE (equal-count bins) as an `evaluate` metric: the table's metric 'adaece' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

AdaECE = metric_class("adaece", __name__, reference_urls=["https://arxiv.org/abs/2002.09437"], class_name="AdaECE")
