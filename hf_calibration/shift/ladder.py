"""A temperature read off the perturbation ladder at a deployment batch's estimated shift, and a label-free check.

``fit_for_shift`` perturbs the held-out images at strengths from clean to near chance (the ladder). At each level the
labels are known, so the ladder gives, besides the model's accuracy, the temperature that calibrates a clean-fitted
calibrator there, and two label-free statistics of that level's calibrated confidences: the ATC estimate (the share
above the fit set's ATC threshold, Garg et al., ICLR 2022) and the mean confidence. :func:`ladder_table` records them;
:func:`adapt_on_ladder` estimates the same statistic on an unlabelled deployment batch and reads the temperature off
the ladder at that point (interpolated in ``log T``): no severity is given, the batch places itself on the curve. So
strong noise, whose share of confident samples stays high while the model is mostly wrong, is read against the ladder's
own noisy levels, where that happened too, and not against the clean fit set alone.

The check (:func:`label_free_check`) compares two estimates of the batch's accuracy read off the ladder from two
statistics (the ATC share and the mean confidence): under a shift the ladder describes, they agree; when they
disagree by more than ``DISAGREEMENT`` (or the batch lies beyond the ladder's range), the batch is not like any level
of the ladder and no single temperature read off it should be trusted: label a few hundred samples of the batch and
fit on them, or keep the clean fit.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["DISAGREEMENT", "adapt_on_ladder", "label_free_check", "ladder_table"]

DISAGREEMENT = 0.1  # accuracy points (as a fraction) between the two ladder estimates beyond which the check fails


def _calibrated_confidence(calibrator: Any, logits: Any) -> tuple[torch.Tensor, np.ndarray]:
    with torch.no_grad():
        out = calibrator._forward_calibrated(torch.as_tensor(np.asarray(logits)), True).double().cpu()
    return out, torch.softmax(out, dim=1).amax(dim=1).numpy()


def ladder_table(calibrator: Any, level_logits: Sequence[Any], labels: Any) -> dict[str, list[float]]:
    """For each ladder level (logits of the same labelled held-out images, clean first): the model's accuracy, the ATC
    estimate and mean confidence of ``calibrator``'s output, and the temperature on top of it that minimises the NLL
    at that level (the one that calibrates it there)."""
    from hf_calibration.calibrators import TemperatureScaling

    threshold = (calibrator.fit_info_ or {}).get("atc_threshold")
    if threshold is None:
        raise ValueError("Expected a calibrator whose fit recorded its ATC threshold (fit_info_['atc_threshold']).")
    y = np.asarray(labels)
    table: dict[str, list[float]] = {"accuracy": [], "atc_estimate": [], "mean_confidence": [], "temperature": []}
    for z in level_logits:
        out, conf = _calibrated_confidence(calibrator, z)
        table["accuracy"].append(float((out.argmax(1).numpy() == y).mean()))
        table["atc_estimate"].append(float(np.mean(conf > threshold)))
        table["mean_confidence"].append(float(conf.mean()))
        ts = TemperatureScaling().fit(out, y, from_logits=True, progress_bar=False)
        table["temperature"].append(float(ts.temperature(out[:1])[0]))
    table["threshold"] = float(threshold)
    return table


def _read(table: dict, statistic: str, value: float, key: str, log: bool = False) -> float:
    """``table[key]`` interpolated at ``table[statistic] = value`` (the levels sorted by the statistic; clipped at
    the ladder's ends), in log space when ``log``."""
    x = np.asarray(table[statistic], dtype=np.float64)
    v = np.asarray(table[key], dtype=np.float64)
    v = np.log(v) if log else v
    order = np.argsort(x, kind="stable")
    out = float(np.interp(value, x[order], v[order]))
    return math.exp(out) if log else out


def label_free_check(table: dict, atc_estimate: float, mean_confidence: float) -> dict[str, Any]:
    """The two ladder estimates of a batch's accuracy (from its ATC share and from its mean confidence), whether they
    agree within ``DISAGREEMENT`` and whether the batch lies within the ladder's range (module docstring)."""
    by_atc = _read(table, "atc_estimate", atc_estimate, "accuracy")
    by_conf = _read(table, "mean_confidence", mean_confidence, "accuracy")
    lo, hi = min(table["mean_confidence"]), max(table["mean_confidence"])
    in_range = bool(lo - 0.02 <= mean_confidence <= hi + 0.02)
    disagreement = abs(by_atc - by_conf)
    ok = bool(disagreement <= DISAGREEMENT and in_range)
    return {
        "ok": ok,
        "accuracy_by_atc": by_atc,
        "accuracy_by_confidence": by_conf,
        "disagreement": disagreement,
        "in_ladder_range": in_range,
        "advice": "the batch's shift looks like one the ladder spans"
        if ok
        else "this batch is unlike every level of the ladder: the temperature read off it may be wrong; label a few "
        "hundred of its samples and fit on them, or keep the clean fit",
    }


def adapt_on_ladder(calibrator: Any, unlabeled_logits: Any, table: dict | None = None) -> Any:
    """A copy of ``calibrator`` whose calibrated logits are divided by the temperature the ladder gives at the
    batch's ATC estimate (module docstring); ``fit_info_["adaptation"]`` records the estimate, the temperature and
    the label-free check (:func:`label_free_check`), and the copy saves, loads and attaches like ``adapt()``'s.
    ``table``: a :func:`ladder_table`; by default the one ``fit_for_shift`` recorded (``fit_info_["shift_fit"]``)."""
    from hf_calibration.calibrators.adaptation import MIN_SAMPLES

    if table is None:
        table = ((calibrator.fit_info_ or {}).get("shift_fit") or {}).get("ladder")
        if table is None:
            raise ValueError(
                "Expected argument `table` (hf_calibration.shift.ladder.ladder_table): this calibrator was not fitted by "
                "fit_for_shift, which records its ladder."
            )

    z = calibrator._check_logits(unlabeled_logits)
    if z.shape[0] < MIN_SAMPLES:
        raise ValueError(
            f"Expected at least {MIN_SAMPLES} rows in `unlabeled_logits`, but got {z.shape[0]}: the estimate is a share "
            "of those rows."
        )
    _, conf = _calibrated_confidence(calibrator, z)
    estimate = float(np.mean(conf > table["threshold"]))
    temperature = _read(table, "atc_estimate", estimate, "temperature", log=True)
    adapted = copy.deepcopy(calibrator)
    adapted.__dict__["_attached_to"] = None
    adapted.fit_info_ = {
        **{k: v for k, v in calibrator.fit_info_.items() if k != "adaptation"},
        "adaptation": {
            "method": "ladder",
            "reference": "temperature read off the perturbation ladder (fit_for_shift) at the ATC estimate",
            "num_samples": int(z.shape[0]),
            "threshold": float(table["threshold"]),
            "estimated_accuracy": _read(table, "atc_estimate", estimate, "accuracy"),
            "atc_estimate": estimate,
            "mean_confidence_before": float(conf.mean()),
            "temperature": float(temperature),
            "check": label_free_check(table, estimate, float(conf.mean())),
        },
    }
    return adapted
