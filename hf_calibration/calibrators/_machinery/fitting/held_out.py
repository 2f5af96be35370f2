"""A fit's own held-out check: does the calibrator leave the model worse on samples its fit did not see?

A calibrator class that sets ``held_out_check = True`` (SMART and PTS: tens of parameters fitted by a non-convex
objective, which overfit a small calibration set) runs it after every fit on at most ``MAX_SAMPLES`` samples: the fit
set is split into ``FOLDS`` stratified folds (``cv.stratified_folds``, seed 0), a copy of the calibrator (the same
constructor arguments and objective) is fitted on all folds but one, and each sample's NLL under the copy that did not
see it (cross-fitted) is compared with its NLL under the model's own logits. Where the mean cross-fitted NLL is higher
the fit warns (``HeldOutWorseWarning``); either way ``fit_info_["held_out_check"]`` records the two numbers.

NLL is the criterion because it is the proper score every calibrator must not worsen (on K = 2, N = 200 draws SMART,
which fits a soft ECE, took the test NLL from 0.517 to 0.948 on 2 of 4 seeds; ``benchmarks/RESULTS.md``, "Small
calibration sets"). The copies may train on fewer samples than the class's ``min_samples`` (PTS at N = 50 trains on
40): the check asks what a fit of about this size does, not whether one is allowed. ``AutoCalibrator`` and
``CalibrationTrainer(calibrate_on_eval=...)`` refit after their own cross-validation, which is the same check: they skip
this one (``held_out_checked``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import warnings
from typing import Any

import numpy as np
import torch

FOLDS = 5
MAX_SAMPLES = (
    1000  # above this a fit of these sizes (49 parameters) has 20 samples a parameter; the check costs FOLDS fits
)
_SKIP: contextvars.ContextVar[bool] = contextvars.ContextVar("hf_calibration_held_out_checked", default=False)


class HeldOutWorseWarning(UserWarning):
    """A fitted calibrator's own held-out check (cross-fitting on its fit set) found the held-out NLL worse than the
    uncalibrated model's; ``fit_info_["held_out_check"]`` holds the numbers."""


def sample_nll(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's negative log-likelihood of its label under ``softmax(logits)`` (float64, shape (N,))."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=1, keepdims=True)
    log_partition = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
    return log_partition - z[np.arange(z.shape[0]), labels]


@contextlib.contextmanager
def held_out_checked():
    """Fits inside this block skip the check (their caller cross-validated them already)."""
    token = _SKIP.set(True)
    try:
        yield
    finally:
        _SKIP.reset(token)


@contextlib.contextmanager
def _quiet():
    """The package's log records below ERROR and its warnings are dropped inside this block."""
    log = logging.getLogger("hf_calibration")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def wanted(calibrator: Any, num_samples: int) -> bool:
    """Whether a top-level fit of ``calibrator`` on ``num_samples`` samples runs the check."""
    return bool(getattr(type(calibrator), "held_out_check", False)) and num_samples <= MAX_SAMPLES and not _SKIP.get()


def run(calibrator: Any, z: np.ndarray, y: np.ndarray, objective: str, options: dict) -> dict[str, Any]:
    """Cross-fit copies of ``calibrator`` on ``(z, y)`` (prepared fit inputs) and compare held-out NLLs; warns when the
    calibrated one is worse. Returns the record for ``fit_info_["held_out_check"]``."""
    from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds

    if hasattr(z, "blocks"):  # a block-wise fit's rows (_rows.FitRows): at most MAX_SAMPLES of them, in memory
        z = z.array()
    folds = stratified_folds(y, cv=FOLDS, seed=0)
    cross_fitted = np.empty(z.shape[0])
    for train, val in folds:
        copy = type(calibrator)(**(calibrator._hub_mixin_config or {}))
        with _quiet():  # what the copies' fits say (a fallback, ...) the fit itself has said already
            copy._fit_checked(z[train], y[train], objective, options, False, report=False, check_size=False)
        with torch.no_grad():
            cross_fitted[val] = sample_nll(copy(torch.from_numpy(z[val]), from_logits=True).double().numpy(), y[val])
    before, after = float(sample_nll(z, y).mean()), float(cross_fitted.mean())
    record = {"folds": FOLDS, "uncalibrated_nll": before, "cross_fitted_nll": after, "worse": after > before}
    if record["worse"]:
        warnings.warn(
            f"{type(calibrator).__name__} fitted on {z.shape[0]} samples leaves the held-out NLL worse than the uncalibrated "
            f"model's: {before:.4f} -> {after:.4f}, each sample calibrated by a fit on the other {FOLDS - 1} of {FOLDS} folds "
            "of the fit set (fit_info_['held_out_check']). Its parameters overfit this few samples: temperature scaling, "
            "or AutoCalibrator (which leaves the model as it is when nothing helps), is the safer choice.",
            HeldOutWorseWarning,
            stacklevel=4,
        )
    return record
