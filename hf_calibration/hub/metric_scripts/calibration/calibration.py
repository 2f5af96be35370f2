"""Every calibration metric at once as an `evaluate` metric: calibration_report through the one script of hf_calibration.hub.evaluate_metric."""

from hf_calibration.hub.evaluate_metric import metric_class

_DESCRIPTION = """
A full calibration report of a classifier's predictions in one call: accuracy, ECE (equal-width bins),
AdaECE (equal-count bins), MCE, classwise ECE, the over-/under-confidence split O-ECE and U-ECE (they add
up to ECE), the exact smooth calibration error smCE, the kernel smooth ECE smECE (relplot-compatible),
the multiclass Brier score and the negative log-likelihood. All values are computed in float64 from one
pass over the predictions; rows labelled -100 are ignored.
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> calibration = evaluate.load(hf_calibration.metric_path("calibration"))
    >>> probs = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
    >>> results = calibration.compute(predictions=probs, references=[0, 1, 0, 1], n_bins=2)
    >>> results["calibration_n"], round(results["calibration_accuracy"], 4), round(results["calibration_ece"], 4)
    (4, 0.5, 0.25)
"""

_CITATION = r"""
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={International Conference on Machine Learning},
  year={2017}
}
@inproceedings{blasiok2023unifying,
  title={A Unifying Theory of Distance from Calibration},
  author={B{\l}asiok, Jaros{\l}aw and Gopalan, Parikshit and Hu, Lunjia and Nakkiran, Preetum},
  booktitle={ACM Symposium on Theory of Computing (STOC)},
  year={2023}
}
@inproceedings{blasiok2023smooth,
  title={Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing},
  author={B{\l}asiok, Jaros{\l}aw and Nakkiran, Preetum},
  booktitle={International Conference on Learning Representations},
  year={2024}
}
"""

Calibration = metric_class(
    "calibration",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/1706.04599", "https://arxiv.org/abs/2211.16886"],
    class_name="Calibration",
)
