"""Choosing a sigmoid calibrator (binary or multi-label head) by cross-validation, as ``compare_calibrators`` does for
softmax heads.

The calibration samples are split into ``cv`` folds (a binary head: stratified by its label; a multi-label head: a
seeded shuffle), every candidate is fitted on ``cv - 1`` folds and scored on the held-out one, and the table is a
:class:`~hf_calibration.calibrators.selection.CalibratorComparison` whose columns are the macro averages over labels
(each label's ECE, AdaECE, smCE, binary cross-entropy NLL and Brier, then their mean; accuracy: each label thresholded
at 0.5). Racing and ``best()`` work as for softmax heads, so ``AutoCalibrator`` never picks a method whose
cross-validated NLL is worse than the uncalibrated model's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from hf_calibration._core import progress as _progress
from hf_calibration._core.checks import check_choice, check_int
from hf_calibration.calibrators._fitting.comparison import (
    COLUMNS,
    SELECTION_METRICS,
    UNCALIBRATED,
    CalibratorComparison,
    MethodScores,
    _method_specs,
    _race,
    is_stochastic,
)
from hf_calibration.calibrators._fitting.cv import stratified_folds
from hf_calibration.calibrators._registry import create_calibrator

logger = logging.getLogger(__name__)


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


def _folds(y: np.ndarray, mask: np.ndarray, task: str, cv: int, seed: int):
    if task == "binary":
        return stratified_folds(np.where(mask[:, 0], y[:, 0], 2).astype(np.int64), cv=cv, seed=seed)
    return stratified_folds(np.zeros(y.shape[0], dtype=np.int64), cv=cv, seed=seed)  # a seeded shuffle into cv folds


def compare_sigmoid_calibrators(
    logits: Any,
    labels: Any,
    methods: Any = "default",
    cv: int = 5,
    seed: int = 0,
    *,
    metric: str = "ece",
    race: bool = True,
    fit_seeds: int = 1,
    n_bins: int = 15,
    from_logits: bool | None = None,
    keep_predictions: bool = False,
    progress_bar: bool = True,
    task: str | None = None,
) -> CalibratorComparison:
    """``compare_calibrators`` for a binary or multi-label head (module docstring); arguments as there."""
    cv = check_int(cv, "cv", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    metric = check_choice(metric, "metric", SELECTION_METRICS)
    fit_seeds = check_int(fit_seeds, "fit_seeds", minimum=1)
    n_bins = check_int(n_bins, "n_bins", minimum=1)
    for name, flag in (("race", race), ("keep_predictions", keep_predictions), ("progress_bar", progress_bar)):
        if not isinstance(flag, bool):
            raise TypeError(f"Expected argument `{name}` to be a bool, but got {flag!r}.")
    probe = create_calibrator("platt")
    z, y, mask, task, layout, is_logits = probe._sigmoid_fit_inputs(logits, labels, from_logits, task)
    specs = _method_specs(methods, task)
    folds = _folds(y, mask, task, cv, seed)

    scores = {UNCALIBRATED: MethodScores(UNCALIBRATED)}
    for fold, (_, val) in enumerate(folds):
        scores[UNCALIBRATED].add_fold(
            fold, {**_sigmoid_scores(z[val], z[val], y[val], mask[val], n_bins), "fit_seconds": 0.0}
        )
    predictions = {UNCALIBRATED: z} if keep_predictions else None
    seeds = {
        name: [seed + i for i in range(fit_seeds)] if is_stochastic(name) and "seed" not in kwargs else [None]
        for name, kwargs in specs.items()
    }
    for name, kwargs in specs.items():
        scores[name] = MethodScores(name, kwargs, fit_seeds=len(seeds[name]))
        if keep_predictions:
            predictions[name] = np.full_like(z, np.nan)

    running = list(specs)
    with _progress.progress_bar(total=len(specs) * cv, desc="compare_calibrators", enabled=progress_bar) as bar:
        for fold, (train, val) in enumerate(folds):
            for name in running:
                bar.set_postfix_str(f"{name}, fold {fold + 1}/{cv}", refresh=False)
                try:
                    runs, first = [], None
                    for fit_seed in seeds[name]:
                        calibrator = create_calibrator(
                            name, **specs[name], **({} if fit_seed is None else {"seed": fit_seed})
                        )
                        start = time.perf_counter()
                        calibrator._fit_sigmoid(
                            z[train],
                            y[train],
                            mask[train],
                            task,
                            layout,
                            is_logits,
                            calibrator._check_objective(None),
                            False,
                            report=False,
                        )
                        elapsed = time.perf_counter() - start
                        with torch.no_grad():
                            calibrated = calibrator._calibrate_logits(torch.from_numpy(z[val])).numpy()
                        runs.append(
                            {**_sigmoid_scores(calibrated, z[val], y[val], mask[val], n_bins), "fit_seconds": elapsed}
                        )
                        first = calibrated if first is None else first
                    values = {column: float(np.mean([run[column] for run in runs])) for column in COLUMNS}
                except Exception as err:  # noqa: BLE001 - a method that fails is a row of the table, not a crash
                    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
                    scores[name].errors.append(f"fold {fold + 1}: {type(err).__name__}: {message}")
                    logger.warning("compare_calibrators: %s failed on fold %d/%d: %s", name, fold + 1, cv, err)
                else:
                    scores[name].add_fold(fold, values)
                    if keep_predictions:
                        predictions[name][val] = first
                bar.update(1)
            if race and fold + 1 < cv:
                for name, why in _race(scores, running, metric, list(range(fold + 1))).items():
                    scores[name].stopped = why
                    running.remove(name)
                    bar.total -= cv - fold - 1
    return CalibratorComparison(
        scores,
        cv=cv,
        seed=seed,
        n_bins=n_bins,
        num_samples=int(z.shape[0]),
        num_classes=int(z.shape[1]),
        predictions=predictions,
        labels=np.where(mask, y, -100).astype(np.int64) if keep_predictions else None,
        metric=metric,
        task=task,
    )


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
