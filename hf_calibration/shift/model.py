"""The model route of ``shift_report``: a model and an image dataset in, the report out.

``predict_logits`` runs the model over the clean calibration split, the clean test split, the test split
under each (corruption, severity), and an optional OOD dataset; the corruption is applied inside the image
processor (:class:`CorruptingProcessor`), before resizing, so images are corrupted at their stored size
(32 px for CIFAR: the CIFAR-10-C protocol; crop ImageNet-size images to 224 px first to follow ImageNet-C).
Logits are cached per corruption: the processor's configuration, which keys the logits cache, names the
corruption, severity and seed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hf_calibration.shift.parameters import BENCHMARK_CORRUPTIONS
from hf_calibration.shift.report import ShiftReport, _calibrator_specs, shift_report
from hf_calibration.shift.transform import (
    SEVERITIES,
    ImageChangingProcessor,
    _check_name,
    _check_preset,
    _check_severity,
    _corrupt,
)

logger = logging.getLogger(__name__)


class CorruptingProcessor(ImageChangingProcessor):
    """An image processor that corrupts each image (per-image seeds, as ``corruption_transform``) and then
    calls the model's own processor. ``to_dict()`` adds the corruption to the inner processor's
    configuration, so a logits cache keyed on it keeps one entry per corruption × severity × seed."""

    def __init__(self, processor: Any, name: str, severity: int, seed: int = 0, preset: str | None = None):
        from hf_calibration._core.checks import check_int

        self.processor, self.name, self.severity = processor, _check_name(name), _check_severity(severity)
        self.seed, self.preset = check_int(seed, "seed", minimum=0), _check_preset(preset)

    def _change(self, image, seed):
        return _corrupt(image, self.name, self.severity, np.random.RandomState(seed), self.preset)

    def _what(self):
        return "corruption", {"name": self.name, "severity": self.severity, "seed": self.seed, "preset": self.preset}

    def __repr__(self) -> str:
        return f"CorruptingProcessor({self.name!r}, {self.severity}, seed={self.seed}, preset={self.preset!r}, processor={self.processor!r})"


def model_shift_report(
    model: Any,
    dataset: Any,
    *,
    split: str | None = "test",
    val_dataset: Any = None,
    val_split: str | None = "val",
    calibrators: Sequence[Any] | Mapping[str, Any] = ("ts", "smart"),
    corruptions: Sequence[str] = BENCHMARK_CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    ood_dataset: Any = None,
    ood_split: str | None = None,
    seed: int = 0,
    preset: str | None = None,
    image_processor: Any = None,
    cache_dir: Any = None,
    n_bins: int = 15,
    **predict_kwargs: Any,
) -> ShiftReport:
    """:func:`shift_report` for a model and an image dataset.

    Args:
        model: a model folder / Hub id or a model object (see :func:`hf_calibration.io.predict_logits`).
        dataset: the dataset (Hub id, ``save_to_disk`` folder, image folder or ``datasets`` object) whose
            ``split`` is the clean test set, and whose ``val_split`` (unless ``val_dataset`` is given) is the
            clean calibration set the calibrators named in ``calibrators`` are fitted on.
        corruptions, severities: which shifted test sets to build (each image corrupted with its own seed,
            derived from ``seed`` and its pixels).
        ood_dataset, ood_split: an out-of-distribution dataset for the OOD table.
        cache_dir: the logits cache (one entry per clean split and per corruption × severity).
        **predict_kwargs: ``batch_size``, ``image_column``, ``label_column``, ``max_samples``, ``device``,
            ``num_workers``, ``config_name``, ``revision``... passed to ``predict_logits``.
    """
    from hf_calibration.io.data import load_image_dataset
    from hf_calibration.io.inference import _best_device, predict_logits
    from hf_calibration.io.model_loading import load_image_classifier

    corruptions = [_check_name(c) for c in corruptions]
    severities = [_check_severity(s) for s in severities]
    _calibrator_specs(calibrators)  # a bad or doubled calibrator fails now, not after every corruption has run
    model, processor = load_image_classifier(model, image_processor, revision=predict_kwargs.pop("revision", None))
    if predict_kwargs.get("device") is None:  # loaded once here, so predict_logits sees an object: choose its device
        predict_kwargs["device"] = _best_device()

    def run(data, data_split, proc=processor, what="clean", **kwargs):
        logger.info("shift_report: logits of %s", what)
        return predict_logits(model, data, proc, split=data_split, cache_dir=cache_dir, **{**predict_kwargs, **kwargs})

    config = predict_kwargs.pop("config_name", None)  # each split is loaded once, then passed on as a Dataset
    val_data = load_image_dataset(dataset if val_dataset is None else val_dataset, val_split, config_name=config)
    test_data = load_image_dataset(dataset, split, config_name=config)
    val = run(val_data, None, what="the calibration split")
    test = run(test_data, None, what="the test split")
    shifted = {}
    for name in corruptions:
        for severity in severities:
            proc = CorruptingProcessor(processor, name, severity, seed=seed, preset=preset)
            shifted[(name, severity)] = run(test_data, None, proc, what=f"{name} at severity {severity}")
    ood = None
    if ood_dataset is not None:
        data = _ood_dataset(
            ood_dataset, ood_split
        )  # its own columns: the image / label column options are the test set's
        z_ood, _ = run(data, None, what="the OOD dataset", image_column=None, label_column=None)
        ood = {
            str(ood_dataset) if isinstance(ood_dataset, (str, os.PathLike)) else "ood": z_ood
        }  # the OOD table names the set
    return shift_report(val, test, shifted, calibrators=calibrators, ood_logits=ood, n_bins=n_bins)


def _ood_dataset(ood_dataset: Any, split: str | None):
    """The OOD split as a ``datasets.Dataset``; a dataset without labels gets a constant ``label`` column (unused)."""
    from hf_calibration.io.data import find_label_column, load_image_dataset

    data = load_image_dataset(ood_dataset, split, default_split="test")
    try:
        find_label_column(data.features)
    except ValueError:
        data = data.add_column("label", [0] * len(data))
    return data
