"""The detection ECE / D-ECE / LaECE and pixel ECE `evaluate` scripts: bit for bit the package's functions, their
refusals with the functions' messages, batches and doctests."""

from __future__ import annotations

import doctest
import importlib
import re

import evaluate
import numpy as np
import pytest

from hf_calibration import metric_path
from hf_calibration.detection import d_ece, detection_ece, laece, match_detections
from hf_calibration.segmentation import pixel_calibration_report

DETECTION = {"detection_ece": detection_ece, "d_ece": d_ece, "laece": laece}


@pytest.fixture(scope="module")
def scripts() -> dict[str, evaluate.EvaluationModule]:
    return {name: evaluate.load(metric_path(name)) for name in (*DETECTION, "pixel_ece")}


def _detections(n_images: int = 6, seed: int = 0):
    """Images of 64 x 48 with a few ground-truth boxes and detections near them (jittered) or anywhere."""
    rng = np.random.default_rng(seed)
    preds, refs = [], []
    for i in range(n_images):
        g = rng.integers(1, 4)
        xy = rng.uniform(0, 30, (g, 2))
        gt = np.concatenate([xy, xy + rng.uniform(5, 15, (g, 2))], 1)
        near = gt[rng.integers(0, g, 5)] + rng.normal(0, 2, (5, 4))
        boxes = np.concatenate([near, gt[:1] + 20 * (i % 2)], 0).clip(0, 47)
        boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        preds.append(
            {"boxes": boxes, "scores": rng.uniform(0.05, 1, len(boxes)), "labels": rng.integers(0, 2, len(boxes))}
        )
        refs.append({"boxes": gt, "labels": rng.integers(0, 2, g), "image_size": [48.0, 64.0]})
    return preds, refs


def _function(name, preds, refs, iou_threshold=0.5, **kw):
    target = [{"boxes": r["boxes"], "labels": r["labels"]} for r in refs]
    d = match_detections(preds, target, iou_threshold=iou_threshold, image_sizes=[r["image_size"] for r in refs])
    return DETECTION[name](d, **kw)


@pytest.mark.parametrize("name", list(DETECTION))
def test_detection_scripts_are_their_functions_bit_for_bit(name, scripts):
    preds, refs = _detections()
    for kw in ({}, {"score_threshold": 0.3, "iou_threshold": 0.4, "n_bins": 4}):
        got = scripts[name].compute(predictions=preds, references=refs, **kw)
        assert got == {name: _function(name, preds, refs, **kw)}
    for start in range(0, 6, 2):  # in batches: the same
        scripts[name].add_batch(predictions=preds[start : start + 2], references=refs[start : start + 2])
    assert scripts[name].compute(score_threshold=0.2) == {name: _function(name, preds, refs, score_threshold=0.2)}


def test_d_ece_script_takes_the_features_and_empty_images(scripts):
    preds, refs = _detections(seed=1)
    preds[2] = {"boxes": np.zeros((0, 4)), "scores": [], "labels": []}  # an image without detections
    refs[3] = {"boxes": [], "labels": [], "image_size": [48.0, 64.0]}  # an image without ground truth
    kw = {"features": ["cx", "w"], "n_bins": [5, 2, 3], "score_threshold": 0.1}
    assert scripts["d_ece"].compute(predictions=preds, references=refs, **kw) == {
        "d_ece": _function("d_ece", preds, refs, **kw)
    }


def test_pixel_script_is_the_function_bit_for_bit(scripts):
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 3, (3, 4, 6, 5))
    target = rng.integers(0, 4, (3, 6, 5))
    target[0, :2] = 255
    got = scripts["pixel_ece"].compute(predictions=logits, references=target, boundary_width=1)
    expected = pixel_calibration_report(logits, target, boundary_width=1)
    assert got == {f"pixel_{key}": value for key, value in expected.items()}
    # images of two sizes: streamed image by image, the same pixels
    small = rng.normal(0, 3, (4, 3, 3))
    got = scripts["pixel_ece"].compute(predictions=[logits[0], small], references=[target[0], target[1, :3, :3]])
    both = np.concatenate([logits[0].reshape(4, -1), small.reshape(4, -1)], 1)[:, None]  # one row of pixels
    labels = np.concatenate([target[0].reshape(-1), target[1, :3, :3].reshape(-1)])[None, None]
    assert got["pixel_ece"] == pytest.approx(pixel_calibration_report(both[None], labels)["ece"], abs=1e-12)


def test_scripts_refuse_what_the_functions_refuse(scripts):
    preds, refs = _detections(n_images=2, seed=3)
    bad = [
        ({**preds[0], "scores": np.r_[np.nan, preds[0]["scores"][1:]]}, refs[0]),  # a NaN score
        ({**preds[0], "boxes": preds[0]["boxes"] + 500}, refs[0]),  # boxes wholly outside the image
    ]
    for p, r in bad:
        with pytest.raises((TypeError, ValueError)) as by_function:
            _function("detection_ece", [p], [r])
        with pytest.raises(type(by_function.value), match=re.escape(str(by_function.value))):
            scripts["detection_ece"].compute(predictions=[p], references=[r])
    logits, target = np.zeros((1, 3, 2, 2)), np.array([[[0, 1], [3, 255]]])  # label 3 >= K = 3
    with pytest.raises(ValueError) as by_function:
        pixel_calibration_report(logits, target)
    with pytest.raises(ValueError, match=re.escape(str(by_function.value))):
        scripts["pixel_ece"].compute(predictions=logits, references=target)
    with pytest.raises(ValueError, match="`predictions` to be non-empty"):
        scripts["d_ece"].compute(predictions=[], references=[])


@pytest.mark.parametrize("name", [*DETECTION, "pixel_ece"])
def test_script_docstring_examples(name, scripts):
    module = importlib.import_module(type(scripts[name]).__module__)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
