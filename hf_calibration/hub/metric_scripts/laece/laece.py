"""LaECE as an `evaluate` metric: the package's function through the one script of hf_calibration.hub.dense_metric."""

from hf_calibration.hub.dense_metric import dense_metric_class

_DESCRIPTION = """
Per class c, over `n_bins` (25) equal-width confidence bins, `sum_j |D_j^c| / |D^c| * |mean confidence - mean(tp_i * IoU_i)|`, the IoU of a true positive with its ground truth (0 for a false positive); then the mean over the classes with detections (Oksuz et al. 2023, eq. 4).
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> metric = evaluate.load(hf_calibration.metric_path("laece"))
    >>> preds = [{"boxes": [[0, 0, 10, 10], [50, 50, 60, 60]], "scores": [0.9, 0.6], "labels": [0, 0]}]
    >>> refs = [{"boxes": [[0, 0, 10, 10]], "labels": [0], "image_size": [100, 100]}]
    >>> round(metric.compute(predictions=preds, references=refs)["laece"], 4)
    0.35
"""

_CITATION = """
@inproceedings{oksuz2023towards,
  title={Towards Building Self-Aware Object Detectors via Reliable Uncertainty Quantification and Calibration},
  author={Oksuz, Kemal and Joy, Tom and Dokania, Puneet K.},
  booktitle={IEEE/CVF Conference on Computer Vision and Pattern Recognition},
  year={2023}
}
"""

LAECE = dense_metric_class(
    "laece",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/2307.00934"],
    class_name="LaECE",
)
