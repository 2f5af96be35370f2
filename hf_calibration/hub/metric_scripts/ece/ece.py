"""Expected Calibration Error (ECE) as an `evaluate` metric: a thin wrapper over hf_calibration.metrics.ece."""

import datasets
import evaluate
import numpy as np

from hf_calibration._core.inputs import whole_labels  # labels travel as floats: 1.7 or 0.9 is refused, never truncated
from hf_calibration.metrics import ece
from hf_calibration.metrics.bootstrap import flat_intervals

_DESCRIPTION = """
Expected Calibration Error (Guo et al. 2017) of the top-label confidence. Predictions are split into
`n_bins` equal-width confidence bins on (0, 1] (bin b holds lo < p <= hi; p = 0 goes to the first
bin, p = 1 to the last) and ECE = sum_b |B_b| / N * |accuracy_b - confidence_b|. The top-label
confidence of a row is max_k softmax(z)_k for logits, or max_k p_k for probabilities; a row is correct
when its argmax equals its label. Computed in float64; rows labelled -100 are ignored.
Equals torchmetrics' MulticlassCalibrationError(norm="l1") (away from its p = 1.0 edge case) and
netcal's ECE.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one logit or probability vector per example, shape (N, K).
    references (`list` of `int`): the true class of each example, shape (N,); -100 is ignored.
    n_bins (`int`, defaults to 15): number of equal-width confidence bins.
    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities: when every value is in [0, 1]
        and every row sums to 1 within 1e-2 (float16 / bfloat16 softmax output passes), `predictions` are
        probabilities, otherwise logits (softmax is applied), as torchmetrics does. `True` / `False` say so
        explicitly and win; `False` requires the same rule and raises a `ValueError` otherwise.
    ci (`float` or `None`, defaults to `None`): a level such as 0.95 adds a basic (bias-corrected) bootstrap interval
        (ece_ci_low, ece_ci_high), resampling the examples.
    n_boot (`int` or `None`, defaults to `None`): resamples of that bootstrap (None: 1,000).
    seed (`int`, defaults to 0): seed of the resamples.
    task (`str` or `None`, defaults to `None`): "multiclass", "binary" or "multilabel" (also the configuration name,
        `evaluate.load(path, "multilabel")`); None reads it from the shapes: lists of 0/1 labels are multi-label (macro
        average over labels), one score per example is binary (its probability against the 0/1 label).

Returns:
    ece (`float`): expected calibration error, a fraction in [0, 1] (multiply by 100 for the papers' percent).
    ece_ci_low, ece_ci_high (`float`): with `ci`, the ends of the bootstrap interval.

Examples:
    >>> import evaluate
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


def _task(metric, task):
    """``task`` given to compute, else the configuration name when it names one (``evaluate.load(path, "multilabel")``)."""
    if task is None and metric.config_name in ("multiclass", "binary", "multilabel"):
        return metric.config_name
    return task


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ECE(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[  # multi-class (K scores, a class index), multi-label (L scores, L 0/1 labels), binary (one score)
                datasets.Features(
                    {
                        "predictions": datasets.Sequence(datasets.Value("float32")),
                        "references": datasets.Value("float64"),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Sequence(datasets.Value("float32")),
                        "references": datasets.Sequence(datasets.Value("float64")),
                    }
                ),
                datasets.Features({"predictions": datasets.Value("float32"), "references": datasets.Value("float64")}),
            ],
            reference_urls=["https://arxiv.org/abs/1706.04599"],
        )

    def _compute(self, predictions, references, n_bins=15, from_logits=None, ci=None, n_boot=None, seed=0, task=None):
        preds = np.asarray(predictions, dtype=np.float32)
        value = ece(
            preds,
            whole_labels(references),
            n_bins=n_bins,
            from_logits=from_logits,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
            task=_task(self, task),
        )
        return flat_intervals({"ece": value})
