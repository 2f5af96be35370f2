"""Every calibration metric at once as an `evaluate` metric: a thin wrapper over hf_calibration.metrics.calibration_report."""

import datasets
import evaluate
import numpy as np

from hf_calibration._core.inputs import whole_labels  # labels travel as floats: 1.7 or 0.9 is refused, never truncated
from hf_calibration.metrics import calibration_report
from hf_calibration.metrics.bootstrap import flat_intervals

KEY_PREFIX = "calibration_"  # distinct from the single metrics' keys (`ece`, `adaece`, `smce`) under evaluate.combine

_DESCRIPTION = """
A full calibration report of a classifier's predictions in one call: accuracy, ECE (equal-width bins),
AdaECE (equal-count bins), MCE, classwise ECE, the over-/under-confidence split O-ECE and U-ECE (they add
up to ECE), the exact smooth calibration error smCE, the kernel smooth ECE smECE (relplot-compatible),
the multiclass Brier score and the negative log-likelihood. All values are computed in float64 from one
pass over the predictions; rows labelled -100 are ignored.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one logit or probability vector per example, shape (N, K).
    references (`list` of `int`): the true class of each example, shape (N,); -100 is ignored.
    n_bins (`int`, defaults to 15): number of bins of the binned metrics (ECE, AdaECE, MCE, classwise ECE, O-/U-ECE).
    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities: when every value is in [0, 1]
        and every row sums to 1 within 1e-2 (float16 / bfloat16 softmax output passes), `predictions` are
        probabilities, otherwise logits (softmax is applied), as torchmetrics does. `True` / `False` say so
        explicitly and win; `False` requires the same rule and raises a `ValueError` otherwise.
    ci (`float` or `None`, defaults to `None`): a level such as 0.95 adds a bootstrap interval
        (calibration_<metric>_ci_low, calibration_<metric>_ci_high), resampling the examples: basic
        (bias-corrected) for the calibration errors, percentile for accuracy / Brier / NLL, none for MCE (NaN ends).
    n_boot (`int` or `None`, defaults to `None`): resamples of that bootstrap (None: 1,000; 200 for smCE, smECE and
        classwise ECE).
    seed (`int`, defaults to 0): seed of the resamples.
    task (`str` or `None`, defaults to `None`): "multiclass", "binary" or "multilabel" (also the configuration name,
        `evaluate.load(path, "multilabel")`); None reads it from the shapes: lists of 0/1 labels are multi-label (macro
        average over labels), one score per example is binary (its probability against the 0/1 label).

Returns:
    Every key starts with `calibration_`, so the report combines cleanly with the single metrics
    (`evaluate.combine([ece, adaece, smce, calibration])` gives `ece`, `adaece`, `smce`, `calibration_ece`, ...):
    calibration_n (`int`): number of examples used (not ignored).
    calibration_accuracy, calibration_ece, calibration_adaece, calibration_mce, calibration_classwise_ece,
    calibration_o_ece, calibration_u_ece, calibration_smce, calibration_smece (`float`): fractions in [0, 1].
    calibration_brier (`float`): multiclass Brier score (sum over classes, mean over examples), in [0, 2].
    calibration_nll (`float`): mean negative log-likelihood of the true class.
    With `ci`, every metric also has `<key>_ci_low` and `<key>_ci_high` (`float`), the ends of its bootstrap interval.

Examples:
    >>> import evaluate
    >>> import hf_calibration
    >>> calibration = evaluate.load(hf_calibration.metric_path("calibration"))
    >>> probs = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
    >>> results = calibration.compute(predictions=probs, references=[0, 1, 0, 1], n_bins=2)
    >>> results["calibration_n"], round(results["calibration_accuracy"], 4), round(results["calibration_ece"], 4)
    (4, 0.5, 0.25)
"""

_CITATION = """
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={International Conference on Machine Learning},
  year={2017}
}
@inproceedings{blasiok2023unifying,
  title={A Unifying Theory of Distance from Calibration},
  author={B{\\l}asiok, Jaros{\\l}aw and Gopalan, Parikshit and Hu, Lunjia and Nakkiran, Preetum},
  booktitle={ACM Symposium on Theory of Computing (STOC)},
  year={2023}
}
@inproceedings{blasiok2023smooth,
  title={Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing},
  author={B{\\l}asiok, Jaros{\\l}aw and Nakkiran, Preetum},
  booktitle={International Conference on Learning Representations},
  year={2024}
}
"""


def _task(metric, task):
    """``task`` given to compute, else the configuration name when it names one (``evaluate.load(path, "multilabel")``)."""
    if task is None and metric.config_name in ("multiclass", "binary", "multilabel"):
        return metric.config_name
    return task


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Calibration(evaluate.Metric):
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
            reference_urls=["https://arxiv.org/abs/1706.04599", "https://arxiv.org/abs/2211.16886"],
        )

    def _compute(self, predictions, references, n_bins=15, from_logits=None, ci=None, n_boot=None, seed=0, task=None):
        preds = np.asarray(predictions, dtype=np.float32)
        report = calibration_report(
            preds,
            whole_labels(references),
            n_bins=n_bins,
            from_logits=from_logits,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
            task=_task(self, task),
        )
        if hasattr(report, "micro"):  # a binary / multi-label head: macro values, and the pooled ones as <metric>_micro
            values = {**report.macro, **{f"{key}_micro": value for key, value in report.micro.items()}}
            return flat_intervals({f"{KEY_PREFIX}{key}": value for key, value in values.items()})
        return flat_intervals({f"{KEY_PREFIX}{key}": value for key, value in report.items()})
