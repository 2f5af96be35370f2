"""A classifier's inputs by its task: images, text, audio or video. The one dispatch ``predict_logits`` and the command
line go through: which preprocessor the task takes (:func:`processor_for`), which dataset columns hold the inputs
(:func:`find_input_columns`), how the dataset is prepared (audio cast to the feature extractor's sampling rate with the
``datasets.Audio`` feature) and how a batch of rows becomes the model's keyword arguments (:class:`Collate`).

* image: the one ``datasets.Image`` column → the image processor's ``pixel_values``;
* text: a tokenizer (padding, truncation) over one text column (``text``, ``sentence``, ... or the one string column)
  or a pair (``sentence1`` / ``sentence2``, ``premise`` / ``hypothesis``, ``question`` / ``sentence``, ...);
* audio: a feature extractor at its ``sampling_rate`` over the ``datasets.Audio`` column (or ``audio``): an ``Audio``
  column at another rate is resampled by ``cast_column``, decoded rows at another rate are refused;
* video: a video (or VideoMAE-style image) processor over a column of frame arrays (``video``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_calibration._core.tasks import CLASSIFICATION_TASKS, IMAGE_TASK
from hf_calibration.io.data import _describe, check_column

__all__ = ["Collate", "find_input_columns", "prepare_dataset", "processor_for", "processor_task"]

TEXT = "text-classification"
AUDIO = "audio-classification"
VIDEO = "video-classification"
TEXT_COLUMNS = ("text", "sentence", "content", "review", "document")
# sentence-pair datasets (GLUE, SNLI, XNLI, PAWS...): (first, second) columns, tried in order
TEXT_PAIRS = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("question1", "question2"),
    ("question", "passage"),
    ("sentence_A", "sentence_B"),
)
_PART = {
    IMAGE_TASK: ("image_processor",),
    TEXT: ("tokenizer",),
    AUDIO: ("feature_extractor",),
    VIDEO: ("video_processor", "image_processor"),
}  # the part of a ProcessorMixin (CLIPProcessor, Wav2Vec2Processor, ...) each task prepares its inputs with


def processor_task(processor: Any) -> str | None:
    """The task a preprocessor is for by its kind: a tokenizer → text, a sequence feature extractor → audio, a video
    processor → video, an image processor (or a timm one) → image; None for a plain callable."""
    import transformers
    from transformers.image_processing_utils import BaseImageProcessor

    if isinstance(processor, transformers.PreTrainedTokenizerBase):
        return TEXT
    if isinstance(processor, transformers.SequenceFeatureExtractor):
        return AUDIO
    video = getattr(transformers, "BaseVideoProcessor", None)
    if video is not None and isinstance(processor, video):
        return VIDEO
    if isinstance(processor, BaseImageProcessor) or isinstance(getattr(processor, "data_config", None), dict):
        return IMAGE_TASK
    return None


def processor_for(task: str, processor: Any) -> Any:
    """``processor`` checked against ``task``: a combined ``ProcessorMixin`` gives its part for the task (its tokenizer
    for text, its feature extractor for audio, ...); one of another kind is a ``ValueError`` naming ``processor``."""
    import transformers

    if isinstance(processor, transformers.ProcessorMixin):
        part = next((getattr(processor, a) for a in _PART[task] if getattr(processor, a, None) is not None), None)
        if part is None:
            raise ValueError(
                f"Expected argument `processor` to hold a {' or '.join(_PART[task])} for a {task} model, but the "
                f"{type(processor).__name__} has none."
            )
        processor = part
    kind = processor_task(processor)
    if kind is not None and kind != task and not (task == VIDEO and kind == IMAGE_TASK):
        wanted = CLASSIFICATION_TASKS[task][1].replace("_", " ")
        raise ValueError(
            f"Expected argument `processor` to be a {wanted} for this {task} model (its config says so), but got a "
            f"{type(processor).__name__}, which prepares the inputs of {kind}."
        )
    if not callable(processor):
        raise TypeError(f"Expected argument `processor` to be callable on a batch, but got {type(processor).__name__}.")
    return processor


def _is_string(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _check_named(features, names: tuple[str, ...], what: str, ok) -> tuple[str, ...]:
    return tuple(check_column(features, name, "input_column", what, ok) for name in names)


def find_input_columns(features, task: str, input_column: str | tuple[str, ...] | list[str] | None = None):
    """The columns holding a ``task`` model's inputs, as a tuple: one column, or two for a text pair. ``input_column``
    names them (a name, or a pair of names for text); default: found from the features (module docstring). A dataset
    without them is a ``ValueError`` naming the columns found."""
    import datasets

    from hf_calibration.io.data import find_image_column

    names = (input_column,) if isinstance(input_column, str) else tuple(input_column) if input_column else ()
    if not all(isinstance(n, str) for n in names) or len(names) > (2 if task == TEXT else 1):
        raise ValueError(
            f"Expected argument `input_column` to be a column name{' or a pair of them' if task == TEXT else ''}, but "
            f"got {input_column!r}."
        )
    if task == IMAGE_TASK:
        return (find_image_column(features, names[0] if names else None),)
    if task == TEXT:
        if names:
            return _check_named(features, names, "text (strings)", _is_string)
        for pair in TEXT_PAIRS:
            if all(name in features and _is_string(features[name]) for name in pair):
                return pair
        named = [name for name in TEXT_COLUMNS if name in features and _is_string(features[name])]
        strings = [name for name, feature in features.items() if _is_string(feature)]
        if named or len(strings) == 1:
            return ((named or strings)[0],)
        raise ValueError(
            f"Expected a text column ({', '.join(TEXT_COLUMNS)}, a pair such as sentence1/sentence2 or "
            f"premise/hypothesis, or the one string column) for a text-classification model, but the columns are "
            f"{_describe(features)}; name it with `input_column`."
        )

    def holds_arrays(feature) -> bool:
        return isinstance(feature, datasets.Audio) or not isinstance(feature, (datasets.Value, datasets.ClassLabel))

    kind, feature_type = ("audio", datasets.Audio) if task == AUDIO else ("video", getattr(datasets, "Video", None))
    if names:
        return _check_named(features, names, f"{kind} (arrays)", holds_arrays)
    typed = [n for n, f in features.items() if feature_type is not None and isinstance(f, feature_type)]
    if len(typed) == 1:
        return (typed[0],)
    if kind in features and holds_arrays(features[kind]) and not typed:
        return (kind,)
    raise ValueError(
        f"Expected one {kind} column ({'a datasets.Audio column, or ' if task == AUDIO else ''}one named {kind!r}) "
        f"for a {task} model, but the columns are {_describe(features)}; name it with `input_column`."
    )


def prepare_dataset(data, task: str, columns: tuple[str, ...], processor: Any):
    """``data`` ready for :class:`Collate`: a ``datasets.Audio`` column at another rate than the feature extractor's
    ``sampling_rate`` is cast to it (``cast_column``: ``datasets`` resamples as it decodes)."""
    import datasets

    if task == AUDIO:
        rate = getattr(processor, "sampling_rate", None)
        feature = data.features[columns[0]]
        if rate is not None and isinstance(feature, datasets.Audio) and feature.sampling_rate != rate:
            data = data.cast_column(columns[0], datasets.Audio(sampling_rate=rate))
    return data


def _audio_array(value: Any, rate: int | None, column: str) -> np.ndarray:
    """One decoded audio row as a mono float32 array at ``rate``: a ``datasets`` audio decoder, an
    ``{"array", "sampling_rate"}`` dict, or an array (taken as sampled at ``rate``)."""
    found = None
    if hasattr(value, "get_all_samples"):  # datasets >= 4: a torchcodec AudioDecoder
        samples = value.get_all_samples()
        array, found = samples.data.float().mean(0).numpy(), int(samples.sample_rate)
    elif isinstance(value, dict):
        array, found = value.get("array"), value.get("sampling_rate")
    else:
        array = value
    if rate is not None and found is not None and int(found) != int(rate):
        raise ValueError(
            f"Expected the {column!r} column's audio at the feature extractor's sampling_rate={rate}, but a row is "
            f"sampled at {found}: cast the column, dataset.cast_column({column!r}, datasets.Audio(sampling_rate={rate})), "
            "and datasets resamples it as it decodes."
        )
    array = np.asarray(array, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(
            f"Expected the {column!r} column to hold mono audio (1-D arrays), but a row has shape {array.shape}."
        )
    return array


def _frames(value: Any) -> np.ndarray:
    """A video row as an array of frames; integer frames (which datasets returns as nested lists or int64) as the uint8
    0-255 pixels they are, which the video processors resize as integers."""
    array = np.asarray(value)
    if array.dtype.kind in "iu" and array.size and array.min() >= 0 and array.max() <= 255:
        array = array.astype(np.uint8)
    return array


class Collate:
    """Worker-side batch preparation: a list of dataset rows → the model's keyword arguments (tensors), by task."""

    def __init__(self, task: str, processor: Any, columns: tuple[str, ...], image_mode: str | None = None):
        self.task, self.processor, self.columns, self.mode = task, processor, columns, image_mode

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        task, processor, columns = self.task, self.processor, self.columns
        if task == TEXT:
            parts = [[row[c] for row in rows] for c in columns]
            for column, texts in zip(columns, parts):
                if any(not isinstance(t, str) for t in texts):
                    raise ValueError(f"Expected text in every row of the {column!r} column, but a row holds None.")
            return dict(processor(*parts, padding=True, truncation=True, return_tensors="pt"))
        if task == AUDIO:
            rate = getattr(processor, "sampling_rate", None)
            arrays = [_audio_array(row[columns[0]], rate, columns[0]) for row in rows]
            kwargs = {} if rate is None else {"sampling_rate": rate}
            return dict(processor(arrays, padding=True, return_tensors="pt", **kwargs))
        if task == VIDEO:
            videos = [_frames(row[columns[0]]) for row in rows]
            return {"pixel_values": processor(videos, return_tensors="pt")["pixel_values"]}
        images = [row[columns[0]] for row in rows]
        if self.mode is not None:
            images = [im.convert(self.mode) if hasattr(im, "convert") and im.mode != self.mode else im for im in images]
        return {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"]}
