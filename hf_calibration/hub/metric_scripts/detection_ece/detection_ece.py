"""Detection ECE as an `evaluate` metric: the package's function through the one script of hf_calibration.hub.dense_metric."""

from hf_calibration.hub.dense_metric import dense_metric_class

_DESCRIPTION = """
Each detection is matched to the ground truth (IoU >= `iou_threshold`, greedily by score within class, as COCO); a matched detection is a true positive. Over the detections scoring at least `score_threshold`, in `n_bins` equal-width confidence bins, `ECE = sum_b |B_b| / N * |precision(b) - confidence(b)|` (Küppers et al. 2020).
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> metric = evaluate.load(hf_calibration.metric_path("detection_ece"))
    >>> preds = [{"boxes": [[0, 0, 10, 10], [50, 50, 60, 60]], "scores": [0.9, 0.6], "labels": [0, 0]}]
    >>> refs = [{"boxes": [[0, 0, 10, 10]], "labels": [0], "image_size": [100, 100]}]
    >>> round(metric.compute(predictions=preds, references=refs)["detection_ece"], 4)
    0.35
"""

_CITATION = """
@inproceedings{kuppers2020multivariate,
  title={Multivariate Confidence Calibration for Object Detection},
  author={K{\"u}ppers, Fabian and Kronenberger, Jan and Shantia, Amirhossein and Haselhoff, Anselm},
  booktitle={IEEE/CVF Conference on Computer Vision and Pattern Recognition Workshops},
  year={2020}
}
"""

DETECTIONECE = dense_metric_class(
    "detection_ece",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/2004.13546"],
    class_name="DetectionECE",
)
