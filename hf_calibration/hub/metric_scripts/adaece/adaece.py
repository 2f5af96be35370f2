"""Adaptive ECE (equal-count bins) as an `evaluate` metric: a thin wrapper over hf_calibration.metrics.adaece."""

import datasets
import evaluate
import numpy as np

from hf_calibration._core.inputs import whole_labels  # labels travel as floats: 1.7 or 0.9 is refused, never truncated
from hf_calibration.metrics import adaece
from hf_calibration.metrics.bootstrap import flat_intervals

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

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one logit or probability vector per example, shape (N, K).
    references (`list` of `int`): the true class of each example, shape (N,); -100 is ignored.
    n_bins (`int`, defaults to 15): number of equal-count confidence bins.
    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities: when every value is in [0, 1]
        and every row sums to 1 within 1e-2 (float16 / bfloat16 softmax output passes), `predictions` are
        probabilities, otherwise logits (softmax is applied), as torchmetrics does. `True` / `False` say so
        explicitly and win; `False` requires the same rule and raises a `ValueError` otherwise.
    ci (`float` or `None`, defaults to `None`): a level such as 0.95 adds a basic (bias-corrected) bootstrap interval
        (adaece_ci_low, adaece_ci_high), resampling the examples.
    n_boot (`int` or `None`, defaults to `None`): resamples of that bootstrap (None: 1,000).
    seed (`int`, defaults to 0): seed of the resamples.
    task (`str` or `None`, defaults to `None`): "multiclass", "binary" or "multilabel" (also the configuration name,
        `evaluate.load(path, "multilabel")`); None reads it from the shapes: lists of 0/1 labels are multi-label (macro
        average over labels), one score per example is binary (its probability against the 0/1 label).

Returns:
    adaece (`float`): adaptive calibration error, a fraction in [0, 1].
    adaece_ci_low, adaece_ci_high (`float`): with `ci`, the ends of the bootstrap interval.

Examples:
    >>> import evaluate
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


def _task(metric, task):
    """``task`` given to compute, else the configuration name when it names one (``evaluate.load(path, "multilabel")``)."""
    if task is None and metric.config_name in ("multiclass", "binary", "multilabel"):
        return metric.config_name
    return task


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AdaECE(evaluate.Metric):
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
            reference_urls=["https://arxiv.org/abs/2002.09437"],
        )

    def _compute(self, predictions, references, n_bins=15, from_logits=None, ci=None, n_boot=None, seed=0, task=None):
        preds = np.asarray(predictions, dtype=np.float32)
        value = adaece(
            preds,
            whole_labels(references),
            n_bins=n_bins,
            from_logits=from_logits,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
            task=_task(self, task),
        )
        return flat_intervals({"adaece": value})
