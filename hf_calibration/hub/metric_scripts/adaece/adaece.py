"""Adaptive ECE (equal-count bins) as an `evaluate` metric: the table's metric 'adaece' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

_DESCRIPTION = """
Adaptive Expected Calibration Error (Nguyen & O'Connor 2015; the AdaECE of Mukhoti et al. 2020) of the
top-label confidence. The sorted confidences are cut into `n_bins` bins of (as near as possible) equal
count, every example in exactly one bin, and AdaECE = sum_b |B_b| / N * |accuracy_b - confidence_b|.
Equal confidences always share a bin (a tie group that straddles a cut goes whole to the lower bin), so
ties are never split by correctness or by input order.
The top-label confidence of a row is max_k softmax(z)_k for logits, or max_k p_k for probabilities;
a row is correct when its argmax equals its label. Computed in float64; rows labelled -100 are ignored.
Unlike the focal-calibration reference code, the lowest-confidence example is not dropped.
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> adaece_metric = evaluate.load(hf_calibration.metric_path("adaece"))
    >>> probs = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
    >>> results = adaece_metric.compute(predictions=probs, references=[0, 1, 0, 1], n_bins=2)
    >>> round(results["adaece"], 4)
    0.425
"""

_CITATION = """
@inproceedings{nguyen2015posterior,
  title={Posterior Calibration and Exploratory Analysis for Natural Language Processing Models},
  author={Nguyen, Khanh and O'Connor, Brendan},
  booktitle={Conference on Empirical Methods in Natural Language Processing},
  year={2015}
}
@inproceedings{mukhoti2020calibrating,
  title={Calibrating Deep Neural Networks using Focal Loss},
  author={Mukhoti, Jishnu and Kulharia, Viveka and Sanyal, Amartya and Golodetz, Stuart and Torr, Philip and Dokania, Puneet},
  booktitle={Advances in Neural Information Processing Systems},
  year={2020}
}
"""

AdaECE = metric_class(
    "adaece",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/2002.09437"],
    class_name="AdaECE",
)
