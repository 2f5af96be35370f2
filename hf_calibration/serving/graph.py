"""One traceable module for a calibrated classifier: pixel values in; calibrated logits, probabilities and the set out.

``CalibratedClassifier(model, calibrator, predictor)`` is what ``export_onnx`` exports (and what ``torch.export`` /
``torch.compile`` can take as it is). Its forward computes, with tensor operations only:

* ``logits``: the model's logits through ``calibrator.graph_forward`` (the model's own logits without a calibrator);
* ``probabilities``: their softmax (sigmoid heads: sigmoid) in the logits' dtype (float32 for a float32 model), what
  ``hf_calibration.pipeline`` reports as scores;
* ``prediction_set`` (with a conformal predictor): the (N, K) boolean mask ``ConformalPredictor.predict_sets`` gives
  for the model's own logits: through the predictor's calibrator (if it has one), float64 softmax, the method's
  scores, ``<= q_hat``, an empty set given its most probable class unless ``allow_empty``. Randomised APS / RAPS
  scores take one Uniform(0, 1) draw per image as a second input, ``u`` (float64, (N,)): the caller owns the
  randomness (``ConformalPredictor.draw_uniforms`` repeats the predictor's own stream).

Probabilities come from the head's kind (``HEADS``, by :mod:`hf_calibration._core.tasks`' rule: the calibrator's recorded
task, else ``config.problem_type``): a softmax over classes for single-label classifiers; an independent sigmoid per
logit for multi-label heads and one-logit binary heads (what ``hf_calibration.pipeline`` passes as
``function_to_apply``), a softmax over a binary head's two softmax logits. Prediction sets of sigmoid heads: a
multi-label head's ``MultiLabelConformalPredictor`` gives ``sigmoid(z) > threshold`` per label (in float64, through
its calibrator), (N, L); a one-logit binary head's ``ConformalPredictor`` (fitted on that logit) reads it as the two
softmax logits ``[0, z]``, as ``predict_sets`` does, and gives the sets of the classes {0, 1}, (N, 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hf_calibration._core.inputs import model_logits
from hf_calibration.calibrators import Calibrator
from hf_calibration.calibrators.attach import uncalibrated_forward
from hf_calibration.conformal.scores import conformity_scores_graph, sets_from_scores_graph

__all__ = ["CalibratedClassifier", "HEADS", "head_kind"]


def _binary(logits: torch.Tensor) -> torch.Tensor:
    """A binary head's probabilities: the sigmoid of one logit ((N,) or (N, 1)), the softmax of two softmax logits."""
    return torch.softmax(logits, dim=1) if logits.ndim == 2 and logits.shape[1] == 2 else torch.sigmoid(logits)


# head kind -> (logits -> probabilities)
HEADS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "single_label_classification": lambda logits: torch.softmax(logits, dim=1),
    "multi_label_classification": torch.sigmoid,
    "binary": _binary,
}
_KIND_OF_TASK = {
    "multiclass": "single_label_classification",
    "multilabel": "multi_label_classification",
    "binary": "binary",
}


def head_kind(model: nn.Module, calibrator: Calibrator | None = None) -> str:
    """The head's kind, a key of ``HEADS``: the calibrator's recorded task if it has one, else the model's
    (``config.problem_type`` and ``num_labels``, :func:`hf_calibration._core.tasks.task_of_model`), else single-label
    (transformers' default for integer labels). A calibrator fitted for another kind of head than the model's is a
    ``ValueError`` naming ``problem_type`` (:func:`hf_calibration._core.tasks.compatible_head`)."""
    from hf_calibration._core.tasks import compatible_head, task_of_model

    info = (calibrator.fit_info_ or {}) if calibrator is not None else {}
    if calibrator is not None:
        compatible_head(info.get("task", "multiclass"), model, num_labels=info.get("num_labels"))
    task = info.get("task") or task_of_model(model) or "multiclass"
    if task == "binary" and task_of_model(model) == "multiclass":  # a two-logit softmax head with a binary calibrator
        return "binary"
    return _KIND_OF_TASK[task]


def _sigmoid_model(model: nn.Module, kind: str) -> bool:
    """Whether the head's scores are sigmoids (multi-label, or binary with one logit), not a softmax over classes."""
    from hf_calibration._core.tasks import task_of_model

    return kind == "multi_label_classification" or (kind == "binary" and task_of_model(model) != "multiclass")


def _set_kind(model: nn.Module, task: str, predictor: Any) -> str:
    """Which sets the graph computes for ``predictor`` on this head: ``"softmax"`` (a ``ConformalPredictor`` of the
    model's K classes), ``"one_logit"`` (a ``ConformalPredictor`` of a one-logit binary head's two classes) or
    ``"multilabel"`` (a ``MultiLabelConformalPredictor`` of a multi-label head's L labels); else a ``ValueError``
    naming the mismatch."""
    from hf_calibration.conformal import ConformalPredictor, MultiLabelConformalPredictor

    if not isinstance(predictor, (ConformalPredictor, MultiLabelConformalPredictor)):
        raise TypeError(
            "Expected argument `predictor` to be a ConformalPredictor, a MultiLabelConformalPredictor or None, but got "
            f"{type(predictor).__name__}."
        )
    predictor._check_fitted()
    config = getattr(model, "config", None)
    num_labels = getattr(config, "num_labels", None)
    head = f"config.problem_type={getattr(config, 'problem_type', None)!r}, head {task!r}"
    if isinstance(predictor, MultiLabelConformalPredictor):
        if task != "multi_label_classification":
            raise ValueError(
                f"Expected a multi-label head for a MultiLabelConformalPredictor, but the model has {head}: use "
                "ConformalPredictor for a single-label head's sets."
            )
        kind = "multilabel"
    elif _sigmoid_model(model, task):
        if task != "binary" or predictor.num_classes != 2:
            raise ValueError(
                f"Expected a single-label head for a ConformalPredictor, but the model has {head}: a multi-label head's "
                "sets are MultiLabelConformalPredictor's."
            )
        return "one_logit"
    else:
        kind = "softmax"
    if isinstance(num_labels, int) and predictor.num_classes != num_labels:
        raise ValueError(
            f"Expected a predictor fitted on the model's {num_labels} classes, but it was fitted on "
            f"{predictor.num_classes}: it belongs to another model."
        )
    return kind


class CalibratedClassifier(nn.Module):
    """``pixel_values (N, C, H, W) [, u (N,)] -> (logits, probabilities[, prediction_set])``: see the module docstring.

    Args:
        model: an image classifier (transformers, ``TimmWrapper``, or a timm / torch module returning logits). A
            calibrator attached to it (``Calibrator.attach``) is bypassed (forward hooks on the model too): pass it as
            ``calibrator``.
        calibrator: a fitted calibrator for the scores (None: the model's own logits).
        predictor: a fitted ``ConformalPredictor`` (a ``MultiLabelConformalPredictor`` for a multi-label head) for the
            prediction sets (None: no set output).
    """

    def __init__(self, model: nn.Module, calibrator: Calibrator | None = None, predictor: Any = None):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"Expected argument `model` to be a torch.nn.Module, but got {type(model).__name__}.")
        if calibrator is not None:
            if not isinstance(calibrator, Calibrator):
                raise TypeError(
                    f"Expected argument `calibrator` to be an hf_calibration Calibrator or None, but got {type(calibrator).__name__}."
                )
            calibrator._check_fitted()
        self.task = head_kind(model, calibrator)
        self.set_kind = None if predictor is None else _set_kind(model, self.task, predictor)
        self.model, self.calibrator, self.predictor = model, calibrator, predictor
        self.set_calibrator = None if predictor is None else predictor.calibrator
        if self.set_kind == "multilabel":
            self.randomized = False
            self.register_buffer("threshold", predictor.threshold.detach().clone().double(), persistent=False)
        elif predictor is not None:
            info = predictor.fit_info_
            self.method, self.allow_empty, self.randomized = (
                predictor.method,
                predictor.allow_empty,
                predictor.randomized,
            )
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
        if self.set_kind == "multilabel":  # as MultiLabelConformalPredictor.predict_sets: float64, strictly above
            z = logits.double() if self.set_calibrator is None else self.set_calibrator.graph_forward(logits.double())
            return calibrated, probabilities, torch.sigmoid(z.double()) > self.threshold
        if self.set_kind == "one_logit":  # a binary head's one logit as the two softmax logits [0, z]
            logits = torch.cat([torch.zeros_like(logits), logits.reshape(logits.shape[0], 1)], dim=1)
        z = logits if self.set_calibrator is None else self.set_calibrator.graph_forward(logits)
        set_probabilities = torch.softmax(
            z.double(), dim=1
        )  # as ConformalPredictor, float64 (cast first: an ONNX Softmax of the cast)
        if self.randomized and u is None:
            raise ValueError(
                "Expected argument `u` (one Uniform(0, 1) draw per image, float64) for randomised APS / RAPS sets."
            )
        scores = conformity_scores_graph(
            set_probabilities, self.method, u if self.randomized else None, k_reg=self.k_reg, penalty=self.penalty
        )
        sets = sets_from_scores_graph(scores, self.q_hat, allow_empty=self.allow_empty, probs=set_probabilities)
        return calibrated, probabilities, sets
