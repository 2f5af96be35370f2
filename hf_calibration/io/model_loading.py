"""A classifier and its preprocessor from a folder or a Hub id, through the Auto classes.

* transformers checkpoints (ViT, Swin, ConvNeXt, ResNet, ...): ``AutoModelForImageClassification``; for the other
  classification pipelines' tasks, ``AutoModelForSequenceClassification`` (text), ``AutoModelForAudioClassification``
  and ``AutoModelForVideoClassification`` (:data:`CLASSIFICATION_TASKS`), each with its tokenizer, feature extractor
  or video processor (:func:`load_processor`);
* timm checkpoints (``timm/resnet50.a1_in1k``, or a folder with a ``timm_wrapper`` config):
  ``TimmWrapperForImageClassification``, whose image processor is read from ``config.json``;
* checkpoints saved after the MaC-Cal stage (their config records ``maccal_head``):
  ``hf_calibration.maccal.load_maccal_model``, which rebuilds the bottleneck head instead of a random Linear.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from torch import nn

from hf_calibration._core.tasks import CLASSIFICATION_TASKS, IMAGE_TASK, resolve_pipeline_task

__all__ = [
    "CLASSIFICATION_TASKS",
    "IMAGE_TASK",
    "load_classifier",
    "load_image_classifier",
    "load_image_processor",
    "load_processor",
]

logger = logging.getLogger(__name__)

_MACCAL_CONFIG_KEY = (
    "maccal_head"  # what a MaC-Cal checkpoint's config records (see hf_calibration.maccal.load_maccal_model)
)
_HUB_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "token",
)  # where the files come from: config and weights alike


def _load_model(
    name_or_path: str | os.PathLike, revision: str | None, task: str | None = None, **kwargs: Any
) -> nn.Module:
    """The model through the Auto class of its task: the config's (``_core.tasks.resolve_pipeline_task``; ``task``
    only overrides where the config says nothing, and a contradiction is a ``ValueError``)."""
    import transformers
    from transformers import AutoConfig, TimmWrapperForImageClassification

    config = AutoConfig.from_pretrained(
        name_or_path, revision=revision, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    )
    task = resolve_pipeline_task(task, config)
    if task != IMAGE_TASK:
        model_class = getattr(transformers, CLASSIFICATION_TASKS[task][0])
        return model_class.from_pretrained(name_or_path, config=config, revision=revision, **kwargs)
    if isinstance(getattr(config, _MACCAL_CONFIG_KEY, None), dict):  # also checkpoints older than the Auto registration
        from hf_calibration.maccal import load_maccal_model

        logger.info("%s is a MaC-Cal checkpoint: loading its bottleneck head", name_or_path)
        return load_maccal_model(name_or_path, config=config, revision=revision, **kwargs)
    model_class = (
        TimmWrapperForImageClassification
        if config.model_type == "timm_wrapper"
        else transformers.AutoModelForImageClassification
    )
    return model_class.from_pretrained(name_or_path, config=config, revision=revision, **kwargs)


def load_image_processor(name_or_path: str | os.PathLike, revision: str | None = None, **kwargs: Any):
    """``AutoImageProcessor.from_pretrained`` (``kwargs``: ``cache_dir``, ``token``, ...), with an error that says what to
    do when the checkpoint has none."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(name_or_path, revision=revision, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(
            f"Found no image processor for {str(name_or_path)!r} (no preprocessor_config.json, or a timm config without "
            f"`pretrained_cfg`); pass `image_processor` (an object, a folder or a Hub id). ({str(err).splitlines()[0]})"
        ) from None


def load_processor(task: str, name_or_path: str | os.PathLike, revision: str | None = None, **kwargs: Any):
    """``(argument, preprocessor)``: what ``transformers.pipeline(task, ...)`` takes to prepare the inputs of ``task``
    (:data:`CLASSIFICATION_TASKS`: an image processor, a tokenizer, a feature extractor or a video processor), loaded
    from ``name_or_path`` through the Auto classes, and the name of the pipeline argument it goes to."""
    if task == IMAGE_TASK:
        return "image_processor", load_image_processor(name_or_path, revision, **kwargs)
    import transformers

    argument, loaders = CLASSIFICATION_TASKS[task][1:]
    errors = []
    for loader in loaders:
        try:
            processor = getattr(transformers, loader).from_pretrained(name_or_path, revision=revision, **kwargs)
        except (OSError, ValueError, KeyError, TypeError) as err:
            errors.append(f"{loader}: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            continue
        return ("image_processor" if loader == "AutoImageProcessor" else argument), processor
    raise ValueError(
        f"Found no {argument.replace('_', ' ')} for {str(name_or_path)!r}; pass `{argument}` (an object, a folder or a "
        f"Hub id). ({'; '.join(errors)})"
    )


def load_classifier(
    model: str | os.PathLike | nn.Module,
    processor: Any = None,
    *,
    task: str | None = None,
    revision: str | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, Any, str]:
    """``(model, processor, task)`` ready for inference: the model, the preprocessor its task takes and the task
    (``"image-classification"``, ``"text-classification"``, ...), read from the model's config.

    Args:
        model: a folder or Hub id (loaded as described in the module docstring), or a model object (returned as it is).
        processor: an image processor, tokenizer, feature extractor or video processor, or a folder / Hub id to load
            one from. ``None``: the model's own (from its folder or Hub id, or ``model.config._name_or_path``).
        task: overrides the config where it names no task (a config-less model: else the processor's kind decides);
            one that contradicts the config is a ``ValueError``.
        revision: the Hub revision (branch, tag or commit) of the model.
        **kwargs: passed to ``from_pretrained`` (``dtype``, ``token``, ...).
    """
    from hf_calibration.io.modality import processor_for

    if isinstance(model, nn.Module):
        source = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    elif isinstance(model, (str, os.PathLike)):
        source = model
        model = _load_model(model, revision, task, **kwargs)
    else:
        raise TypeError(
            f"Expected argument `model` to be a folder, a Hub id or a torch.nn.Module, but got {type(model).__name__}."
        )
    task = pipeline_task_of(model, task, processor)
    if processor is None:
        if source is None:
            raise ValueError(
                "Expected argument `processor` for a model object that does not record where it was loaded from."
            )
        processor = load_processor(task, source, revision)[1]
    elif isinstance(processor, (str, os.PathLike)):
        processor = load_processor(task, processor)[1]
    return model, processor_for(task, processor), task


def pipeline_task_of(
    model: str | os.PathLike | nn.Module, task: str | None = None, processor: Any = None, revision: str | None = None
) -> str:
    """The pipeline task of a model object, folder or Hub id (only its ``config.json`` is read):
    ``_core.tasks.resolve_pipeline_task`` on its config; for a model whose config names none (a timm or torch module),
    ``task``, else the kind of ``processor`` (an object), else ``"image-classification"``."""
    from hf_calibration._core.tasks import pipeline_task_of_config
    from hf_calibration.io.modality import processor_task

    if isinstance(model, nn.Module):
        config = getattr(model, "config", None)
    else:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(model, revision=revision)
        except (OSError, ValueError, KeyError):  # no readable config: the model loader words that error
            config = None
    if task is None and pipeline_task_of_config(config)[0] is None and not isinstance(processor, (str, os.PathLike)):
        task = processor_task(processor)
    return resolve_pipeline_task(task, config)


def load_image_classifier(
    model: str | os.PathLike | nn.Module,
    image_processor: Any = None,
    *,
    revision: str | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, Any]:
    """``(model, image_processor)`` of an image classifier: :func:`load_classifier` with ``task="image-classification"``.
    Another modality's model (a text, audio or video classifier by its config) is a ``ValueError`` that says so: the
    callers (the shift tools) perturb images."""
    found = pipeline_task_of(model, None, image_processor, revision)
    if found != IMAGE_TASK:
        raise ValueError(
            f"Expected an image classifier (images are perturbed here), but argument `model` is a {found} model by its "
            "config. The image corruptions have no text, audio or video counterpart."
        )
    model, processor, _ = load_classifier(model, image_processor, task=IMAGE_TASK, revision=revision, **kwargs)
    return model, processor
