"""Debiased calibration error (Kumar, Liang & Ma 2019) as an `evaluate` metric: a thin wrapper over hf_calibration.metrics.debiased_ece."""

import datasets
import evaluate
import numpy as np

from hf_calibration._core.inputs import whole_labels  # labels travel as floats: 1.7 or 0.9 is refused, never truncated
from hf_calibration.metrics import debiased_ece
from hf_calibration.metrics.bootstrap import flat_intervals

_DESCRIPTION = """
Debiased binned calibration error of Kumar, Liang & Ma (2019, "Verified Uncertainty Calibration"). The plug-in
binned estimate of the L2 calibration error is biased upwards (each bin's squared gap carries the variance of its
label mean); the debiased estimator subtracts that variance in every bin: sum_b w_b [(conf_b - acc_b)^2 -
acc_b (1 - acc_b) / (n_b - 1)], then the square root. With p=1 the L1 error (the usual ECE) is corrected under a
normal model of each bin's accuracy. Bins are equal-mass (15 by default), cut as the paper's code does; the value
equals `uncertainty-calibration`'s get_top_calibration_error(probs, labels, p, debias=True) (mode="top-label") and
get_calibration_error(probs, labels, p, debias=True, mode="marginal") (mode="marginal", the classwise form).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one logit or probability vector per example, shape (N, K).
    references (`list` of `int`): the true class of each example, shape (N,); -100 is ignored.
    n_bins (`int`, defaults to 15): number of equal-mass bins (at most N are used).
    p (`int`, defaults to 2): 2 for the L2 calibration error, 1 for the L1 error (ECE).
    mode (`str`, defaults to "top-label"): "top-label" or "marginal" (every class's probability against [y == k]).
    binning (`str`, defaults to "equal_mass"): "equal_mass", or "distinct" (one bin per distinct value, for the
        outputs of a binning calibrator).
    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities (every value in [0, 1], rows
        summing to 1 within 1e-2); `True` / `False` say so explicitly.
    ci (`float` or `None`, defaults to `None`): a level such as 0.95 adds a bootstrap interval
        (debiased_ece_ci_low, debiased_ece_ci_high), resampling the examples: basic, with the plug-in as its
        pivot, as Kumar et al.'s own bootstrap.
    n_boot (`int` or `None`, defaults to `None`): resamples of that bootstrap (None: 1,000).
    seed (`int`, defaults to 0): seed of the resamples.

Returns:
    debiased_ece (`float`): the estimate, a fraction (the L1 form can be slightly negative: it is not clipped).
    debiased_ece_ci_low, debiased_ece_ci_high (`float`): with `ci`, the ends of the bootstrap interval.

Examples:
    >>> import evaluate
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


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class DebiasedECE(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float32")), "references": datasets.Value("float64")}
            ),
            reference_urls=["https://arxiv.org/abs/1909.10155", "https://github.com/p-lambda/verified_calibration"],
        )

    def _compute(
        self,
        predictions,
        references,
        n_bins=15,
        p=2,
        mode="top-label",
        binning="equal_mass",
        from_logits=None,
        ci=None,
        n_boot=None,
        seed=0,
    ):
        preds = np.asarray(predictions, dtype=np.float32)
        value = debiased_ece(
            preds,
            whole_labels(references),
            n_bins,
            p=p,
            mode=mode,
            binning=binning,
            from_logits=from_logits,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
        )
        return flat_intervals({"debiased_ece": value})
