"""Pixel ECE as an `evaluate` metric: the package's function through the one script of hf_calibration.hub.dense_metric."""

from hf_calibration.hub.dense_metric import dense_metric_class

_DESCRIPTION = """
Every labelled pixel is an example: its top-label confidence against whether its argmax equals its label, in `n_bins` equal-width bins (Guo et al. 2017); pixels labelled `ignore_index` (255) are skipped. Equals torchmetrics' `MulticlassCalibrationError` on the flattened, ignore-masked pixels. Also AdaECE, classwise ECE and, with `boundary_width`, the ECE of the pixels within that many pixels of a class edge.
"""

_EXAMPLES = """    >>> import evaluate
    >>> import hf_calibration
    >>> metric = evaluate.load(hf_calibration.metric_path("pixel_ece"))
    >>> probs = [[[0.9, 0.4]], [[0.1, 0.6]]]  # (K, H, W) = (2, 1, 2): pixel 0 right at 0.9, pixel 1 wrong at 0.6
    >>> round(metric.compute(predictions=[probs], references=[[[0, 0]]])["pixel_ece"], 4)
    0.35
"""

_CITATION = """
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={International Conference on Machine Learning},
  year={2017}
}
"""

PIXELECE = dense_metric_class(
    "pixel_ece",
    __name__,
    description=_DESCRIPTION,
    citation=_CITATION,
    examples=_EXAMPLES,
    reference_urls=["https://arxiv.org/abs/1706.04599"],
    class_name="PixelECE",
)
