"""Exact smooth calibration error (smCE) as an `evaluate` metric: the table's metric 'smce' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

_DESCRIPTION = """
Smooth calibration error (Błasiok, Gopalan, Hu & Nakkiran 2023) of the top-label confidence:
smCE = sup over 1-Lipschitz w: [0, 1] -> [-1, 1] of (1/N) sum_i w(p_i) (a_i - p_i), where p_i is the
top-label confidence and a_i whether the prediction is correct. It is a consistent calibration measure
(no bins, no bandwidth) and the quantity bounded by SMART's Theorem 3.1. The value is the exact optimum
of a linear programme over the sorted confidences, solved in O(N log N) (N = 1e6 in well under a second).
Computed in float64; rows labelled -100 are ignored.
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> smce_metric = evaluate.load(hf_calibration.metric_path("smce"))
    >>> probs = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
    >>> results = smce_metric.compute(predictions=probs, references=[0, 1, 0, 1])
    >>> round(results["smce"], 4)
    0.2581
"""

_CITATION = r"""
@inproceedings{blasiok2023unifying,
  title={A Unifying Theory of Distance from Calibration},
  author={B{\l}asiok, Jaros{\l}aw and Gopalan, Parikshit and Hu, Lunjia and Nakkiran, Preetum},
  booktitle={ACM Symposium on Theory of Computing (STOC)},
  year={2023}
}
"""

SmCE = metric_class(
    "smce",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/2211.16886"],
    class_name="SmCE",
)
