"""Prediction sets in a classification ``pipeline``'s results: ``ConformalPredictor.attach(pipe)``.

The pipelines of ``image-classification``, ``text-classification``, ``audio-classification`` and
``video-classification`` are served alike; below, "image" stands for any of their inputs.

The pipeline's forward is wrapped (on that pipeline object only; the model is untouched outside its calls): the model's
own logits are read during the call (before an attached calibrator, through ``observe_uncalibrated``; otherwise by a
forward hook placed before any other), and the batch's sets are computed from them there, through
the predictor's calibrator if it has one, exactly as ``predict_sets`` does. A calibrator attached to the model
(``Calibrator.attach``) changes the scores the pipeline prints, not the sets: fit the predictor with
``calibrator=...`` to combine them (a warning says when the two differ; ``hf_calibration.pipeline`` refuses such a
folder, ``conformal.agreement``). Then each result row gets ``"in_set"`` (bool), and the rows are the ``top_k`` most
probable classes plus every member of the set ranked beyond them, in the pipeline's usual order, so
``[r["label"] for r in pipe(image) if r["in_set"]]`` is the whole set.

Sigmoid heads are served too. A multi-label head with a ``MultiLabelConformalPredictor`` (conformal risk control;
deterministic, so ``draws`` does not apply): each label's row gets ``"in_set"``. A one-logit binary head with a
``ConformalPredictor`` fitted on its one logit (sets of the two classes {0, 1}): the pipeline prints one row, the
model's label with ``sigmoid(z)``; it gets ``"in_set"`` (class 1 in the set), and when class 0 is in the set too a
second row ``{"label": "not <label>", "score": 1 - sigmoid(z), "in_set": True}`` follows, so the rows with
``in_set`` still name the whole set.

A randomised predictor (APS / RAPS, the default) needs one uniform draw per image. By default (``draws="input"``)
each image's draw is derived from its preprocessed input (``draws.input_draws``, keyed by the predictor's seed): the
pixel values, token ids or audio features, read in the pipeline's ``preprocess``, one input at a time, before a
batch pads them. A served model gives one answer per input, the same set on every call and whether the input comes
alone or in a batch. With
``draws="stream"`` the draws come from the predictor's random stream, as ``predict_sets`` takes them by default: a
new draw per image and call, so the same image may get another set (3-6 of 20 images did, call to call).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Mapping
from typing import Any

import torch

from hf_calibration._core.inputs import model_logits
from hf_calibration.conformal.draws import input_draws

logger = logging.getLogger(__name__)

_ATTR = "_hf_calibration_conformal"  # on the pipeline: the attached predictor
_SETS_KEY = "prediction_set"  # in the model outputs, between the pipeline's forward and its postprocess
_DRAWS_KEY = "_hf_calibration_draw"  # in the model inputs, between the pipeline's preprocess and its forward
DRAWS = ("input", "stream")
_PIPELINES = (
    "ImageClassificationPipeline",
    "TextClassificationPipeline",
    "AudioClassificationPipeline",
    "VideoClassificationPipeline",
)
# what an input's draw is derived from: the first of these its preprocessed inputs hold (one input, unpadded)
_DRAW_SOURCES = ("pixel_values", "pixel_values_videos", "input_ids", "input_values", "input_features")


def _scores_agree(predictor: Any, attached: Any) -> bool:
    """Whether ``predictor``'s sets were fitted on the scores the ``attached`` calibrator gives (``agreement``)."""
    from hf_calibration.calibrators import scores_fingerprint
    from hf_calibration.conformal.agreement import sets_fingerprint

    return sets_fingerprint(predictor) == scores_fingerprint(attached)


def _check_pipeline(pipe: Any):
    transformers = sys.modules.get("transformers")  # a pipeline object means transformers is already imported
    classes = tuple(getattr(transformers, name) for name in _PIPELINES) if transformers is not None else ()
    if not classes or not isinstance(pipe, classes):
        raise TypeError(
            "Expected argument `pipe` to be an image-, text-, audio- or video-classification transformers pipeline, "
            f"but got {type(pipe).__name__}."
        )
    return pipe


def _draw_source(model_inputs: Any) -> torch.Tensor | None:
    """One preprocessed input's tensor that its draw is derived from (see ``_DRAW_SOURCES``); None if it has none."""
    if not isinstance(model_inputs, Mapping):  # a dict, a BatchFeature or a BatchEncoding
        return None
    for key in _DRAW_SOURCES:
        value = model_inputs.get(key)
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == 1:
            return value
    return None


def attach(predictor, pipe: Any, *, draws: str = "input") -> Any:
    """Make ``pipe``'s results carry ``predictor``'s sets (see the module docstring); returns ``pipe``. ``draws``:
    ``"input"`` (each image's randomised draw derived from its pixel values, else from its logits) or ``"stream"``."""
    from hf_calibration.calibrators.attach import attached_calibrator

    if draws not in DRAWS:
        raise ValueError(f"Expected argument `draws` to be one of {list(DRAWS)}, but got {draws!r}.")
    _check_pipeline(pipe)
    predictor._check_fitted()
    if predictor.__dict__.get("_attached_to") is not None:
        raise RuntimeError("This ConformalPredictor is already attached to a pipeline; call detach() first.")
    if pipe.__dict__.get(_ATTR) is not None:
        raise ValueError(
            "Expected argument `pipe` to have no ConformalPredictor attached, but one is; detach it first."
        )
    model = pipe.model
    num_labels = int(model.config.num_labels)
    multilabel = getattr(predictor, "method", None) == "crc"  # MultiLabelConformalPredictor: one threshold per label
    one_logit = not multilabel and num_labels == 1 and predictor.num_classes == 2  # a binary head's one logit
    if num_labels != predictor.num_classes and not one_logit:
        raise ValueError(
            f"Expected a pipeline whose model has {predictor.num_classes} classes (the predictor's), but it has {num_labels}."
        )
    labels = [model.config.id2label[i] for i in range(num_labels)]
    if len(set(labels)) != num_labels:
        raise ValueError(
            "Expected the model's id2label to name each class once: the pipeline's rows are matched to classes by label."
        )
    index_of = {label: i for i, label in enumerate(labels)}
    # the printed scores and the sets agree when the predictor was fitted behind the model's calibrator
    if not predictor.__dict__.get("_scores_warned") and not _scores_agree(predictor, attached_calibrator(model)):
        logger.warning(
            "The calibrator attached to the pipeline's model is not the one the prediction sets were fitted behind: the "
            "printed scores and the sets come from different scores. Fit the predictor with calibrator=<the model's "
            "calibrator> to make them agree."
        )
    preprocess, forward, postprocess = pipe.preprocess, pipe._forward, pipe.postprocess
    default_top_k = inspect.signature(postprocess).parameters["top_k"].default
    legacy = "_legacy" in inspect.signature(postprocess).parameters  # text-classification's one-dict default result

    def _preprocess(inputs, **kwargs):
        model_inputs = preprocess(inputs, **kwargs)
        if draws == "input" and not multilabel and predictor.randomized:
            source = _draw_source(model_inputs)
            if source is not None:  # a (1,) tensor: the batch's collate concatenates them, and forward pops them
                model_inputs[_DRAWS_KEY] = input_draws(source, predictor.seed)
        return model_inputs

    def _forward(model_inputs, **kwargs):
        from hf_calibration.calibrators.attach import observe_uncalibrated

        drawn = model_inputs.pop(_DRAWS_KEY, None) if isinstance(model_inputs, Mapping) else None
        captured = []
        if attached_calibrator(model) is not None:  # the model's own logits, before the calibrator inside its forward
            remove = observe_uncalibrated(model, lambda output: captured.append(model_logits(output)))
        else:
            remove = model.register_forward_hook(
                lambda module, args, output: captured.append(model_logits(output)), prepend=True
            ).remove
        try:
            outputs = forward(model_inputs, **kwargs)
        finally:
            remove()
        if not captured:
            raise RuntimeError("The pipeline's forward did not run its model: no logits to build prediction sets from.")
        logits = captured[-1].detach()
        if multilabel:
            outputs[_SETS_KEY] = predictor.predict_sets(logits, from_logits=True)
        elif drawn is not None:
            outputs[_SETS_KEY] = predictor._predict_sets_with_draws(logits, drawn.detach().cpu().to(torch.float64))
        else:  # no input tensor to derive the draws from: the logits, or the predictor's stream
            source = "logits" if draws == "input" else None
            outputs[_SETS_KEY] = predictor.predict_sets(logits, from_logits=True, draws_from=source)
        return outputs

    def _postprocess(model_outputs, **kwargs):
        in_set = model_outputs[_SETS_KEY][0].tolist()  # one image: the pipeline unbatches before postprocess
        top_k = kwargs.pop("top_k", default_top_k)
        top_k = num_labels if top_k is None else top_k
        if legacy:  # text-classification: the list of rows, sorted, rather than its one-dict default
            kwargs["_legacy"] = False
        rows = postprocess(model_outputs, top_k=num_labels, **kwargs)  # every class, by decreasing score
        if one_logit:  # sets of the classes {0, 1}; the one row is class 1's
            row = {**rows[0], "in_set": in_set[1]}
            negative = {"label": f"not {row['label']}", "score": 1.0 - row["score"], "in_set": True}
            return [row, negative] if in_set[0] else [row]
        out = []
        for rank, row in enumerate(rows):
            member = in_set[index_of[row["label"]]]
            if rank < top_k or member:
                out.append({**row, "in_set": member})
        return out

    # instance attributes shadow the class's methods
    pipe.preprocess, pipe._forward, pipe.postprocess = _preprocess, _forward, _postprocess
    pipe.__dict__[_ATTR] = predictor
    predictor.__dict__["_attached_to"] = pipe
    return pipe


def detach(predictor) -> Any:
    """Restore the pipeline ``attach`` changed; returns it."""
    pipe = predictor.__dict__.get("_attached_to")
    if pipe is None:
        raise RuntimeError("This ConformalPredictor is not attached to any pipeline: nothing to detach.")
    for name in ("preprocess", "_forward", "postprocess", _ATTR):
        pipe.__dict__.pop(name, None)
    predictor.__dict__["_attached_to"] = None
    return pipe
