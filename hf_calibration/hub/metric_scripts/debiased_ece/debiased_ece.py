"""Debiased calibration error (Kumar, Liang & Ma 2019) as an `evaluate` metric: the table's metric 'debiased_ece' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

_DESCRIPTION = """
Debiased binned calibration error of Kumar, Liang & Ma (2019, "Verified Uncertainty Calibration"). The plug-in
binned estimate of the L2 calibration error is biased upwards (each bin's squared gap carries the variance of its
label mean); the debiased estimator subtracts that variance in every bin: sum_b w_b [(conf_b - acc_b)^2 -
acc_b (1 - acc_b) / (n_b - 1)], then the square root. With p=1 the L1 error (the usual ECE) is corrected under a
normal model of each bin's accuracy. Bins are equal-mass (15 by default), cut as the paper's code does; the value
equals `uncertainty-calibration`'s get_top_calibration_error(probs, labels, p, debias=True) (mode="top-label") and
get_calibration_error(probs, labels, p, debias=True, mode="marginal") (mode="marginal", the classwise form).
"""

_EXTRA_ARGS = """    p (`int`, defaults to 2): 2 for the L2 calibration error, 1 for the L1 error (ECE).
    mode (`str`, defaults to "top-label"): "top-label" or "marginal" (every class's probability against [y == k]).
    binning (`str`, defaults to "equal_mass"): "equal_mass", or "distinct" (one bin per distinct value, for the
        outputs of a binning calibrator).
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> metric = evaluate.load(hf_calibration.metric_path("debiased_ece"))
    >>> probs = [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.35, 0.65]]
    >>> results = metric.compute(predictions=probs, references=[0, 0, 1, 1], n_bins=2)
    >>> round(results["debiased_ece"], 4)
    0.2531
"""

_CITATION = """
@inproceedings{kumar2019verified,
  title={Verified Uncertainty Calibration},
  author={Kumar, Ananya and Liang, Percy and Ma, Tengyu},
  booktitle={Advances in Neural Information Processing Systems},
  year={2019}
}
"""

DebiasedECE = metric_class(
    "debiased_ece",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    extra_args=_EXTRA_ARGS,
    reference_urls=["https://arxiv.org/abs/1909.10155", "https://github.com/p-lambda/verified_calibration"],
    class_name="DebiasedECE",
)
