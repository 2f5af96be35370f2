"""Exact smooth calibration error (smCE) as an `evaluate` metric: a thin wrapper over hf_calibration.metrics.smce."""

import datasets
import evaluate
import numpy as np

from hf_calibration._core.inputs import whole_labels  # labels travel as floats: 1.7 or 0.9 is refused, never truncated
from hf_calibration.metrics import smce
from hf_calibration.metrics.bootstrap import flat_intervals

_DESCRIPTION = """
Smooth calibration error (Błasiok, Gopalan, Hu & Nakkiran 2023) of the top-label confidence:
smCE = sup over 1-Lipschitz w: [0, 1] -> [-1, 1] of (1/N) sum_i w(p_i) (a_i - p_i), where p_i is the
top-label confidence and a_i whether the prediction is correct. It is a consistent calibration measure
(no bins, no bandwidth) and the quantity bounded by SMART's Theorem 3.1. The value is the exact optimum
of a linear programme over the sorted confidences, solved in O(N log N) (N = 1e6 in well under a second).
Computed in float64; rows labelled -100 are ignored.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one logit or probability vector per example, shape (N, K).
    references (`list` of `int`): the true class of each example, shape (N,); -100 is ignored.
    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities: when every value is in [0, 1]
        and every row sums to 1 within 1e-2 (float16 / bfloat16 softmax output passes), `predictions` are
        probabilities, otherwise logits (softmax is applied), as torchmetrics does. `True` / `False` say so
        explicitly and win; `False` requires the same rule and raises a `ValueError` otherwise.
    ci (`float` or `None`, defaults to `None`): a level such as 0.95 adds a basic (bias-corrected) bootstrap interval
        (smce_ci_low, smce_ci_high), resampling the examples.
    n_boot (`int` or `None`, defaults to `None`): resamples of that bootstrap (None: 200).
    seed (`int`, defaults to 0): seed of the resamples.

Returns:
    smce (`float`): smooth calibration error, a fraction in [0, 1].
    smce_ci_low, smce_ci_high (`float`): with `ci`, the ends of the bootstrap interval.

Examples:
    >>> import evaluate
    >>> import hf_calibration
    >>> smce_metric = evaluate.load(hf_calibration.metric_path("smce"))
    >>> probs = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
    >>> results = smce_metric.compute(predictions=probs, references=[0, 1, 0, 1])
    >>> round(results["smce"], 4)
    0.2581
"""

_CITATION = """
@inproceedings{blasiok2023unifying,
  title={A Unifying Theory of Distance from Calibration},
  author={B{\\l}asiok, Jaros{\\l}aw and Gopalan, Parikshit and Hu, Lunjia and Nakkiran, Preetum},
  booktitle={ACM Symposium on Theory of Computing (STOC)},
  year={2023}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SmCE(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float32")), "references": datasets.Value("float64")}
            ),
            reference_urls=["https://arxiv.org/abs/2211.16886"],
        )

    def _compute(self, predictions, references, from_logits=None, ci=None, n_boot=None, seed=0):
        preds = np.asarray(predictions, dtype=np.float32)
        value = smce(preds, whole_labels(references), from_logits=from_logits, ci=ci, n_boot=n_boot, seed=seed)
        return flat_intervals({"smce": value})
