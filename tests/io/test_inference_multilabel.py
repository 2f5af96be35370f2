"""predict_logits on a multi-label model: a Sequence(ClassLabel) or multi-hot label column comes back as (N, L) 0/1
labels, the logits as the model gives them; a binary one-logit head's logits as one column."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _image_data import MEAN, STD, digits_dataset_dict
from _models import make_model

from hf_calibration.io import predict_logits


def _tags(digits) -> list[list[int]]:
    return [[t for t, on in enumerate((d < 5, d % 2 == 0, d in (0, 6, 8, 9))) if on] for d in digits]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import datasets
    from transformers import ViTImageProcessor

    folder = tmp_path_factory.mktemp("ml") / "vit"
    model = make_model("vit", seed=0, num_channels=3, num_labels=3, problem_type="multi_label_classification").eval()
    model.save_pretrained(folder)
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD)
    processor.save_pretrained(folder)
    test = digits_dataset_dict()["test"]
    digits = list(test["digit"])
    names = ["below 5", "even", "closed loop"]
    features = datasets.Features(
        {"img": datasets.Image(), "labels": datasets.Sequence(datasets.ClassLabel(names=names))}
    )
    as_indices = datasets.Dataset.from_dict({"img": list(test["img"]), "labels": _tags(digits)}, features=features)
    hot = np.zeros((len(digits), 3), dtype=np.float32)
    for i, tags in enumerate(_tags(digits)):
        hot[i, tags] = 1
    as_vectors = datasets.Dataset.from_dict({"img": list(test["img"]), "labels": hot.tolist()})
    pixels = processor(images=list(test["img"]), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits.numpy()
    return folder, as_indices, as_vectors, hot.astype(np.int64), expected


@pytest.mark.parametrize("form", ["indices", "vectors"])
def test_multi_hot_labels(setup, form):
    folder, as_indices, as_vectors, hot, expected = setup
    logits, labels = predict_logits(
        str(folder), as_indices if form == "indices" else as_vectors, progress=False, num_workers=0
    )
    assert labels.shape == (len(hot), 3) and np.array_equal(labels, hot)
    assert np.allclose(logits, expected, atol=1e-5)


def test_a_softmax_model_refuses_a_multi_label_column(setup, tmp_path):
    _, as_indices, _, _, _ = setup
    model = make_model("vit", seed=0, num_channels=3, num_labels=3).eval()
    with pytest.raises(ValueError, match="label"):
        predict_logits(model, as_indices, image_processor=str(setup[0]), progress=False, num_workers=0)


def test_soft_multi_hot_labels_are_refused_not_rounded(setup):
    """0.7 was rounded to 1 and 0.5 to 0 (issue 39): a multi-label dataset's labels are 0 or 1."""
    import datasets

    folder, _, as_vectors, hot, _ = setup
    soft = hot.astype(np.float32)
    soft[3, 1] = 0.7
    data = datasets.Dataset.from_dict({"img": list(as_vectors["img"]), "labels": soft.tolist()})
    with pytest.raises(ValueError, match=r"row 3 holds 0\.69999.*not rounded"):  # 0.7 stored as float32
        predict_logits(str(folder), data, progress=False, num_workers=0)


@pytest.mark.parametrize("form", ["float", "one-element lists"])
def test_a_one_logit_binary_head_takes_float_labels(setup, tmp_path, form):
    """transformers' BCE loss needs the (N, 1) float labels of a one-logit head; predict_logits refused them ("no ClassLabel
    column and no integer label/labels column", issue 40 item 3). 0.0 / 1.0 are read as 0 / 1; 0.5 is refused."""
    import datasets
    from transformers import ViTImageProcessor

    test = digits_dataset_dict()["test"]
    y = (np.asarray(test["digit"]) < 5).astype(np.float32)
    values = y.tolist() if form == "float" else [[v] for v in y.tolist()]
    data = datasets.Dataset.from_dict({"img": list(test["img"]), "labels": values})
    model = make_model("vit", seed=1, num_channels=3, num_labels=1, problem_type="multi_label_classification").eval()
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD)
    logits, labels = predict_logits(model, data, processor, progress=False, num_workers=0)
    assert logits.shape == (len(y), 1) and np.array_equal(labels, y.astype(np.int64))
    bad = list(values)
    bad[2] = 0.5 if form == "float" else [0.5]
    with pytest.raises(ValueError, match="found 0.5"):
        predict_logits(model, datasets.Dataset.from_dict({"img": list(test["img"]), "labels": bad}), processor,
                       progress=False, num_workers=0)  # fmt: skip


@pytest.mark.parametrize("suffix", [".npy", ".safetensors", ""])
def test_a_multi_label_model_writes_its_logits_to_disk_with_its_labels(setup, tmp_path, suffix):
    """predict_logits(output=...) on a multi-label dataset failed with "Expected 20 labels, but got shape (20, 3)" (issue
    40): the (N, L) labels go beside the logits in every format, and read back."""
    from hf_calibration.io import open_logits

    folder, _, as_vectors, hot, expected = setup
    out = tmp_path / f"ml{suffix}"
    written, labels = predict_logits(str(folder), as_vectors, progress=False, num_workers=0, output=out)
    back = open_logits(out)
    assert np.array_equal(labels, hot) and np.array_equal(back.labels, hot)
    np.testing.assert_allclose(np.asarray(written), expected, atol=1e-5)
    np.testing.assert_allclose(back.read(0, len(hot)), expected, atol=1e-5)
