"""Conformal prediction sets with a coverage guarantee: THR (LAC), APS and RAPS (multi-class and binary heads), and
multi-label sets with a controlled false-negative rate (conformal risk control), saved and shared like the calibrators.

    from hf_calibration.conformal import ConformalPredictor, coverage, set_size

    predictor = ConformalPredictor("raps").fit(val_logits, val_labels, alpha=0.1)   # optionally calibrator=...
    sets = predictor.predict_sets(test_logits)      # (N, K) boolean mask
    coverage(sets, test_labels), set_size(sets)     # >= 0.9 on average over calibration draws
    predictor.push_to_hub("me/vit", path_in_repo="conformal")
"""

from hf_calibration.conformal.metrics import coverage, set_size
from hf_calibration.conformal.multilabel import MultiLabelConformalPredictor, false_negative_rate
from hf_calibration.conformal.predictor import ConformalPredictor

__all__ = [
    "ConformalPredictor",
    "MultiLabelConformalPredictor",
    "false_negative_rate",
    "load_conformal_predictor",
    "coverage",
    "set_size",
]


def load_conformal_predictor(name_or_path, *, subfolder=None, **kwargs):
    """Load a saved conformal predictor of either kind (``ConformalPredictor`` for THR / APS / RAPS,
    ``MultiLabelConformalPredictor`` for conformal risk control), as its ``config.json`` says."""
    from hf_calibration._core import checkpoints as hub

    folder = hub.resolve_checkpoint(
        name_or_path,
        subfolder=subfolder,
        name="name_or_path",
        **{k: kwargs[k] for k in hub.DOWNLOAD_OPTIONS if k in kwargs},
    )
    cls = MultiLabelConformalPredictor if hub.read_config(folder).get("conformal") == "crc" else ConformalPredictor
    return cls.from_pretrained(folder, **{k: v for k, v in kwargs.items() if k not in hub.DOWNLOAD_OPTIONS})
