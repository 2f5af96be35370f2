"""The issue's failing example, end to end: a tiny ViT built with problem_type="multi_label_classification".

Before: a softmax temperature scaling attached to it without a word, and the pipeline served the sigmoid of
softmax-calibrated logits (scores summing to 2.9). Now: the softmax calibrator is refused with a message naming
problem_type, at attach and at load; a sigmoid calibrator is fitted, saved beside the model, loaded with it, and the
pipeline returns each label's calibrated sigmoid probability (checked by hand against sigmoid(a z + b))."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _image_data import MEAN, STD, digits_dataset_dict
from _models import make_model

LABELS = 3


def _multi_hot(digits: np.ndarray) -> np.ndarray:
    """Three tags of a digit: below 5, even, drawn with a loop (0, 6, 8, 9)."""
    return np.stack([digits < 5, digits % 2 == 0, np.isin(digits, [0, 6, 8, 9])], axis=1).astype(np.int64)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from transformers import ViTImageProcessor

    folder = tmp_path_factory.mktemp("multilabel") / "vit"
    model = make_model(
        "vit", seed=0, num_channels=3, num_labels=LABELS, problem_type="multi_label_classification"
    ).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)  # random-init logits are ~0.05: make the calibration visible
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD).save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def images():
    data = digits_dataset_dict()
    return list(data["validation"]["img"]), np.asarray(data["validation"]["digit"]), list(data["test"]["img"][:5])


def _logits(folder: Path, model, images) -> torch.Tensor:
    from transformers import AutoImageProcessor

    pixels = AutoImageProcessor.from_pretrained(folder)(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixel_values=pixels).logits.double()


def test_softmax_calibrator_is_refused_naming_problem_type(repo, images, tmp_path):
    from hf_calibration import load_calibrated_model, pipeline
    from hf_calibration.calibrators import TemperatureScaling

    folder, model = repo
    rng = np.random.default_rng(0)
    y = rng.integers(0, LABELS, 300)
    ts = TemperatureScaling().fit(rng.normal(size=(300, LABELS)) * 3 + 3 * np.eye(LABELS)[y], y, progress_bar=False)
    with pytest.raises(ValueError, match=r"problem_type=.multi_label_classification.*Fit a sigmoid calibrator"):
        ts.attach(model)
    # saved beside the model: loading the calibrated model refuses it too, never the silent mix
    import shutil

    copy = tmp_path / "vit"
    shutil.copytree(folder, copy)
    ts.save_pretrained(copy / "calibrator")
    with pytest.raises(ValueError, match="problem_type='multi_label_classification'"):
        load_calibrated_model(copy)
    with pytest.raises(ValueError, match="problem_type='multi_label_classification'"):
        pipeline("image-classification", model=str(copy))


def test_sigmoid_calibrator_end_to_end(repo, images, tmp_path):
    import shutil

    from hf_calibration import load_calibrated_model, pipeline
    from hf_calibration.calibrators import PlattScaling
    from hf_calibration.calibrators.attach import attached_calibrator
    from hf_calibration.metrics import nll

    folder, model = repo
    val_images, val_digits, test_images = images
    val_logits = _logits(folder, model, val_images)
    labels = _multi_hot(val_digits)
    platt = PlattScaling().fit(val_logits, labels, progress_bar=False)
    assert platt.fit_info_["task"] == "multilabel"
    assert nll(platt(val_logits), labels) < nll(val_logits, labels)  # on the fit set: the fit lowers the BCE

    copy = tmp_path / "vit"
    shutil.copytree(folder, copy)
    platt.save_pretrained(copy / "calibrator")
    loaded = load_calibrated_model(copy)
    assert isinstance(attached_calibrator(loaded), PlattScaling)

    z = _logits(copy, model, test_images)
    a, b = platt.weight.detach().double(), platt.bias.detach().double()
    expected = torch.sigmoid(a * z + b).numpy()  # by hand: each label's calibrated probability
    classify = pipeline("image-classification", model=str(copy), top_k=LABELS)
    for i, image in enumerate(test_images):
        scores = {row["label"]: row["score"] for row in classify(image)}
        got = np.array([scores[model.config.id2label[l]] for l in range(LABELS)])
        assert got == pytest.approx(expected[i], abs=1e-5)  # the pipeline runs in float32
    assert not np.allclose(expected.sum(axis=1), 1.0)  # independent sigmoids, not a softmax
    assert classify._postprocess_params["function_to_apply"].value == "sigmoid"  # said explicitly, from the head


def test_binary_one_logit_head(tmp_path):
    """A binary head with one logit (problem_type multi_label_classification, num_labels 1): a sigmoid calibrator
    attaches, a softmax one is refused; two softmax logits take the same binary calibrator."""
    from hf_calibration.calibrators import SigmoidTemperatureScaling, TemperatureScaling

    one = make_model("vit", seed=0, num_channels=3, num_labels=1, problem_type="multi_label_classification").eval()
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 400)
    z = 4 * (2 * y - 1) + 3 * rng.normal(size=400)
    ts = SigmoidTemperatureScaling().fit(z[:, None], y, progress_bar=False)
    ts.attach(one)
    pixels = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        calibrated = one(pixel_values=pixels).logits
    ts.detach()
    with torch.no_grad():
        plain = one(pixel_values=pixels).logits
    assert torch.allclose(calibrated, plain / ts.fitted_temperature, atol=1e-6)
    two = make_model("vit", seed=0, num_channels=3, num_labels=2).eval()
    ts.attach(two)  # a binary calibrator fits a two-logit softmax head (its log-odds)
    ts.detach()
    with pytest.raises(ValueError, match="problem_type"):
        TemperatureScaling().fit(np.stack([np.zeros(400), z], 1), y, progress_bar=False).attach(one)
