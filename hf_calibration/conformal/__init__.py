"""Conformal prediction sets with a coverage guarantee: THR (LAC), APS and RAPS, saved and shared like the calibrators.

    from hf_calibration.conformal import ConformalPredictor, coverage, set_size

    predictor = ConformalPredictor("raps").fit(val_logits, val_labels, alpha=0.1)   # optionally calibrator=...
    sets = predictor.predict_sets(test_logits)      # (N, K) boolean mask
    coverage(sets, test_labels), set_size(sets)     # >= 0.9 on average over calibration draws
    predictor.push_to_hub("me/vit", path_in_repo="conformal")
"""

from .metrics import coverage, set_size, set_sizes
from .predictor import ConformalPredictor
from .quantile import conformal_quantile, quantile_rank
from .scores import METHODS, conformity_scores
from .tuning import LAMBDA_GRID, choose_k_reg, choose_penalty

__all__ = [
    "LAMBDA_GRID",
    "METHODS",
    "ConformalPredictor",
    "choose_k_reg",
    "choose_penalty",
    "conformal_quantile",
    "conformity_scores",
    "coverage",
    "quantile_rank",
    "set_size",
    "set_sizes",
]
