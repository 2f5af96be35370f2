"""predict_logits: the logits of a bare ``model(pixel_values)`` pass, in dataset order, from folders, objects and
image folders; the on-disk cache (and never a stale entry); MaC-Cal checkpoints; labels mapped by class name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _image_data import write_route
from _models import digits_dataset, make_model

from hf_calibration.io import inference, predict_logits

ATOL = 1e-5  # batches of 8 against one batch of all rows: float32 summation order only


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_route(tmp_path_factory.mktemp("route"))


def _split(root, source: str, split: str = "test"):
    import datasets

    if source == "saved":
        return datasets.load_from_disk(str(root / "saved"))[split]
    return datasets.load_dataset("imagefolder", data_dir=str(root / "folder"), split=split)


def _bare_logits(model_dir, data, image_column: str) -> np.ndarray:
    """The reference: transformers' Auto classes, the processor over every image, one forward pass, no DataLoader."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    pixel_values = processor(images=[im.convert("RGB") for im in data[image_column]], return_tensors="pt")[
        "pixel_values"
    ]
    with torch.no_grad():
        return model(pixel_values=pixel_values).logits.numpy()


@pytest.mark.parametrize("name", ["vit", "timm"])
@pytest.mark.parametrize("source", ["saved", "folder"])
def test_logits_equal_a_bare_model_loop_in_dataset_order(root, name, source):
    data = _split(root, source)
    column, label = ("img", "digit") if source == "saved" else ("image", "label")
    logits, labels = predict_logits(
        str(root / name),
        str(root / source),
        split="test",
        batch_size=8,
        progress=False,
        num_workers=2 if (name, source) == ("vit", "saved") else 0,
    )
    assert logits.dtype == np.float32 and labels.dtype == np.int64 and logits.shape == (37, 10)
    np.testing.assert_allclose(logits, _bare_logits(root / name, data, column), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(labels, np.asarray(data[label]))


def test_objects_instead_of_paths_and_max_samples(root):
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(root / "vit")
    model.train()  # left as it was found
    processor = AutoImageProcessor.from_pretrained(root / "vit")
    data = _split(root, "saved", "validation")
    logits, labels = predict_logits(model, data, processor, batch_size=4, max_samples=10, progress=False)
    assert model.training
    np.testing.assert_allclose(logits, _bare_logits(root / "vit", data.select(range(10)), "img"), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(labels, data["digit"][:10])
    # a model object finds its processor where it was loaded from
    again, _ = predict_logits(model, data, batch_size=16, max_samples=10, progress=False)
    np.testing.assert_allclose(again, logits, rtol=0, atol=ATOL)


def test_the_cache_serves_a_second_run_and_recomputes_a_changed_model(root, tmp_path, monkeypatch):
    import shutil

    from transformers import AutoModelForImageClassification

    model_dir = tmp_path / "model"
    shutil.copytree(root / "vit", model_dir)
    cache = tmp_path / "cache"
    first = predict_logits(str(model_dir), str(root / "saved"), split="test", cache_dir=cache, progress=False)
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 2 and entries[0].endswith(".json") and entries[1].endswith(".npz")
    description = json.loads((cache / entries[0]).read_text())
    assert description["dataset"]["split"] == "test" and description["preprocessing"]["image_column"] == "img"

    def no_inference(*args, **kwargs):
        raise AssertionError("the model ran although the cache holds these logits")

    with monkeypatch.context() as m:
        m.setattr(inference, "_run", no_inference)
        second = predict_logits(str(model_dir), str(root / "saved"), split="test", cache_dir=cache, progress=False)
    np.testing.assert_array_equal(second[0], first[0])
    np.testing.assert_array_equal(second[1], first[1])

    # change one weight of the saved model: same folder, same name, new logits
    model = AutoModelForImageClassification.from_pretrained(model_dir)
    with torch.no_grad():
        model.classifier.bias[3] += 2.0
    model.save_pretrained(model_dir)
    changed, _ = predict_logits(str(model_dir), str(root / "saved"), split="test", cache_dir=cache, progress=False)
    np.testing.assert_allclose(changed, _bare_logits(model_dir, _split(root, "saved"), "img"), rtol=0, atol=ATOL)
    assert np.abs(changed[:, 3] - first[0][:, 3] - 2.0).max() < 1e-5  # the new bias, not the cached logits
    assert len(list(cache.glob("*.npz"))) == 2
    # another split, or fewer rows: new entries as well
    predict_logits(str(model_dir), str(root / "saved"), split="test", max_samples=5, cache_dir=cache, progress=False)
    assert len(list(cache.glob("*.npz"))) == 3


def test_a_hook_that_rewrites_the_logits_is_never_served_cached_logits(root, tmp_path, caplog):
    # issue 23 item 4: the cache key ignored forward hooks other than an attached calibrator's
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(root / "vit")
    cache = tmp_path / "cache"
    plain, _ = predict_logits(model, str(root / "saved"), split="test", cache_dir=cache, progress=False)
    assert len(list(cache.glob("*.npz"))) == 1

    def shift(module, args, output):
        output["logits"] = output["logits"] + torch.arange(10.0)
        return output

    model.register_forward_hook(shift)
    with caplog.at_level("WARNING", logger="hf_calibration"):
        hooked, _ = predict_logits(model, str(root / "saved"), split="test", cache_dir=cache, progress=False)
    np.testing.assert_allclose(hooked - plain, np.tile(np.arange(10.0), (plain.shape[0], 1)), rtol=0, atol=1e-5)
    assert "not cached" in caplog.text and "shift" in caplog.text
    assert len(list(cache.glob("*.npz"))) == 1  # nothing written under a key that does not describe the hook


def test_labels_follow_the_model_class_names(root, tmp_path):
    """A model whose id2label lists the dataset's classes in another order gets labels in its own indices."""
    model = make_model("vit", seed=0, num_channels=3)
    model.config.id2label = {i: str(9 - i) for i in range(10)}
    model.config.label2id = {str(9 - i): i for i in range(10)}
    model.save_pretrained(tmp_path / "reversed")
    from transformers import AutoImageProcessor

    AutoImageProcessor.from_pretrained(root / "vit").save_pretrained(tmp_path / "reversed")
    data = _split(root, "saved")
    _, labels = predict_logits(str(tmp_path / "reversed"), data, progress=False)
    np.testing.assert_array_equal(labels, 9 - np.asarray(data["digit"]))


def test_a_maccal_checkpoint_runs_with_its_bottleneck_head(root, tmp_path):
    from transformers import AutoImageProcessor

    from hf_calibration.maccal import MaCCalConfig, maccal_stage

    data = _split(root, "saved")
    processor = AutoImageProcessor.from_pretrained(root / "vit")
    pixel_values = processor(images=[im.convert("RGB") for im in data["img"]], return_tensors="pt")["pixel_values"]
    model = make_model("vit", seed=0, num_channels=3).eval()
    with torch.no_grad():
        linear_head = model(pixel_values=pixel_values).logits.numpy()
    maccal_stage(
        model, digits_dataset(slice(0, 64), num_channels=3), MaCCalConfig(epochs=1, batch_size=32, progress=False)
    )
    model.eval().save_pretrained(tmp_path / "maccal")
    processor.save_pretrained(tmp_path / "maccal")
    logits, _ = predict_logits(str(tmp_path / "maccal"), data, progress=False)
    with torch.no_grad():
        want = model(pixel_values=pixel_values).logits.numpy()
    np.testing.assert_allclose(logits, want, rtol=0, atol=ATOL)
    assert np.abs(want - linear_head).max() > 1e-2  # the stage replaced the head: equality above is the bottleneck's


def test_bad_input_names_the_argument(root, tmp_path):
    with pytest.raises(ValueError, match="`batch_size`"):
        predict_logits(str(root / "vit"), str(root / "saved"), split="test", batch_size=0)
    with pytest.raises(ValueError, match="`max_samples`"):
        predict_logits(str(root / "vit"), str(root / "saved"), split="test", max_samples=0)
    with pytest.raises(ValueError, match=r"several splits \['test', 'validation'\]"):
        predict_logits(str(root / "vit"), str(root / "saved"))
    with pytest.raises(ValueError, match="`image_column`.*'photo'"):
        predict_logits(str(root / "vit"), str(root / "saved"), split="test", image_column="photo")
    with pytest.raises(TypeError, match="`model`"):
        predict_logits(42, str(root / "saved"), split="test")
    (tmp_path / "bare").mkdir()
    make_model("vit", seed=0, num_channels=3).save_pretrained(tmp_path / "bare")  # no image processor saved
    with pytest.raises(ValueError, match="no image processor .*pass `image_processor`"):
        predict_logits(str(tmp_path / "bare"), str(root / "saved"), split="test")
    with pytest.raises(ValueError, match="`processor` for a model object"):
        predict_logits(make_model("vit", num_channels=3), str(root / "saved"), split="test")


def test_max_samples_that_miss_classes_are_named(root, caplog):
    """An image folder lists its files class by class: its first rows hold a few classes, which a fit would never see."""
    import datasets

    folder = datasets.load_dataset("imagefolder", data_dir=str(root / "folder"), split="validation")
    first = np.asarray(folder["label"][:12])
    want_kept, want_all = len(np.unique(first)), len(np.unique(folder["label"]))
    assert want_kept < want_all  # the premise: sorted by class
    with caplog.at_level("WARNING", logger="hf_calibration.io.inference"):
        predict_logits(str(root / "vit"), folder, max_samples=12, batch_size=12, progress=False)
    assert f"hold {want_kept} of the {want_all} classes of the split" in caplog.text
    caplog.clear()
    shuffled = folder.shuffle(seed=0)
    assert len(np.unique(shuffled["label"][:40])) == want_all
    with caplog.at_level("WARNING", logger="hf_calibration.io.inference"):
        predict_logits(str(root / "vit"), shuffled, max_samples=40, batch_size=40, progress=False)
    assert "classes of the split" not in caplog.text
