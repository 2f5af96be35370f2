"""The base of every calibrator for a sigmoid head (binary or multi-label): logits in, logits out, one map per label.

A sigmoid head scores each label ``l`` by ``p_l = sigmoid(z_l)``. A sigmoid calibrator maps each label's logit to a
calibrated logit, ``z_l -> g_l(z_l)``, so that ``sigmoid(g_l(z_l))`` is the calibrated probability and a model with the
calibrator attached still returns logits (pipelines, ``attach``, export). The subclasses implement
``_calibrate_logits`` with plain torch operations on an ``(N, L)`` tensor, and ``_fit_labels`` on float64 numpy arrays.

What the inputs may be (``_layout``):

* binary, one logit: ``(N,)`` or ``(N, 1)`` logits (or probabilities), labels ``(N,)`` in {0, 1};
* binary, two softmax logits: ``(N, 2)`` logits of a softmax head (or probability rows), labels ``(N,)``; the map sees
  the log-odds ``z_1 - z_0`` and returns ``[-g/2, g/2]``, whose softmax is ``[1 - sigmoid(g), sigmoid(g)]``: a model
  of either spelling gets the same calibrated probabilities;
* multi-label: ``(N, L)`` logits with ``(N, L)`` labels in {0, 1}.

Labels equal to -100 are left out of the fit, element by element. ``from_logits=None`` detects probabilities as the
metrics do (every value in [0, 1]; two-column binary input: rows summing to 1), and works on their logits.

A calibrator records its task (``fit_info_["task"]``: ``"binary"`` or ``"multilabel"``) and its number of labels, and
refuses, at attach and at load, a model whose head is of another kind (``hf_calibration._core.tasks.compatible_head``); a
softmax calibrator refuses a sigmoid head the same way.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np
import torch

from hf_calibration._core import tensors as _inputs
from hf_calibration._core.checks import check_bool, check_choice
from hf_calibration._core.inputs import binary_labels, scores_kind
from hf_calibration._core.tasks import SIGMOID_TASKS, check_shapes_for_task
from hf_calibration._core.tensors import logit
from hf_calibration.calibrators._machinery.base import Calibrator, _labels_of

logger = logging.getLogger(__name__)

LAYOUTS = ("vector", "column", "softmax2", "multilabel")  # (N,), (N, 1), two softmax logits, (N, L)
_LOGIT_CLAMP = {torch.float32: 80.0, torch.float64: 700.0}  # |logit| beyond this: sigmoid is 0 or 1 in the dtype


def _layout_of(shape: tuple[int, ...], task: str, name: str = "logits") -> str:
    if task == "binary":
        if len(shape) == 1:
            return "vector"
        if len(shape) == 2 and shape[1] == 1:
            return "column"
        if len(shape) == 2 and shape[1] == 2:
            return "softmax2"
        raise ValueError(
            f"Expected `{name}` to have shape (N,), (N, 1) or (N, 2) (two softmax logits) for a binary head, but "
            f"got shape {shape}."
        )
    if len(shape) != 2:
        raise ValueError(f"Expected `{name}` to have shape (N, L) for a multi-label head, but got shape {shape}.")
    return "multilabel"


def to_label_logits(
    z: torch.Tensor, layout: str, is_logits: bool, cdtype: torch.dtype, name: str = "logits"
) -> torch.Tensor:
    """The ``(N, L)`` per-label logits (compute dtype) the map sees, from checked input of ``layout``."""
    if layout == "softmax2":
        if is_logits:
            zc = z.to(cdtype)
            return (zc[:, 1] - zc[:, 0])[:, None]
        lp = _inputs.log_probabilities(z, cdtype, name)
        return (lp[:, 1] - lp[:, 0])[:, None]
    zc = z.to(cdtype).reshape(z.shape[0], -1)
    if is_logits:
        return zc
    low, high = float(zc.min()), float(zc.max())
    if low < 0 or high > 1:
        raise ValueError(
            f"Expected `{name}` to hold probabilities in [0, 1] (from_logits=False), but found values in "
            f"[{low:.4g}, {high:.4g}]."
        )
    return logit(zc)


def from_label_logits(g: torch.Tensor, layout: str) -> torch.Tensor:
    """Calibrated ``(N, L)`` logits back in the input's layout (two softmax logits: ``[-g/2, g/2]``)."""
    if layout == "vector":
        return g[:, 0]
    if layout == "softmax2":
        half = g[:, 0] / 2
        return torch.stack([-half, half], dim=1)
    return g


def detect_from_logits(
    z: torch.Tensor, layout: str, from_logits: bool | None, name: str = "logits", *, recorded: str | None = None
) -> bool:
    """Whether sigmoid-head input holds logits (:func:`hf_calibration._core.inputs.scores_kind`): an explicit bool wins,
    then the kind a fit ``recorded``; None without one takes values all in [0, 1] for probabilities (two softmax
    columns: rows summing to 1, the multi-class rule)."""
    # two softmax logits follow the softmax rule (rows summing to 1); one column or L labels the sigmoid rule ([0, 1])
    return scores_kind(
        z, from_logits, task="multiclass" if layout == "softmax2" else "multilabel", recorded=recorded, name=name
    )


class SigmoidCalibrator(Calibrator):
    """A calibrator of a sigmoid head: ``fit``, ``forward`` (logits in, logits out, same shape), ``predict_proba`` (the
    calibrated probabilities), ``attach`` / ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` as every
    calibrator. Subclasses set ``kind`` and implement ``_allocate(L)``, ``_fit_labels(z, y, mask)`` and
    ``_calibrate_logits(z)``.

    Args:
        num_labels: L; None until the fit sets it (a loaded checkpoint passes it). A binary head has one label.
        task: ``"binary"`` or ``"multilabel"``; None until the fit reads it from the data (or from ``fit(task=...)``).
    """

    kind: ClassVar[str] = ""
    min_samples: ClassVar[int] = 10
    default_objective: ClassVar[str] = "nll"
    objectives: ClassVar[tuple[str, ...]] = ("nll",)
    preserves_argmax: ClassVar[bool] = False  # a per-label map may move a logit across 0 (the 0.5 threshold)
    shift_invariant: ClassVar[bool] = True  # logits are not shifted: each label's logit is its own log-odds
    _sigmoid_head: ClassVar[bool] = True  # checkpoints record task 'binary' / 'multilabel' (Calibrator._check_config)

    def __init__(self, num_labels: int | None = None, task: str | None = None):
        super().__init__()
        from hf_calibration._core.checks import check_int

        self.num_labels = None if num_labels is None else check_int(num_labels, "num_labels", minimum=1)
        self.task = None if task is None else check_choice(task, "task", SIGMOID_TASKS)
        self._allocate(self.num_labels or 1)

    # ------------------------------------------------------------------ subclass hooks
    def _allocate(self, num_labels: int) -> None:
        """Create the parameters / buffers for ``num_labels`` labels at the identity map."""
        raise NotImplementedError

    def _fit_labels(self, z: np.ndarray, y: np.ndarray, mask: np.ndarray, progress_bar: bool) -> dict[str, Any]:
        """Fit on float64 ``(N, L)`` logits ``z``, 0/1 labels ``y`` and the kept-element ``mask``; returns fit_info entries."""
        raise NotImplementedError

    def _calibrate_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated ``(N, L)`` logits of ``(N, L)`` logits (float32 / float64, any device): plain torch, no grad needed."""
        raise NotImplementedError

    # ------------------------------------------------------------------ sizing
    def _resize(self, num_labels: int, task: str) -> None:
        if self.num_labels is not None and self.num_labels != num_labels:
            logger.info(
                "%s was built for %d labels; refitting it for %d.", type(self).__name__, self.num_labels, num_labels
            )
        self.num_labels, self.task = num_labels, task
        self._allocate(num_labels)
        if isinstance(self._hub_mixin_config, dict):
            self._hub_mixin_config["num_labels"] = num_labels
            self._hub_mixin_config["task"] = task

    # ------------------------------------------------------------------ inputs
    def _resolve_fit_task(self, logits: Any, labels: Any, task: str | None) -> str:
        shape_z, shape_y = (
            tuple(getattr(logits, "shape", np.shape(logits))),
            tuple(getattr(labels, "shape", np.shape(labels))),
        )
        if task is not None:
            task = check_choice(task, "task", SIGMOID_TASKS)
        elif len(shape_y) == 2 and shape_y[1] > 1:
            task = "multilabel"
        elif len(shape_z) == 1 or (len(shape_z) == 2 and shape_z[1] in (1, 2)):
            task = "binary"
        else:
            raise ValueError(
                f"Expected binary or multi-label data for {type(self).__name__} (a sigmoid calibrator): (N, L) 0/1 labels, or one "
                f"logit per sample (or two softmax logits) with (N,) 0/1 labels; but got logits of shape {shape_z} and labels of "
                f"shape {shape_y}, a multi-class (softmax) problem. A softmax head (config.problem_type="
                "'single_label_classification') takes a softmax calibrator (temperature_scaling, ...)."
            )
        check_shapes_for_task(task, logits, labels)
        return task

    def _sigmoid_fit_inputs(self, logits: Any, labels: Any, from_logits: bool | None, task: str | None):
        """``(z (N, L) float64 numpy, y (N, L) float64, mask (N, L) bool, task, layout, is_logits)``: the fit's inputs read
        once (:func:`hf_calibration._core.inputs.read_inputs`); ignored samples of a binary head are kept, masked."""
        logits, labels = _labels_of(logits, labels)
        task = self._resolve_fit_task(logits, labels, task)
        z = self._check_sigmoid_logits(logits)
        layout = _layout_of(tuple(z.shape), task)
        y = np.asarray(labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else labels)
        if task == "binary":
            y = y.reshape(-1)
        if y.shape[0] != z.shape[0]:
            raise ValueError(
                f"Expected `logits` and `labels` to have the same number of samples, but got {z.shape[0]} and {y.shape[0]}."
            )
        y, mask = binary_labels(y, name="labels")
        y = y.reshape(z.shape[0], -1)
        mask = mask.reshape(z.shape[0], -1)
        # the kept entries decide the kind (read_inputs' rule): an ignored entry may hold anything finite
        kept = torch.from_numpy(mask)
        kept_z = z[kept[:, 0]] if layout == "softmax2" else z.reshape(z.shape[0], -1)[kept]
        is_logits = detect_from_logits(kept_z, layout, from_logits)
        if not is_logits and not mask.all():  # ignored entries of probabilities: any probability, masked in the fit
            z = torch.where(kept if z.ndim == 2 else kept[:, 0], z, torch.tensor(0.5, dtype=z.dtype))
        zl = to_label_logits(z, layout, is_logits, torch.float64).numpy()
        if zl.shape != y.shape:
            raise ValueError(
                f"Expected `labels` to have shape {(zl.shape[0], zl.shape[1])} (one 0/1 label per logit), but got "
                f"{tuple(np.shape(labels))}."
            )
        return np.ascontiguousarray(zl), y, mask, task, layout, is_logits

    def _check_sigmoid_logits(self, logits: Any) -> torch.Tensor:
        z = _inputs.as_tensor(logits, "logits")
        if not z.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating tensor, but got {z.dtype}.")
        if z.ndim not in (1, 2) or z.shape[0] == 0:
            raise ValueError(
                f"Expected `logits` to have shape (N,) or (N, L) with N >= 1, but got shape {tuple(z.shape)}."
            )
        if not bool(torch.isfinite(z).all()):
            bad = ~torch.isfinite(z.reshape(z.shape[0], -1)).all(dim=1)
            raise ValueError(f"Expected `logits` to be finite, but row {int(bad.nonzero()[0])} contains NaN or inf.")
        return z

    def _layout_for_call(self, z: torch.Tensor) -> str:
        """The layout of a forward input: as fitted (binary: any of the three; multi-label: (N, L) with the fitted L)."""
        task = self.task or (self.fit_info_ or {}).get("task")
        layout = _layout_of(tuple(z.shape), task)
        if task == "multilabel" and z.shape[1] != self.num_labels:
            raise ValueError(
                f"Expected `logits` to have L = {self.num_labels} labels (one map per label, as fitted), but got "
                f"{z.shape[1]}."
            )
        return layout

    # ------------------------------------------------------------------ public API
    def fit(
        self,
        logits: Any,
        labels: Any = None,
        *,
        objective: str | None = None,
        from_logits: bool | None = None,
        progress_bar: bool = True,
        task: str | None = None,
        **objective_options: Any,
    ) -> SigmoidCalibrator:
        """Fit on held-out logits (or probabilities) and 0/1 labels; returns ``self``.

        Args:
            logits: ``(N,)`` / ``(N, 1)`` / ``(N, 2)`` (binary) or ``(N, L)`` (multi-label) logits or probabilities, torch
                or numpy, or a transformers ``PredictionOutput`` (then ``labels`` may be omitted).
            labels: ``(N,)`` 0/1 (binary) or ``(N, L)`` multi-hot labels; -100 leaves an element out.
            objective: ``"nll"`` (the binary cross-entropy), where the method has an objective.
            from_logits: None detects probabilities (module docstring); True / False says which.
            task: ``"binary"`` or ``"multilabel"``; None reads it from the shapes (two-column labels or more: multi-label).
        """
        if objective_options:
            raise TypeError(f"Unexpected keyword argument(s) for fit: {sorted(objective_options)}.")
        objective = self._check_objective(objective)
        check_bool(progress_bar, "progress_bar")
        z, y, mask, task, layout, is_logits = self._sigmoid_fit_inputs(logits, labels, from_logits, task)
        return self._fit_sigmoid(z, y, mask, task, layout, is_logits, objective, progress_bar)

    def _check_objective(self, objective: str | None) -> str:
        objective = self.default_objective if objective is None else objective
        if objective not in self.objectives:
            raise ValueError(
                f"Expected argument `objective` to be one of {list(self.objectives)} for {type(self).__name__}, but "
                f"got {objective!r}."
            )
        return objective

    def _fit_sigmoid(
        self,
        z: np.ndarray,
        y: np.ndarray,
        mask: np.ndarray,
        task: str,
        layout: str,
        is_logits: bool,
        objective: str,
        progress_bar: bool,
        *,
        report: bool = True,
    ) -> SigmoidCalibrator:
        kept = mask.sum(axis=0)
        if int(kept.min()) < self.min_samples:
            label = int(np.argmin(kept))
            raise ValueError(
                f"Expected at least {self.min_samples} labelled samples per label to fit {type(self).__name__}, but "
                f"label {label} has {int(kept[label])}."
            )
        was_attached = self._attached_to
        self.fit_info_ = None
        self._resize(z.shape[1], task)
        info = self._fit_labels(z, y, mask, progress_bar)
        self.fit_info_ = {
            "task": task,
            "head": "softmax2" if layout == "softmax2" else "sigmoid",
            "objective": objective,
            "input": "logits" if is_logits else "probabilities",
            "num_samples": int(z.shape[0]),
            "num_labels": int(z.shape[1]),
            **info,
        }
        if report:
            self.fit_info_.update(self._sigmoid_fit_report(z, y, mask))
        if was_attached is not None:
            logger.info("Refitted while attached: the model now uses the new fit.")
        return self

    def _sigmoid_fit_report(self, z: np.ndarray, y: np.ndarray, mask: np.ndarray) -> dict[str, float]:
        """Macro ECE (15 bins) and NLL on the fit set before and after."""
        from hf_calibration.metrics.multilabel import _values, prepare_sigmoid

        with torch.no_grad():
            after = self._calibrate_logits(torch.from_numpy(z)).numpy()
        target = np.where(mask, y, -100).astype(np.int64)
        out = {}
        for when, values in (("before", z), ("after", after)):
            inputs = prepare_sigmoid(values, target, task="multilabel", from_logits=True)
            out[f"ece_{when}"] = _values(inputs, "ece", 15)[1]
            out[f"nll_{when}"] = _values(inputs, "nll", 15)[1]
        out["accuracy"] = float((((z > 0) == (y > 0.5)) & mask).sum() / mask.sum())
        return out

    def forward(self, logits: Any, from_logits: bool | None = None) -> torch.Tensor:
        """Calibrated logits: the input's shape, dtype and device (two softmax logits in, two out)."""
        self._check_fitted()
        z = self._check_sigmoid_logits(logits)
        layout = self._layout_for_call(z)
        cdtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        is_logits = detect_from_logits(z, layout, from_logits, recorded=(self.fit_info_ or {}).get("input"))
        zl = to_label_logits(z, layout, is_logits, cdtype)
        with torch.no_grad():
            g = self._calibrate_logits(zl)
        if z.dtype != cdtype:  # fp16 / bf16 out: saturate rather than overflow
            limit = float(torch.finfo(z.dtype).max)
            g = g.clamp(-limit, limit)
        return from_label_logits(g, layout).to(z.dtype)

    def graph_forward(self, logits: torch.Tensor) -> torch.Tensor:
        """``forward`` for a tracer (``torch.compile``, ``torch.export``, the ONNX exporter): the same calibrated logits,
        in the input's layout ((N,), (N, 1), two softmax logits (N, 2), or (N, L)), with tensor operations only and
        without ``forward``'s checks on the values (the input is taken as logits, what a model returns). The layout is
        read from the shape, which a tracer knows."""
        self._check_fitted()
        layout = _layout_of(tuple(logits.shape), self.task or self.fit_info_.get("task"))
        cdtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        g = self._calibrate_graph_logits(to_label_logits(logits, layout, True, cdtype))
        if logits.dtype != cdtype:  # fp16 / bf16 out: saturate rather than overflow
            limit = torch.finfo(logits.dtype).max
            g = g.clamp(-limit, limit)
        return from_label_logits(g, layout).to(logits.dtype)

    def _calibrate_graph_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The map of :meth:`graph_forward` on ``(N, L)`` label logits; the default is ``_calibrate_logits``, right for the
        maps that are plain tensor programs (Platt, temperature, beta)."""
        return self._calibrate_logits(z)

    def predict_proba(self, logits: Any, from_logits: bool | None = None) -> torch.Tensor:
        """Calibrated probabilities: ``sigmoid`` of ``forward`` (two softmax logits in: their softmax, ``(N, 2)``), float32
        (float64 for float64 input)."""
        out = self(logits, from_logits=from_logits)
        out = out.to(torch.float64 if out.dtype == torch.float64 else torch.float32)
        if out.ndim == 2 and self.task == "binary" and out.shape[1] == 2:
            return torch.softmax(out, dim=1)
        return torch.sigmoid(out)

    # ------------------------------------------------------------------ Hub
    @classmethod
    def _check_config(cls, config: dict, where) -> None:
        fit = config.get("fit")
        if isinstance(fit, dict):
            task = fit.get("task")
            if task not in SIGMOID_TASKS:
                raise ValueError(
                    f"The checkpoint in {str(where)!r} is not a sigmoid calibrator's: its config's fit.task is "
                    f"{task!r}, not 'binary' or 'multilabel' (the head it was fitted for, config.problem_type)."
                )
            labels = fit.get("num_labels")
            if isinstance(labels, bool) or not isinstance(labels, int) or labels < 1:
                raise ValueError(
                    f"The checkpoint in {str(where)!r} is corrupted: its config's fit.num_labels must be an "
                    f"integer >= 1, but is {labels!r}."
                )
        super()._check_config(config, where)

    def generate_model_card(self, *args, **kwargs):
        info = self.fit_info_ or {}
        kwargs.setdefault("num_classes", info.get("num_labels", "n/a"))
        kwargs.setdefault(
            "class_word",
            f"label(s) of a {info.get('task', 'sigmoid')} (sigmoid) head; ECE below: the macro average over the labels",
        )
        kwargs.setdefault(
            "argmax_statement",
            "Each label's probability goes through its own monotone map: the ranking of the "
            "images by a label's score is kept; which labels pass a 0.5 threshold may change.",
        )
        return super().generate_model_card(*args, **kwargs)

    def _card_description(self) -> str:
        return "It maps each label's logit of a sigmoid (binary or multi-label) head to a calibrated logit."

    def extra_repr(self) -> str:
        from hf_calibration.calibrators._machinery.base import _fit_state

        return f"num_labels={self.num_labels}, task={self.task!r}, " + _fit_state(self)
