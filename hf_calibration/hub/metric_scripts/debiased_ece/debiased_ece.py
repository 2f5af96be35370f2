"""Debiased calibration error (Kumar, Liang & Ma 2019) as an `evaluate` metric: the table's metric 'debiased_ece' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

_EXTRA_ARGS = """    p (`int`, defaults to 2): 2 for the L2 calibration error, 1 for the L1 error (ECE).
    mode (`str`, defaults to "top-label"): "top-label" or "marginal" (every class's probability against [y == k]).
    binning (`str`, defaults to "equal_mass"): "equal_mass", or "distinct" (one bin per distinct value, for the
        outputs of a binning calibrator).
"""

DebiasedECE = metric_class(
    "debiased_ece",
    __name__,
    extra_args=_EXTRA_ARGS,
    reference_urls=["https://arxiv.org/abs/1909.10155", "https://github.com/p-lambda/verified_calibration"],
    class_name="DebiasedECE",
)
