"""Attach a calibrator to a classifier: its ``forward`` returns calibrated logits in place of its own.

Works on any module whose forward returns a transformers ``ModelOutput`` with ``logits``
(ViT, Swin, ResNet, ``TimmWrapperForImageClassification``, ...), a tuple (``return_dict=False``: the first
rank-2 floating tensor is the logits; a loss, rank 0, comes before it) or a bare logits tensor (timm).
Pipelines call the model's forward, so ``pipeline("image-classification", model=model)`` scores are
calibrated too, and ``attach(pipe)`` on a pipeline object attaches to ``pipe.model``. A loss the model computes
from ``labels`` inside its forward stays the uncalibrated one. A calibrator whose ``preserves_argmax`` is False
logs a warning when attached: the model's predicted classes may change. A calibrator fitted for another kind of
head than the model's (a softmax calibrator on a ``multi_label_classification`` model, a sigmoid one on a softmax
model) is refused with a ``ValueError`` naming ``config.problem_type`` (:func:`hf_calibration._core.tasks.compatible_head`).

The mechanism: ``attach`` sets ``forward`` on the model instance (a method wrapping the class's forward, or the
instance forward another library set before, with its signature), and ``detach`` removes it. The calibration is then
inside ``model.forward`` itself, so ``torch.compile(model)`` and ``torch.export.export(model, ...)`` trace model and
calibrator as one graph; a forward hook on the top module, the mechanism before, was compiled as a second graph
after the model's. When a tracer runs the model (``torch.compile``, ``torch.export``, the ONNX exporter), the
calibrator's ``graph_forward`` is called, the same map in tensor operations only (no graph break); eager calls keep
``forward``'s input checks. The calibrator is a plain attribute of the attachment: not a submodule, not in the
model's ``state_dict``. ``observe_uncalibrated(model, fn)`` lets a caller read the model's own output before the
calibrator (what conformal sets are computed from).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_ATTR = "_hf_calibration_attachment"  # on the model: its _Attachment

logger = logging.getLogger(__name__)


def tracing() -> bool:
    """Whether a tracer is running: ``torch.compile`` / ``torch.export`` (dynamo or not), the ONNX exporter, TorchScript."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and (compiler.is_compiling() or getattr(compiler, "is_exporting", lambda: False)()):
        return True
    return bool(torch.onnx.is_in_onnx_export() or torch.jit.is_tracing() or torch.jit.is_scripting())


@dataclass
class _Attachment:
    """What ``attach`` put on a model: the calibrator, the instance ``forward`` it replaced (None: the class's), the
    ``forward`` it set, and the observers of the uncalibrated output."""

    calibrator: nn.Module
    previous: Any
    forward: Any = None
    observers: list[Callable[[Any], None]] = field(default_factory=list)


def _calibrated_forward(inner: Callable) -> Callable:
    """A ``forward(self, ...)`` that runs ``inner`` (the class's forward, or the replaced instance forward), shows its
    output to the observers, then calibrates its logits. ``functools.wraps`` keeps ``inner``'s signature, which
    ``Trainer`` and pipelines inspect."""

    @functools.wraps(inner)
    def forward(self, *args, **kwargs):
        entry = self.__dict__[_ATTR]
        output = inner(self, *args, **kwargs) if entry.previous is None else entry.previous(*args, **kwargs)
        for observe in entry.observers:
            observe(output)
        calibrator = entry.calibrator
        if tracing():  # compile / export: the branch-free map, traced into the model's graph
            return _replace_logits(output, calibrator.graph_forward)
        return _replace_logits(
            output, lambda logits: calibrator(logits, from_logits=True)
        )  # a model's outputs are logits

    if not isinstance(inner, types.FunctionType):  # a bound instance forward: its signature, with `self` put back
        signature = inspect.signature(inner)
        forward.__signature__ = signature.replace(
            parameters=[
                inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                *signature.parameters.values(),
            ]
        )
    return forward


def _replace_logits(output: Any, calibrate) -> Any:
    if isinstance(output, torch.Tensor):
        return calibrate(output)
    if isinstance(output, dict):  # ModelOutput is an OrderedDict; __setitem__ keeps the attribute in step
        if output.get("logits") is None:
            raise ValueError("The model's output has no `logits` to calibrate.")
        output["logits"] = calibrate(output["logits"])
        return output
    if isinstance(output, tuple):
        for i, item in enumerate(output):
            if isinstance(item, torch.Tensor) and item.ndim == 2 and item.is_floating_point():
                items = list(output)
                items[i] = calibrate(item)
                return type(output)(items)
        raise ValueError("The model's output tuple holds no (N, K) logits tensor to calibrate.")
    raise TypeError(
        f"Cannot calibrate a model output of type {type(output).__name__}: expected a ModelOutput, tuple or tensor."
    )


def _module_of(model: Any) -> nn.Module:
    """``model`` itself, or the model a transformers ``Pipeline`` runs."""
    if isinstance(model, nn.Module):
        return model
    transformers = sys.modules.get("transformers")  # a pipeline object means transformers is already imported
    if (
        transformers is not None
        and isinstance(model, transformers.Pipeline)
        and isinstance(getattr(model, "model", None), nn.Module)
    ):
        return model.model
    raise TypeError(
        f"Expected argument `model` to be a torch.nn.Module or a transformers pipeline, but got {type(model).__name__}."
    )


def attach(calibrator: nn.Module, model: Any) -> Any:
    """Make ``model``'s forward return ``calibrator(logits)`` in place of its logits; returns ``model``.

    ``model`` may be a transformers ``Pipeline``: its ``.model`` is calibrated (and the pipeline returned).
    """
    target = model
    model = _module_of(model)
    if getattr(calibrator, "_attached_to", None) is not None:
        raise RuntimeError(
            f"This {type(calibrator).__name__} is already attached to a {type(calibrator._attached_to).__name__}; call detach() first."
        )
    if model.__dict__.get(_ATTR) is not None:
        raise ValueError(
            f"Expected argument `model` to have no calibrator attached, but a {type(model.__dict__[_ATTR].calibrator).__name__} "
            "is attached to it; detach it first."
        )
    calibrator._check_fitted()
    from hf_calibration._core.tasks import compatible_head

    info = calibrator.fit_info_ or {}
    compatible_head(info.get("task", "multiclass"), model, num_labels=info.get("num_labels"))

    previous = model.__dict__.get("forward")  # an instance forward set before (accelerate's hooks), or None
    entry = _Attachment(calibrator, previous)
    inner = type(model).forward if previous is None else previous
    entry.forward = types.MethodType(_calibrated_forward(inner), model)
    model.__dict__[_ATTR] = entry  # plain attribute: not a submodule, not in the model's state_dict
    model.__dict__["forward"] = entry.forward
    calibrator.__dict__["_attached_to"] = model
    if not getattr(calibrator, "preserves_argmax", True) and info.get("task", "multiclass") != "multiclass":
        logger.info(
            "%s maps each label's logit on its own: which labels pass a 0.5 threshold may change once attached.",
            type(calibrator).__name__,
        )
    elif not getattr(calibrator, "preserves_argmax", True):
        logger.warning(
            "%s may change the predicted class of some inputs (preserves_argmax=False): once attached, the "
            "%s's predictions can differ from the uncalibrated model's.",
            type(calibrator).__name__,
            type(model).__name__,
        )
    return target


def detach(calibrator: nn.Module) -> nn.Module:
    """Remove the ``forward`` ``attach`` set; the model behaves exactly as before. Returns the model."""
    model = getattr(calibrator, "_attached_to", None)
    if model is None:
        raise RuntimeError(f"This {type(calibrator).__name__} is not attached to any model: nothing to detach.")
    entry = model.__dict__[_ATTR]
    if model.__dict__.get("forward") is not entry.forward:
        raise RuntimeError(
            f"The {type(model).__name__}'s forward was replaced after the calibrator was attached (by another "
            "library's hooks?): remove that first, then detach the calibrator."
        )
    del model.__dict__[_ATTR]
    if entry.previous is None:
        del model.__dict__["forward"]
    else:
        model.__dict__["forward"] = entry.previous
    calibrator.__dict__["_attached_to"] = None
    return model


def attached_calibrator(model: nn.Module):
    """The calibrator attached to ``model``, or None."""
    entry = model.__dict__.get(_ATTR)
    return None if entry is None else entry.calibrator


def attached_forward(model: nn.Module):
    """The ``forward`` that ``attach`` set on ``model`` (None without a calibrator)."""
    entry = model.__dict__.get(_ATTR)
    return None if entry is None else entry.forward


def uncalibrated_forward(model: nn.Module) -> Callable:
    """``model``'s forward without its attached calibrator (its own forward when none is attached)."""
    entry = model.__dict__.get(_ATTR)
    if entry is None:
        return model.forward
    return entry.previous if entry.previous is not None else types.MethodType(type(model).forward, model)


def observe_uncalibrated(model: nn.Module, observer: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``observer(output)`` with the model's own output, before its attached calibrator, at each forward; returns
    the function that removes it. ``ValueError`` when no calibrator is attached (a forward hook sees that output)."""
    entry = model.__dict__.get(_ATTR)
    if entry is None:
        raise ValueError(
            "Expected argument `model` to have a calibrator attached (without one, a forward hook sees its own output)."
        )
    entry.observers.append(observer)
    return lambda: entry.observers.remove(observer) if observer in entry.observers else None
