"""Logits of a classifier over a dataset: ``predict_logits(model, dataset) -> (logits, labels)``, for image, text,
audio and video models alike.

One call replaces the loop every calibration workflow starts with: load the model and its preprocessor (the task's:
:mod:`hf_calibration.io.modality`), find the dataset's input and label columns, run the model batch by batch under
``torch.inference_mode`` (a ``DataLoader`` decodes and preprocesses the inputs in worker processes), and
return the logits in dataset order. Under ``torchrun`` / ``accelerate launch`` every process runs a
contiguous shard and the shards are gathered in rank order, so each sample appears exactly once and the
result equals a single process's. With ``cache_dir`` the result is stored on disk under a key of the
model's weights, the dataset's fingerprint and split and the preprocessing (see
:mod:`hf_calibration.io.logits_cache`): a second run is a file read, and a changed model is recomputed.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core import distributed
from hf_calibration._core.checks import check_folder_or_hub_id, check_int
from hf_calibration._core.disk_logits import LogitsWriter
from hf_calibration._core.inputs import whole_labels
from hf_calibration.io.data import find_label_column, load_image_dataset
from hf_calibration.io.logits_cache import cache_key, load_cached, save_cached
from hf_calibration.io.modality import Collate, find_input_columns, prepare_dataset
from hf_calibration.io.model_loading import IMAGE_TASK, load_classifier, pipeline_task_of

__all__ = ["predict_logits"]

logger = logging.getLogger(__name__)

_MODES = {1: "L", 3: "RGB"}  # image channels the model takes → PIL mode images are converted to


def _best_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _image_mode(model: nn.Module, processor: Any) -> str | None:
    """The PIL mode the model's images must have: ``RGB`` for 3 channels, ``L`` for 1 (None: leave images alone)."""
    data_config = getattr(processor, "data_config", None)  # timm: input_size = (C, H, W)
    if isinstance(data_config, dict) and "input_size" in data_config:
        return _MODES.get(int(data_config["input_size"][0]))
    return _MODES.get(int(getattr(getattr(model, "config", None), "num_channels", 3) or 3))


def _labels(data, column: str, model: nn.Module) -> np.ndarray:
    """The label column as int64, mapped onto the model's class indices when both sides name their classes
    and the names agree in a different order (a silent mismatch would give wrong metrics)."""
    values = np.asarray(data.with_format("numpy", columns=[column])[column])
    if values.dtype == object:  # a null among integers, or one-element lists
        values = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if values.ndim == 2 and values.shape[1] == 1:  # a one-logit binary head's (N, 1) float labels (transformers' BCE)
        values = values[:, 0]
    labels = whole_labels(values, column).astype(np.int64)
    feature = data.features[column]
    id2label = getattr(getattr(model, "config", None), "id2label", None) or {}
    names = getattr(feature, "names", None)
    if not names or not id2label:
        return labels
    model_names = [str(id2label[i]) for i in sorted(id2label)]
    if model_names == list(names) or all(n == f"LABEL_{i}" for i, n in enumerate(model_names)):
        return labels
    if sorted(model_names) == sorted(names) and len(set(names)) == len(names):
        index = {name: i for i, name in enumerate(model_names)}
        logger.info(
            "the dataset orders the class names differently from the model: mapping labels onto the model's indices"
        )
        mapping = np.array([index[name] for name in names], dtype=np.int64)
        valid = (labels >= 0) & (labels < len(names))
        return np.where(valid, mapping[np.clip(labels, 0, len(names) - 1)], labels)
    logger.warning(
        "the dataset's class names (%s...) differ from the model's id2label (%s...); using the label indices as they are",
        list(names)[:3],
        model_names[:3],
    )
    return labels


def _warn_if_classes_are_missing(data, column: str, max_samples: int) -> None:
    """The first ``max_samples`` rows of a dataset sorted by class (an image folder lists its files class by class)
    hold a few classes only: metrics of them, or a calibrator fitted on them, describe those classes alone."""
    labels = np.asarray(data.with_format("numpy", columns=[column])[column])
    present, kept = (np.unique(part[part >= 0]) for part in (labels, labels[:max_samples]))
    if len(kept) < len(present):
        logger.warning(
            "max_samples=%d keeps the first %d rows, which hold %d of the %d classes of the split (an image folder "
            "lists its images class by class): the metrics, or a calibrator fitted on them, describe those classes "
            "only. Shuffle the dataset first (dataset.shuffle(seed=0)) or use more samples.",
            max_samples,
            max_samples,
            len(kept),
            len(present),
        )


def _run(
    model: nn.Module,
    collate: Collate,
    data,
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int,
    progress: bool,
    num_labels: int,
    sink=None,
) -> torch.Tensor | None:
    """The logits of ``data`` in order: into one preallocated (N, K) float32 tensor (no list of batches to concatenate:
    the peak is the logits once), or, with ``sink`` (a ``disk_logits.LogitsWriter`` factory taking K), written batch by
    batch to disk (None is returned)."""
    from hf_calibration._core.progress import progress_iter

    loader = torch.utils.data.DataLoader(
        data.select_columns(list(collate.columns)),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=device.type == "cuda",
    )
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    out: torch.Tensor | None = None
    writer = None
    row = 0
    try:
        with torch.inference_mode():
            for batch in progress_iter(loader, desc="logits", enabled=progress, unit="batch", dynamic_ncols=True):
                inputs = {  # floating inputs (pixels, audio features) in the model's dtype; token ids and masks as they are
                    k: v.to(device, dtype=dtype if v.is_floating_point() else v.dtype, non_blocking=True)
                    for k, v in batch.items()
                }
                logits = model(**inputs).logits.float().cpu()
                if sink is not None:
                    writer = writer or sink(logits.shape[1])
                    writer.write(logits.numpy())
                else:
                    if out is None:
                        out = torch.empty((len(data), logits.shape[1]), dtype=torch.float32)
                    out[row : row + logits.shape[0]] = logits
                row += logits.shape[0]
    except BaseException:
        if writer is not None:
            writer.abort()  # no half-written file is left behind
        raise
    if sink is not None:
        return writer
    return out if out is not None else torch.empty((0, num_labels), dtype=torch.float32)


def _task_of(model: Any, revision: str | None, task: str | None) -> str:
    """The head's kind (``hf_calibration._core.tasks``) before the weights load: an explicit ``task``, else the config of the
    model object or of the folder / Hub id (only ``config.json`` is read); a model without a config is multi-class."""
    from hf_calibration._core.tasks import check_task, task_of_config, task_of_model

    if task is not None:
        return check_task(task)
    if isinstance(model, nn.Module):
        return task_of_model(model) or "multiclass"
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model, revision=revision)
    except (OSError, ValueError, KeyError):  # no readable config: the model loader words that error
        return "multiclass"
    return task_of_config(config) or "multiclass"


def _one_of(value: Any, former: Any, name: str, former_name: str) -> Any:
    """An argument given by its name or by its former name, not both."""
    if value is not None and former is not None:
        raise TypeError(f"Expected argument `{name}` or its former name `{former_name}`, not both.")
    return former if value is None else value


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` this machine has (``ValueError`` naming the argument otherwise)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"Expected argument `device` to be a device such as 'cpu', 'cuda', 'cuda:1' or 'mps', but got {device!r}."
        ) from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not available.get(device.type, True):
        raise ValueError(
            f"Expected argument `device` to be a device this machine has, but got {str(device)!r} "
            f"({device.type} is not available here)."
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"Expected argument `device` to be a device this machine has, but got {str(device)!r} "
            f"({torch.cuda.device_count()} CUDA device(s))."
        )
    return device


def predict_logits(
    model: str | os.PathLike | nn.Module,
    dataset: Any,
    processor: Any = None,
    batch_size: int = 64,
    input_column: str | tuple[str, str] | None = None,
    label_column: str | None = None,
    max_samples: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    split: str | None = None,
    config_name: str | None = None,
    revision: str | None = None,
    dataset_revision: str | None = None,
    device: str | torch.device | None = None,
    num_workers: int | None = None,
    progress: bool = True,
    output: str | os.PathLike | None = None,
    overwrite: bool = False,
    task: str | None = None,
    pipeline_task: str | None = None,
    image_processor: Any = None,
    image_column: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run a classifier (image, text, audio or video) over a dataset and return ``(logits, labels)`` in dataset order.

    Args:
        model: a folder or Hub id, loaded through the Auto class its config names (``AutoModelForImageClassification``,
            ``AutoModelForSequenceClassification``, ``AutoModelForAudioClassification``, ...; timm checkpoints through
            ``TimmWrapperForImageClassification``; MaC-Cal checkpoints with their bottleneck head), or a model object.
        dataset: a ``datasets.Dataset`` / ``DatasetDict``, a ``save_to_disk`` folder, an image folder
            (``imagefolder`` layout), or a Hub dataset id.
        processor: the model's preprocessor (an image processor, a tokenizer, a feature extractor or a video
            processor), or a folder / Hub id; default: the model's own. Its kind must be the model's task's.
        batch_size: inputs per forward pass (per process).
        input_column: the input column(s) (:func:`hf_calibration.io.modality.find_input_columns`); default: the one
            ``datasets.Image`` column, a text column (``text``, ``sentence``, ...) or pair (``sentence1`` /
            ``sentence2``, ``premise`` / ``hypothesis``, ...; tokenized with padding and truncation), the
            ``datasets.Audio`` column (cast to the feature extractor's ``sampling_rate``) or a ``video`` column.
        label_column: default: its one ``ClassLabel`` column, else ``label`` / ``labels``.
        max_samples: use only the first ``max_samples`` rows (a warning says when they miss classes of the split:
            shuffle a dataset sorted by class first).
        cache_dir: cache the result here (see :mod:`hf_calibration.io.logits_cache`); None: no cache.
        split: the dataset split (needed when it has several; ``"val"`` also finds ``"validation"``).
        config_name: the Hub dataset's configuration.
        revision: the model's Hub revision. dataset_revision: the dataset's.
        device: default: the best available (this process's CUDA device, else MPS, else CPU); a model
            object stays where it is unless ``device`` is given.
        num_workers: ``DataLoader`` workers decoding and preprocessing images; default
            ``min(4, CPUs per process)``, 0 for a single batch.
        progress: show a progress bar (on the first process only).
        output: write the logits to this file instead of holding them in memory, a batch at a time (for sets whose
            logits exceed memory, e.g. 1e6 images x 1,000 classes = 4 GB): ``x.npy`` (labels in ``x_labels.npy``),
            ``x.safetensors`` (tensors ``logits`` and ``labels``), or a folder for a ``datasets`` dataset (columns
            ``logits`` and ``label``; ``datasets.load_from_disk`` reads it). The calibrators that fit in blocks of rows
            fit from it directly (``hf_calibration._core.disk_logits``). Under several processes the shards are gathered first
            and the first process writes.
        overwrite: replace an existing ``output``.
        pipeline_task: ``"image-classification"``, ``"text-classification"``, ``"audio-classification"`` or
            ``"video-classification"``; None reads it from the model's config (``architectures``), or from the
            processor's kind for a model without one. One that contradicts the config is a ``ValueError``.
        image_processor, image_column: the former names of ``processor`` and ``input_column``.
        task: the head's kind (``hf_calibration._core.tasks.resolve_task``); None reads the model's ``config.problem_type``.
            A multi-label model's labels come from a list column (``Sequence(ClassLabel)`` of the classes present, or a
            multi-hot vector) and are returned as ``(N, L)`` 0/1; a binary one-logit head's logits are ``(N, 1)``.

    Returns:
        ``(logits, labels)``: float32 ``(N, K)`` and int64 ``(N,)`` numpy arrays (multi-label: ``(N, L)`` labels), row
        ``i`` for dataset row ``i``, identical on every process. With ``output``, ``logits`` reads the written file: a
        read-only memory-mapped array for ``.npy``, a :class:`~hf_calibration._core.disk_logits.DiskLogits` otherwise. Labels
        are mapped onto the model's class indices when the dataset's ``ClassLabel`` names are the model's ``id2label``
        names in another order.

    Example::

        logits, labels = predict_logits("google/vit-base-patch16-224", "imagenet-1k", split="validation")
        SMARTCalibrator().fit(logits, labels)
    """
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    processor = _one_of(processor, image_processor, "processor", "image_processor")
    input_column = _one_of(input_column, image_column, "input_column", "image_column")
    if isinstance(model, (str, os.PathLike)):
        check_folder_or_hub_id(model, "model")
    if device is not None:
        device = check_device(device)
    if max_samples is not None:
        max_samples = check_int(max_samples, "max_samples", minimum=1)
    if num_workers is not None:
        num_workers = check_int(num_workers, "num_workers", minimum=0)
    if not isinstance(overwrite, bool):
        raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"Expected argument `output` to be a file or folder path, but got {type(output).__name__}.")
    distributed.init_from_environment()
    rank, world_size = distributed.rank_and_world_size()

    data = load_image_dataset(dataset, split, config_name=config_name, revision=dataset_revision)
    pipeline_task = pipeline_task_of(
        model, pipeline_task, processor, revision
    )  # the config alone: bad columns fail fast
    columns = find_input_columns(data.features, pipeline_task, input_column)
    task = _task_of(model, revision, task)
    label_column = find_label_column(
        data.features, label_column, multilabel=task == "multilabel", binary=task == "binary"
    )
    if max_samples is not None and max_samples < len(data):
        if task != "multilabel":
            _warn_if_classes_are_missing(data, label_column, max_samples)
        data = data.select(range(max_samples))
    if len(data) == 0:
        raise ValueError("Expected a dataset with at least one row, but it is empty.")

    given_object = isinstance(model, nn.Module)
    model, processor, pipeline_task = load_classifier(model, processor, task=pipeline_task, revision=revision)
    data = prepare_dataset(data, pipeline_task, columns, processor)

    num_labels = int(getattr(getattr(model, "config", None), "num_labels", 0) or 0)
    mode = _image_mode(model, processor) if pipeline_task == IMAGE_TASK else None
    if task == "multilabel":
        from hf_calibration.io.data import multi_hot_labels

        labels = multi_hot_labels(data, label_column, num_labels)
    else:
        labels = _labels(data, label_column, model)

    key = None
    if cache_dir is not None:
        key, description = cache_key(
            model,
            processor,
            data,
            split=data.split,
            image_column=",".join(columns),
            label_column=label_column,
            image_mode=mode,
        )
        if key is None:
            logger.warning("the logits are not cached: %s", description["not_cached"])
        else:
            cached = load_cached(cache_dir, key)
            misses = distributed.all_reduce_sum(torch.tensor([0 if cached is not None else 1]))
            if int(misses.item()) == 0:  # every process has it: nobody computes
                logger.info("logits from the cache: %s/%s.npz", cache_dir, key)
                if output is not None:
                    return _written(output, cached[0], cached[1], overwrite, rank), cached[1]
                return cached

    if device is not None:
        pass
    elif given_object:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    else:
        device = _best_device()
    shard = distributed.shard_range(len(data), rank, world_size)
    if num_workers is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_workers = 0 if len(shard) <= batch_size else min(4, max(1, cpus // world_size))
    was_training = model.training
    model.eval().to(device)
    stream = output is not None and world_size == 1  # one process writes as it goes; several gather first
    sink = (lambda k: LogitsWriter(output, len(data), k, labels, overwrite=overwrite)) if stream else None
    try:
        logits = _run(
            model,
            Collate(pipeline_task, processor, columns, mode),
            data.select(shard),
            batch_size=batch_size,
            device=device,
            num_workers=num_workers,
            progress=progress and rank == 0,
            num_labels=num_labels,
            sink=sink,
        )
    finally:
        model.train(was_training)
    if stream:
        return logits.close(), labels
    logits = distributed.all_gather_rows(logits).numpy()
    if logits.shape[0] != labels.shape[0]:  # pragma: no cover - a broken shard would be a bug here
        raise RuntimeError(f"gathered {logits.shape[0]} rows of logits for {labels.shape[0]} labels")
    if key is not None and rank == 0:
        save_cached(cache_dir, key, description, logits, labels)
    if output is not None:
        return _written(output, logits, labels, overwrite, rank), labels
    return logits, labels


def _written(output, logits: np.ndarray, labels: np.ndarray, overwrite: bool, rank: int):
    """``logits`` written to ``output`` by the first process (the others wait), read back from it."""
    if rank == 0:
        writer = LogitsWriter(output, logits.shape[0], logits.shape[1], labels, overwrite=overwrite)
        for start in range(0, logits.shape[0], 4096):
            writer.write(logits[start : start + 4096])
        writer.close()
    distributed.all_gather_object(None)  # a barrier: the file is complete before anyone reads it
    from hf_calibration._core.disk_logits import open_logits

    return np.load(output, mmap_mode="r") if str(output).lower().endswith(".npy") else open_logits(output)
