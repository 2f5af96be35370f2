"""What ``compare_calibrators`` needs to compare the calibrators of a sigmoid head (binary or multi-label).

The calibration samples are split into ``cv`` folds (a binary head: stratified by its label; a multi-label head: a
seeded shuffle), every candidate is fitted on ``cv - 1`` folds and scored on the held-out one, and the table is a
:class:`~hf_calibration.calibrators.selection.CalibratorComparison` whose columns are the macro averages over labels
(each label's ECE, AdaECE, smCE, binary cross-entropy NLL and Brier, then their mean; accuracy: each label thresholded
at 0.5). Racing and ``best()`` work as for softmax heads, so ``AutoCalibrator`` never picks a method whose
cross-validated NLL is worse than the uncalibrated model's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds
from hf_calibration.calibrators._machinery.registry import create_calibrator


def _sigmoid_scores(
    calibrated: np.ndarray, z: np.ndarray, y: np.ndarray, mask: np.ndarray, n_bins: int
) -> dict[str, float]:
    """Macro averages over labels of the held-out scores of ``calibrated`` (and the accuracy change against ``z``)."""
    from hf_calibration.metrics.multilabel import _values, prepare_sigmoid

    target = np.where(mask, y, -100).astype(np.int64)
    after = prepare_sigmoid(calibrated, target, task="multilabel", from_logits=True)
    before_accuracy = float((((z > 0) == (y > 0.5)) & mask).sum() / mask.sum())
    out = {name: _values(after, name, n_bins)[1] for name in ("ece", "adaece", "smce", "nll", "brier")}
    out["accuracy_change"] = float((((calibrated > 0) == (y > 0.5)) & mask).sum() / mask.sum()) - before_accuracy
    return out


class SigmoidHead:
    """The calibration set of a binary or multi-label head, as ``compare_calibrators`` reads it (module docstring)."""

    def __init__(self, logits: Any, labels: Any, from_logits: bool | None, task: str, n_bins: int) -> None:
        probe = create_calibrator("platt")
        self.z, self.y, self.mask, self.task, self.layout, self.is_logits = probe._sigmoid_fit_inputs(
            logits, labels, from_logits, task
        )
        self.n_bins = n_bins

    def folds(self, cv: int, seed: int):
        if self.task == "binary":
            return stratified_folds(np.where(self.mask[:, 0], self.y[:, 0], 2).astype(np.int64), cv=cv, seed=seed)
        return stratified_folds(np.zeros(self.y.shape[0], dtype=np.int64), cv=cv, seed=seed)  # a seeded shuffle

    def fit(self, calibrator, train: np.ndarray) -> None:
        z, y, mask = self.z[train], self.y[train], self.mask[train]
        objective = calibrator._check_objective(None)
        calibrator._fit_sigmoid(z, y, mask, self.task, self.layout, self.is_logits, objective, False, report=False)

    def predict(self, calibrator, val: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return calibrator._calibrate_logits(torch.from_numpy(self.z[val])).numpy()

    def score(self, calibrated: np.ndarray, val: np.ndarray) -> dict[str, float]:
        return _sigmoid_scores(calibrated, self.z[val], self.y[val], self.mask[val], self.n_bins)

    def sample_nll(self, calibrated: np.ndarray, val: np.ndarray) -> None:
        return None  # the paired test of ``best`` reads softmax NLLs only

    def table(self, keep_predictions: bool) -> dict[str, Any]:
        return {"labels": np.where(self.mask, self.y, -100).astype(np.int64) if keep_predictions else None}


def sigmoid_identity(logits: Any, labels: Any, from_logits: bool | None, task: str, reason: str):
    """A ``SigmoidTemperatureScaling`` fixed at T = 1 (the identity) with the fit record of ``logits``."""
    from hf_calibration.calibrators.sigmoid.temperature import SigmoidTemperatureScaling

    identity = SigmoidTemperatureScaling()
    z, y, mask, task, layout, is_logits = identity._sigmoid_fit_inputs(logits, labels, from_logits, task)
    identity._resize(z.shape[1], task)
    identity.fit_info_ = {
        "task": task,
        "head": "softmax2" if layout == "softmax2" else "sigmoid",
        "objective": "identity",
        "input": "logits" if is_logits else "probabilities",
        "num_samples": int(z.shape[0]),
        "num_labels": int(z.shape[1]),
        "temperature": 1.0,
    }
    identity.fit_info_.update(identity._sigmoid_fit_report(z, y, mask))
    identity.fit_info_["uncalibrated"] = {"classes": "all", "reason": reason}
    return identity
