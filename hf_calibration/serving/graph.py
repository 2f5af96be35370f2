"""One traceable module for a calibrated classifier: pixel values in; calibrated logits, probabilities and the set out.

``CalibratedClassifier(model, calibrator, predictor)`` is what ``export_onnx`` exports (and what ``torch.export`` /
``torch.compile`` can take as it is). Its forward computes, with tensor operations only:

* ``logits``: the model's logits through ``calibrator.graph_forward`` (the model's own logits without a calibrator);
* ``probabilities``: their softmax in the logits' dtype (float32 for a float32 model), what
  ``hf_calibration.pipeline`` reports as scores;
* ``prediction_set`` (with a conformal predictor): the (N, K) boolean mask ``ConformalPredictor.predict_sets`` gives
  for the model's own logits: through the predictor's calibrator (if it has one), float64 softmax, the method's
  scores, ``<= q_hat``, an empty set given its most probable class unless ``allow_empty``. Randomised APS / RAPS
  scores take one Uniform(0, 1) draw per image as a second input, ``u`` (float64, (N,)): the caller owns the
  randomness (``ConformalPredictor.draw_uniforms`` repeats the predictor's own stream).

Probabilities come from the head's kind (``HEADS``): a softmax over classes for single-label classifiers. Sigmoid heads
(binary with one logit, multi-label) fit here as one more entry: an independent sigmoid per logit, chosen from the
calibrator's recorded task or ``config.problem_type``; they are not implemented yet, and such a model is refused by
name.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..calibrators._base import Calibrator
from ..calibrators.attach import uncalibrated_forward
from ..conformal.scores import conformity_scores_graph, sets_from_scores_graph

__all__ = ["CalibratedClassifier", "HEADS", "head_kind"]

# head kind -> (logits -> probabilities). The one place a sigmoid head (binary one-logit, multi-label) is added:
# "multi_label_classification": torch.sigmoid, and conformal sets per label (a threshold per label) beside it.
HEADS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "single_label_classification": lambda logits: torch.softmax(logits, dim=1),
}


def head_kind(model: nn.Module, calibrator: Calibrator | None = None) -> str:
    """The head's kind: the calibrator's recorded task if it has one, else ``config.problem_type``, else single-label
    (transformers' default for integer labels); a kind without an entry in ``HEADS`` is a ``ValueError``."""
    task = ((calibrator.fit_info_ or {}).get("task") if calibrator is not None else None) or getattr(
        getattr(model, "config", None), "problem_type", None) or "single_label_classification"
    aliases = {"multiclass": "single_label_classification", "single_label": "single_label_classification"}
    task = aliases.get(task, task)
    if task not in HEADS:
        raise ValueError(f"Expected a single-label (softmax) classifier, but its head is {task!r}: serving graphs for "
                         f"that kind of head are not implemented (supported: {sorted(HEADS)}).")
    return task


def model_logits(output: Any) -> torch.Tensor:
    """The (N, K) logits of a model's output: a ``ModelOutput`` / dict with ``logits``, a tuple, or a tensor (timm)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, dict) else None
    if logits is None and isinstance(output, tuple):
        logits = next((t for t in output if isinstance(t, torch.Tensor) and t.ndim == 2 and t.is_floating_point()), None)
    if logits is None:
        raise ValueError("The model's output holds no (N, K) logits.")
    return logits


class CalibratedClassifier(nn.Module):
    """``pixel_values (N, C, H, W) [, u (N,)] -> (logits, probabilities[, prediction_set])``: see the module docstring.

    Args:
        model: an image classifier (transformers, ``TimmWrapper``, or a timm / torch module returning logits). A
            calibrator attached to it (``Calibrator.attach``) is bypassed (forward hooks on the model too): pass it as
            ``calibrator``.
        calibrator: a fitted calibrator for the scores (None: the model's own logits).
        predictor: a fitted ``ConformalPredictor`` for the prediction sets (None: no set output).
    """

    def __init__(self, model: nn.Module, calibrator: Calibrator | None = None, predictor: Any = None):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected argument `model` to be a torch.nn.Module, but got {type(model).__name__}.")
        if calibrator is not None:
            if not isinstance(calibrator, Calibrator):
                raise TypeError(f"Expected argument `calibrator` to be an hf_calibration Calibrator or None, but got {type(calibrator).__name__}.")
            calibrator._check_fitted()
        if predictor is not None:
            from ..conformal import ConformalPredictor

            if not isinstance(predictor, ConformalPredictor):
                raise TypeError(f"Expected argument `predictor` to be a ConformalPredictor or None, but got {type(predictor).__name__}.")
            predictor._check_fitted()
        self.task = head_kind(model, calibrator)
        self.model, self.calibrator, self.predictor = model, calibrator, predictor
        self.set_calibrator = None if predictor is None else predictor.calibrator
        if predictor is not None:
            info = predictor.fit_info_
            self.method, self.allow_empty, self.randomized = predictor.method, predictor.allow_empty, predictor.randomized
            self.k_reg, self.penalty = int(info.get("k_reg") or 0), float(info.get("penalty") or 0.0)
            self.register_buffer("q_hat", predictor.q_hat.detach().clone().double(), persistent=False)

    @property
    def output_names(self) -> list[str]:
        return ["logits", "probabilities"] + (["prediction_set"] if self.predictor is not None else [])

    @property
    def input_names(self) -> list[str]:
        return ["pixel_values"] + (["u"] if self.predictor is not None and self.randomized else [])

    def forward(self, pixel_values: torch.Tensor, u: torch.Tensor | None = None):
        logits = model_logits(uncalibrated_forward(self.model)(pixel_values))  # without an attached calibrator
        calibrated = logits if self.calibrator is None else self.calibrator.graph_forward(logits)
        probabilities = HEADS[self.task](calibrated)
        if self.predictor is None:
            return calibrated, probabilities
        z = logits if self.set_calibrator is None else self.set_calibrator.graph_forward(logits)
        set_probabilities = torch.softmax(z.double(), dim=1)  # as ConformalPredictor, float64 (cast first: an ONNX Softmax of the cast)
        if self.randomized and u is None:
            raise ValueError("Expected argument `u` (one Uniform(0, 1) draw per image, float64) for randomised APS / RAPS sets.")
        scores = conformity_scores_graph(set_probabilities, self.method, u if self.randomized else None,
                                   k_reg=self.k_reg, penalty=self.penalty)
        return calibrated, probabilities, sets_from_scores_graph(scores, self.q_hat, allow_empty=self.allow_empty)
