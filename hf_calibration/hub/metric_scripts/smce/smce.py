"""Exact smooth calibration error (smCE) as an `evaluate` metric: the table's metric 'smce' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

SmCE = metric_class("smce", __name__, reference_urls=["https://arxiv.org/abs/2211.16886"], class_name="SmCE")
