"""Attach a calibrator to a classifier: a forward hook that replaces the output's logits with calibrated ones.

Works on any module whose forward returns a transformers ``ModelOutput`` with ``logits``
(ViT, Swin, ResNet, ``TimmWrapperForImageClassification``, ...), a tuple (``return_dict=False``: the first
rank-2 floating tensor is the logits; a loss, rank 0, comes before it) or a bare logits tensor (timm).
Pipelines call the model's forward, so ``pipeline("image-classification", model=model)`` scores are
calibrated too, and ``attach(pipe)`` on a pipeline object attaches to ``pipe.model``. A loss the model computes
from ``labels`` inside its forward stays the uncalibrated one. A calibrator whose ``preserves_argmax`` is False
logs a warning when attached: the model's predicted classes may change. A calibrator fitted for another kind of
head than the model's (a softmax calibrator on a ``multi_label_classification`` model, a sigmoid one on a softmax
model) is refused with a ``ValueError`` naming ``config.problem_type`` (:func:`hf_calibration.tasks.compatible_head`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from torch import nn

_ATTR = "_hf_calibration_attachment"  # on the model: (hook handle, calibrator)

logger = logging.getLogger(__name__)


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
    raise TypeError(f"Cannot calibrate a model output of type {type(output).__name__}: expected a ModelOutput, tuple or tensor.")


def _module_of(model: Any) -> nn.Module:
    """``model`` itself, or the model a transformers ``Pipeline`` runs."""
    if isinstance(model, nn.Module):
        return model
    transformers = sys.modules.get("transformers")  # a pipeline object means transformers is already imported
    if transformers is not None and isinstance(model, transformers.Pipeline) and isinstance(getattr(model, "model", None), nn.Module):
        return model.model
    raise TypeError(f"Expected argument `model` to be a torch.nn.Module or a transformers pipeline, but got {type(model).__name__}.")


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
            f"Expected argument `model` to have no calibrator attached, but a {type(model.__dict__[_ATTR][1]).__name__} "
            "is attached to it; detach it first."
        )
    calibrator._check_fitted()
    from ..tasks import compatible_head

    info = calibrator.fit_info_ or {}
    compatible_head(info.get("task", "multiclass"), model, num_labels=info.get("num_labels"))

    def hook(module, args, output):
        return _replace_logits(output, lambda logits: calibrator(logits, from_logits=True))  # a model's outputs are logits

    handle = model.register_forward_hook(hook)
    model.__dict__[_ATTR] = (handle, calibrator)  # plain attribute: not a submodule, not in the model's state_dict
    calibrator.__dict__["_attached_to"] = model
    if not getattr(calibrator, "preserves_argmax", True) and info.get("task", "multiclass") != "multiclass":
        logger.info("%s maps each label's logit on its own: which labels pass a 0.5 threshold may change once attached.",
                    type(calibrator).__name__)
    elif not getattr(calibrator, "preserves_argmax", True):
        logger.warning(
            "%s may change the predicted class of some inputs (preserves_argmax=False): once attached, the "
            "%s's predictions can differ from the uncalibrated model's.",
            type(calibrator).__name__,
            type(model).__name__,
        )
    return target


def detach(calibrator: nn.Module) -> nn.Module:
    """Remove the hook ``attach`` installed; the model behaves exactly as before. Returns the model."""
    model = getattr(calibrator, "_attached_to", None)
    if model is None:
        raise RuntimeError(f"This {type(calibrator).__name__} is not attached to any model: nothing to detach.")
    handle, _ = model.__dict__.pop(_ATTR)
    handle.remove()
    calibrator.__dict__["_attached_to"] = None
    return model


def attached_calibrator(model: nn.Module):
    """The calibrator attached to ``model``, or None."""
    entry = model.__dict__.get(_ATTR)
    return None if entry is None else entry[1]
