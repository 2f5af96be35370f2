"""Expected Calibration Error (ECE) as an `evaluate` metric: the table's metric 'ece' through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

_DESCRIPTION = """
Expected Calibration Error (Guo et al. 2017) of the top-label confidence. Predictions are split into
`n_bins` equal-width confidence bins on (0, 1] (bin b holds lo < p <= hi; p = 0 goes to the first
bin, p = 1 to the last) and ECE = sum_b |B_b| / N * |accuracy_b - confidence_b|. The top-label
confidence of a row is max_k softmax(z)_k for logits, or max_k p_k for probabilities; a row is correct
when its argmax equals its label. Computed in float64; rows labelled -100 are ignored.
Equals torchmetrics' MulticlassCalibrationError(norm="l1") (away from its p = 1.0 edge case) and
netcal's ECE.
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> ece_metric = evaluate.load(hf_calibration.metric_path("ece"))
    >>> probs = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
    >>> results = ece_metric.compute(predictions=probs, references=[0, 1, 0, 1], n_bins=2)
    >>> round(results["ece"], 4)
    0.25
"""

_CITATION = """
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={International Conference on Machine Learning},
  pages={1321--1330},
  year={2017}
}
@inproceedings{naeini2015obtaining,
  title={Obtaining Well Calibrated Probabilities Using Bayesian Binning},
  author={Naeini, Mahdi Pakdaman and Cooper, Gregory F. and Hauskrecht, Milos},
  booktitle={AAAI Conference on Artificial Intelligence},
  year={2015}
}
"""

ECE = metric_class(
    "ece",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/1706.04599"],
    class_name="ECE",
)
