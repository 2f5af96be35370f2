"""Every calibration metric at once as an `evaluate` metric: calibration_report through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

Calibration = metric_class(
    "calibration",
    __name__,
    reference_urls=["https://arxiv.org/abs/1706.04599", "https://arxiv.org/abs/2211.16886"],
    class_name="Calibration",
)
