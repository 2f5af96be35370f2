"""A classifier and its preprocessor from a folder or a Hub id, through the Auto classes.

* transformers checkpoints (ViT, Swin, ConvNeXt, ResNet, ...): ``AutoModelForImageClassification``; for the other
  classification pipelines' tasks, ``AutoModelForSequenceClassification`` (text), ``AutoModelForAudioClassification``
  and ``AutoModelForVideoClassification`` (:data:`CLASSIFICATION_TASKS`), each with its tokenizer, feature extractor
  or video processor (:func:`load_processor`);
* timm checkpoints (``timm/resnet50.a1_in1k``, or a folder with a ``timm_wrapper`` config):
  ``TimmWrapperForImageClassification``, whose image processor is read from ``config.json``;
* checkpoints saved after the MaC-Cal stage (their config records ``maccal_head``):
  ``hf_calibration.load_maccal_model``, which rebuilds the bottleneck head instead of a random Linear.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from torch import nn

__all__ = ["CLASSIFICATION_TASKS", "load_image_classifier", "load_image_processor", "load_processor"]

logger = logging.getLogger(__name__)

_MACCAL_CONFIG_KEY = "maccal_head"  # what a MaC-Cal checkpoint's config records (see hf_calibration.load_maccal_model)
_HUB_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "token",
)  # where the files come from: config and weights alike


IMAGE_TASK = "image-classification"
# the transformers pipeline tasks whose models end in class logits: (Auto model class, preprocessor argument of
# ``transformers.pipeline``, Auto classes that load that preprocessor, tried in order)
CLASSIFICATION_TASKS = {
    IMAGE_TASK: ("AutoModelForImageClassification", "image_processor", ("AutoImageProcessor",)),
    "text-classification": ("AutoModelForSequenceClassification", "tokenizer", ("AutoTokenizer",)),
    "audio-classification": ("AutoModelForAudioClassification", "feature_extractor", ("AutoFeatureExtractor",)),
    # newer video models have a video processor; VideoMAE-era checkpoints may have only an image processor
    "video-classification": (
        "AutoModelForVideoClassification",
        "video_processor",
        ("AutoVideoProcessor", "AutoImageProcessor"),
    ),
}


def check_task(task: Any) -> str:
    """``task`` if it is one of :data:`CLASSIFICATION_TASKS`, else a ``ValueError`` naming the argument."""
    if not isinstance(task, str) or task not in CLASSIFICATION_TASKS:
        raise ValueError(
            f"Expected argument `task` to be one of {sorted(CLASSIFICATION_TASKS)} (calibrators act on class scores), "
            f"but got {task!r}."
        )
    return task


def _load_model(
    name_or_path: str | os.PathLike, revision: str | None, task: str = IMAGE_TASK, **kwargs: Any
) -> nn.Module:
    import transformers
    from transformers import AutoConfig, TimmWrapperForImageClassification

    config = AutoConfig.from_pretrained(
        name_or_path, revision=revision, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    )
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


def load_image_classifier(
    model: str | os.PathLike | nn.Module,
    image_processor: Any = None,
    *,
    revision: str | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, Any]:
    """``(model, image_processor)`` ready for inference (the model in eval mode).

    Args:
        model: a folder or Hub id (loaded as described in the module docstring), or a model object
            (returned as it is).
        image_processor: an image processor object, or a folder / Hub id to load one from. ``None``:
            the model's own (from its folder or Hub id, or from ``model.config._name_or_path`` for
            an object).
        revision: the Hub revision (branch, tag or commit) of the model.
        **kwargs: passed to ``from_pretrained`` (``dtype``, ``token``, ...).
    """
    if isinstance(model, nn.Module):
        source = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    elif isinstance(model, (str, os.PathLike)):
        source = model
        model = _load_model(model, revision, **kwargs)
    else:
        raise TypeError(
            f"Expected argument `model` to be a folder, a Hub id or a torch.nn.Module, but got {type(model).__name__}."
        )
    if image_processor is None:
        if source is None:
            raise ValueError(
                "Expected argument `image_processor` for a model object that does not record where it was loaded from."
            )
        image_processor = load_image_processor(source, revision)
    elif isinstance(image_processor, (str, os.PathLike)):
        image_processor = load_image_processor(image_processor)
    if not callable(image_processor):
        raise TypeError(
            f"Expected argument `image_processor` to be callable on a list of images, but got {type(image_processor).__name__}."
        )
    return model, image_processor
