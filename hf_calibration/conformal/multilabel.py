"""Multi-label prediction sets with a controlled false-negative rate: conformal risk control (Angelopoulos, Bates, Fisch,
Lei & Schuster 2022, "Conformal Risk Control", Sec. 2 and the multi-label example of Sec. 3).

A set predicts the labels whose (calibrated) sigmoid probability exceeds a threshold, ``C_t(x) = {l : p_l(x) > t}``.
The loss of a sample is its false-negative rate, the share of its true labels the set misses,
``L_i(t) = |{l in Y_i : p_il <= t}| / |Y_i|`` (0 for a sample with no true label: nothing to miss), bounded by
``B = 1`` and non-decreasing in ``t``. With ``n`` calibration samples, CRC takes the largest ``t`` whose inflated
empirical risk is within ``alpha``,

    t_hat = sup { t : n / (n + 1) * mean_i L_i(t) + B / (n + 1) <= alpha },

and then ``E[L_{n+1}(t_hat)] <= alpha`` for a new sample exchangeable with the calibration ones (the paper's Theorem 1):
on average over calibration draws, a test set misses at most ``alpha`` of the true labels.

``thresholds="exact"`` (default) searches every threshold (the loss only changes at the calibration positives'
probabilities); an array restricts the search to it, as MAPIE's ``MultiLabelClassificationController(risk="recall",
method="crc")`` does with its default grid ``np.arange(0, 1, 0.01)``. MAPIE keeps a grid threshold while the bound is
strictly below ``alpha``; the paper (and this module) while it is at most ``alpha``: the two differ only on a threshold
whose bound equals ``alpha`` exactly. When no threshold controls the risk (``1 / (n + 1) > alpha``), every label is
predicted and a warning says why.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_calibration._core.inputs import binary_labels, logits_and_labels, scores_kind
from hf_calibration._core.persistence import refuse_edited
from hf_calibration._core.tensors import as_tensor, logit
from hf_calibration.calibrators import Calibrator, NotFittedError, scores_fingerprint
from hf_calibration.conformal.agreement import FINGERPRINT_KEY
from hf_calibration.conformal.card import modality_values
from hf_calibration.conformal.predictor import SavedPredictor
from hf_calibration.conformal.quantile import check_alpha

__all__ = ["MultiLabelConformalPredictor", "crc_threshold", "false_negative_rate"]

logger = logging.getLogger(__name__)

KIND = "crc"

CARD_TEMPLATE = """---
{{ card_data }}
---

# Multi-label conformal prediction sets (conformal risk control)

Multi-label prediction sets for {{ model_kind }}, saved with the `hf_calibration` library. A set holds every label whose
{{ calibrated }}sigmoid probability exceeds **t = {{ threshold }}**, chosen by conformal risk control (Angelopoulos et
al. 2022) on {{ num_samples }} calibration {{ noun }}s so that, on average, a set misses at most **{{ alpha }}** of a
{{ noun }}'s true labels (false-negative rate).

| | |
|---|---|
| labels | {{ num_labels }} |
| false-negative rate controlled at | {{ alpha }} |
| calibration false-negative rate | {{ fnr }} |
| calibration mean set size | {{ set_size }} |

Saved in the model repo's `conformal/` folder, one call serves the sets (the task read from the model's config):

```python
{{ example_imports }}import hf_calibration

classifier = hf_calibration.pipeline(model="{{ model_repo | default("<model repo>", true) }}")
{{ example }}
rows = classifier(example, top_k=None)  # each label's row has "in_set"
```

The predictor alone, on the model's logits:

```python
from hf_calibration.conformal import load_conformal_predictor

predictor = load_conformal_predictor("<this repo>")
sets = predictor.predict_sets(logits)   # (N, L) boolean
```
"""


def false_negative_rate(sets: Any, labels: Any) -> float:
    """Mean over samples of the share of each sample's true labels (1 in ``labels``) missing from its set (``sets``,
    (N, L) boolean); a sample with no true label counts 0, -100 entries are not labels."""
    sets = np.asarray(sets.detach().cpu() if isinstance(sets, torch.Tensor) else sets, dtype=bool)
    labels = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    positive = labels == 1
    count = positive.sum(axis=1)
    missed = (positive & ~sets).sum(axis=1)
    return float(np.where(count > 0, missed / np.maximum(count, 1), 0.0).mean())


def _losses_at(probs: np.ndarray, positive: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """(N, T) false-negative rates of the sets ``{p > t}`` for each threshold."""
    count = np.maximum(positive.sum(axis=1), 1)
    out = np.empty((probs.shape[0], thresholds.size))
    for j, t in enumerate(thresholds):
        out[:, j] = (positive & (probs <= t)).sum(axis=1) / count
    return out


def crc_threshold(probs: np.ndarray, labels: np.ndarray, alpha: float, thresholds: Any = "exact") -> tuple[float, bool]:
    """``(t_hat, controlled)``: the conformal risk control threshold of the false-negative rate (module docstring) for
    (N, L) probabilities and 0/1 labels; ``controlled`` is False when no threshold meets ``alpha`` (``t_hat`` then
    predicts every label: -inf, or the grid's first value)."""
    n = probs.shape[0]
    positive = labels == 1
    budget = (alpha * (n + 1) - 1.0) / n  # mean loss allowed: n/(n+1) R + 1/(n+1) <= alpha
    if isinstance(thresholds, str):
        if budget < 0:
            return -math.inf, False
        count = positive.sum(axis=1)
        weights = np.where(count > 0, 1.0 / (n * np.maximum(count, 1)), 0.0)
        values = probs[positive]
        w = np.broadcast_to(weights[:, None], probs.shape)[positive]
        order = np.argsort(values, kind="stable")
        values, w = values[order], w[order]
        unique, start = np.unique(values, return_index=True)
        cumulative = np.cumsum(w)[np.r_[start[1:], values.size] - 1] if values.size else np.zeros(0)
        over = np.flatnonzero(cumulative > budget * (1 + 1e-12) + 1e-15)
        if over.size == 0:
            return 1.0, True  # even the empty set keeps the risk within alpha
        first = unique[over[0]]  # the loss jumps past the budget at t = first: keep every t below it
        return float(np.nextafter(first, -np.inf)), True
    grid = np.sort(np.asarray(thresholds, dtype=np.float64))
    risk = _losses_at(probs, positive, grid).mean(axis=0)
    bound = n / (n + 1) * risk + 1.0 / (n + 1)
    feasible = bound <= alpha
    if not feasible[0]:
        return float(grid[0]), False
    last = int(np.argmin(feasible)) - 1 if not feasible.all() else grid.size - 1  # before the first infeasible one
    return float(grid[last]), True


class MultiLabelConformalPredictor(
    SavedPredictor,
    library_name="hf_calibration",
    tags=["conformal-prediction", "conformal-risk-control", "hf_calibration", "multi-label"],  # and the model's task
    model_card_template=CARD_TEMPLATE,
):
    """Multi-label prediction sets whose expected false-negative rate is at most ``alpha`` (conformal risk control).

    Args:
        thresholds: ``"exact"`` (default: every threshold) or an array of candidate thresholds (MAPIE's grid is
            ``np.arange(0, 1, 0.01)``).

    Example::

        predictor = MultiLabelConformalPredictor().fit(val_logits, val_multi_hot, alpha=0.1, calibrator=platt)
        sets = predictor.predict_sets(test_logits)                         # (N, L) boolean
        predictor.evaluate(test_logits, test_multi_hot)                    # {"false_negative_rate", "mean_set_size"}
        predictor.save_pretrained("vit/conformal")
    """

    method = KIND
    checkpoint_kind = KIND

    def __init__(self, thresholds: Any = "exact") -> None:
        super().__init__()
        if isinstance(thresholds, str):
            if thresholds != "exact":
                raise ValueError(
                    f"Expected argument `thresholds` to be 'exact' or an array of thresholds, but got {thresholds!r}."
                )
        else:
            grid = np.asarray(thresholds, dtype=np.float64).reshape(-1)
            if grid.size == 0 or not np.isfinite(grid).all():
                raise ValueError("Expected argument `thresholds` to be a non-empty array of finite thresholds.")
            thresholds = grid.tolist()
        self.thresholds = thresholds
        self.register_buffer("threshold", torch.tensor(float("nan"), dtype=torch.float64))
        self.fit_info_: dict[str, Any] | None = None
        self.__dict__["calibrator_"] = None
        self.__dict__["_attached_to"] = None

    @property
    def randomized(self) -> bool:
        """False: a label is in the set when its probability exceeds the threshold; no draw is involved."""
        return False

    @property
    def calibrator(self) -> Calibrator | None:
        return self.__dict__["calibrator_"]

    @property
    def num_classes(self) -> int | None:
        """The number of labels (the name the pipeline adaptor reads)."""
        return (self.fit_info_ or {}).get("num_labels")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError("This MultiLabelConformalPredictor is not fitted yet: call fit(logits, labels) first.")

    def _probabilities(
        self, logits: Any, from_logits: bool | None, calibrator: Calibrator | None = None
    ) -> tuple[np.ndarray, bool]:
        """Per-label probabilities (after the calibrator) and whether the input held logits: an explicit ``from_logits``
        wins, then the kind the fit recorded (a row alone reads as in a batch), then detection (values all in [0, 1])."""
        calibrator = self.calibrator if calibrator is None else calibrator
        z = as_tensor(logits, "logits")
        if z.ndim != 2 or z.shape[0] == 0 or not z.is_floating_point():
            raise ValueError(
                f"Expected `logits` to be a non-empty floating (N, L) array, but got shape {tuple(z.shape)} and {z.dtype}."
            )
        if self.num_classes is not None and z.shape[1] != self.num_classes:
            raise ValueError(
                f"Expected `logits` to have L = {self.num_classes} labels (as fitted), but got {z.shape[1]}."
            )
        if not bool(torch.isfinite(z).all()):
            raise ValueError("Expected `logits` to be finite, but they contain NaN or inf.")
        is_logits = scores_kind(
            z, from_logits, task="multilabel", recorded=(self.fit_info_ or {}).get("input"), name="logits"
        )
        if (
            not is_logits and calibrator is None
        ):  # probabilities as given: exact (a logit round trip moves ties by an ulp)
            return z.double().numpy(), is_logits
        z = z.double() if is_logits else logit(z.double())
        if calibrator is not None:
            z = calibrator(z, from_logits=True).double()
        return torch.sigmoid(z).numpy(), is_logits

    def fit(
        self,
        logits: Any,
        labels: Any = None,
        *,
        alpha: float = 0.1,
        calibrator: Calibrator | None = None,
        from_logits: bool | None = None,
    ) -> MultiLabelConformalPredictor:
        """Choose the threshold on held-out (N, L) logits (or probabilities) and 0/1 labels (never the test split).

        Args:
            alpha: the false-negative rate to control, in (0, 1); it needs ``n >= 1/alpha - 1`` calibration samples.
            calibrator: a fitted sigmoid calibrator (``PlattScaling``, ...) applied first and saved with the predictor;
                the guarantee holds whatever it is, as long as it was not fitted on these samples.
            from_logits: None detects probabilities (every value in [0, 1]).
        """
        alpha = check_alpha(alpha)
        logits, labels = logits_and_labels(logits, labels)
        if calibrator is not None:
            if not isinstance(calibrator, Calibrator) or not getattr(calibrator, "_sigmoid_head", False):
                raise TypeError(
                    f"Expected argument `calibrator` to be a fitted sigmoid calibrator (task 'multilabel'), but got "
                    f"{type(calibrator).__name__}: a softmax calibrator does not apply to a multi-label head."
                )
            if not calibrator.is_fitted:
                raise ValueError(
                    "Expected argument `calibrator` to be fitted (on other data than the conformal calibration set)."
                )
        y = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
        if y.ndim != 2:
            raise ValueError(
                f"Expected `labels` to have shape (N, L) of 0/1 labels (multi-hot), but got shape {y.shape}: a "
                "multi-class head's sets are ConformalPredictor's."
            )
        y = binary_labels(y, ignore_index=None, name="labels")[0]
        self.fit_info_ = None
        probs, is_logits = self._probabilities(logits, from_logits, calibrator)
        if probs.shape != y.shape:
            raise ValueError(
                f"Expected `logits` and `labels` of one shape (N, L), but got {probs.shape} and {y.shape}."
            )
        grid = self.thresholds if isinstance(self.thresholds, str) else np.asarray(self.thresholds)
        threshold, controlled = crc_threshold(probs, y, alpha, grid)
        n = probs.shape[0]
        if not controlled:
            warnings.warn(
                f"Conformal risk control cannot bring the false-negative rate within alpha = {alpha} with n = {n} "
                f"calibration samples (the bound's 1/(n + 1) = {1 / (n + 1):.4g} alone exceeds it, or every "
                "threshold does): every label is predicted. Use more samples or a larger alpha.",
                UserWarning,
                stacklevel=2,
            )
        self.threshold.fill_(threshold)
        self.__dict__["calibrator_"] = calibrator
        sets = probs > threshold
        self.fit_info_ = {
            "method": KIND,
            "alpha": alpha,
            "num_samples": int(n),
            "num_labels": int(probs.shape[1]),
            "threshold": threshold,
            "controlled": controlled,
            "input": "logits" if is_logits else "probabilities",
            "false_negative_rate": false_negative_rate(sets, y),
            "mean_set_size": float(sets.sum(axis=1).mean()),
            "no_label_samples": int((y.sum(axis=1) == 0).sum()),
            "calibrator": None if calibrator is None else {"kind": calibrator.kind},
            FINGERPRINT_KEY: scores_fingerprint(calibrator),  # the scores the sets were fitted on (None: the model's)
        }
        return self

    def predict_sets(self, logits: Any, *, from_logits: bool | None = None):
        """(N, L) boolean sets ``{l : p_l > t_hat}``: numpy for numpy input, a CPU torch tensor for torch input."""
        self._check_fitted()
        sets = self._probabilities(logits, from_logits)[0] > float(self.threshold)
        return torch.from_numpy(sets) if isinstance(logits, torch.Tensor) else sets

    def forward(self, logits: Any, from_logits: bool | None = None):
        return self.predict_sets(logits, from_logits=from_logits)

    def evaluate(self, logits: Any, labels: Any, *, from_logits: bool | None = None) -> dict[str, float]:
        """``{"false_negative_rate", "mean_set_size"}`` of the sets on held-out logits and 0/1 labels."""
        sets = self.predict_sets(
            np.asarray(logits.detach().cpu() if isinstance(logits, torch.Tensor) else logits), from_logits=from_logits
        )
        return {
            "false_negative_rate": false_negative_rate(sets, labels),
            "mean_set_size": float(sets.sum(axis=1).mean()),
        }

    def attach(self, pipe: Any, *, draws: str = "input") -> Any:
        """Make a multi-label image-classification pipeline's rows carry ``"in_set"`` (see
        ``ConformalPredictor.attach``). The sets are deterministic: ``draws`` is accepted for one call signature across
        predictors and changes nothing."""
        from hf_calibration.conformal.pipeline import attach

        return attach(self, pipe, draws=draws)

    def detach(self) -> Any:
        from hf_calibration.conformal.pipeline import detach

        return detach(self)

    def extra_repr(self) -> str:
        info = self.fit_info_
        return f"alpha={info['alpha']}, threshold={info['threshold']:.6g}" if info else "not fitted"

    # ------------------------------------------------------------------ Hub (save / load: _core/persistence.py)
    @classmethod
    def _own_kinds(cls) -> str:
        return KIND

    def _card_values(self, values: dict[str, Any]) -> dict[str, Any]:
        info = self.fit_info_ or {}
        return {
            "threshold": f"{info.get('threshold', float('nan')):.6g}",
            "alpha": info.get("alpha"),
            "num_samples": info.get("num_samples"),
            "num_labels": info.get("num_labels"),
            "fnr": f"{info.get('false_negative_rate', float('nan')):.4f}",
            "set_size": f"{info.get('mean_set_size', float('nan')):.3f}",
            "calibrated": "calibrated " if info.get("calibrator") else "",
            **modality_values(values.get("pipeline_task")),
            **values,
        }

    @classmethod
    def _check_config(cls, config: dict, where) -> None:
        super()._check_config(config, where)
        fit = config["fit"]
        if not isinstance(fit.get("num_labels"), int) or fit["num_labels"] < 1:
            raise ValueError(f"The checkpoint in {str(where)!r} has no valid `fit` record in its config.")

    def _check_loaded(self, path: str) -> None:
        if math.isnan(float(self.threshold)):  # -inf is a threshold: no threshold controlled the risk, every label kept
            raise ValueError(f"The conformal predictor weights {path!r} are corrupted: threshold holds NaN.")
        if float(self.fit_info_.get("threshold", float("nan"))) != float(self.threshold):
            refuse_edited(
                str(Path(path).parent),
                "conformal predictor",
                f"fit.threshold is {self.fit_info_.get('threshold')!r}, the weights hold {float(self.threshold)!r}",
            )
