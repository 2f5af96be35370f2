"""Dataset loading and column detection: the three sources, split aliases, and errors that name the candidates."""

from __future__ import annotations

import datasets
import pytest
from _image_data import digits_dataset_dict, write_image_folder

from hf_calibration.io.data import find_image_column, find_label_column, load_image_dataset, select_split


def _features(**columns):
    return datasets.Features(columns)


IMAGE, LABEL = datasets.Image(), datasets.ClassLabel(names=["a", "b"])


@pytest.mark.parametrize(
    "features, image, label",
    [
        (_features(img=IMAGE, digit=LABEL), "img", "digit"),
        (_features(image=IMAGE, label=datasets.Value("int64")), "image", "label"),
        (_features(pixels=IMAGE, labels=datasets.Value("int32"), id=datasets.Value("int64")), "pixels", "labels"),
        # two ClassLabels, one of them named label: that one
        (_features(image=IMAGE, label=LABEL, coarse=datasets.ClassLabel(names=["x", "y"])), "image", "label"),
    ],
)
def test_columns_are_found_from_the_features(features, image, label):
    assert find_image_column(features) == image
    assert find_label_column(features) == label


@pytest.mark.parametrize(
    "features, which, match",
    [
        (_features(a=IMAGE, b=IMAGE, label=LABEL), "image", r"several image columns \['a', 'b'\]"),
        (
            _features(path=datasets.Value("string"), label=LABEL),
            "image",
            r"no datasets.Image column \(columns: path \(Value\)",
        ),
        (
            _features(image=IMAGE, fine_label=LABEL, coarse_label=LABEL),
            "label",
            r"several ClassLabel columns \['fine_label', 'coarse_label'\]",
        ),
        (
            _features(image=IMAGE, label=datasets.Value("int64"), labels=datasets.Value("int64")),
            "label",
            r"both integer columns \['label', 'labels'\]",
        ),
        (_features(image=IMAGE, target=datasets.Value("int64")), "label", r"no ClassLabel column.*target \(Value\)"),
        (_features(image=IMAGE, label=datasets.Value("string")), "label", r"no ClassLabel column"),
    ],
)
def test_ambiguous_or_missing_columns_name_the_candidates(features, which, match):
    find = find_image_column if which == "image" else find_label_column
    with pytest.raises(ValueError, match=match):
        find(features)


def test_explicit_columns_are_checked():
    features = _features(image=IMAGE, fine=LABEL, caption=datasets.Value("string"))
    assert find_label_column(features, "fine") == "fine"
    with pytest.raises(ValueError, match=r"`label_column`.*'nope'.*image \(Image\), fine \(ClassLabel\)"):
        find_label_column(features, "nope")
    with pytest.raises(ValueError, match=r"class indices.*'caption'"):
        find_label_column(features, "caption")
    with pytest.raises(ValueError, match="`image_column`"):
        find_image_column(features, "photo")


@pytest.mark.parametrize(
    "splits, split, default, want",
    [
        (["train", "validation", "test"], "val", None, "validation"),
        (["train", "val", "test"], "validation", None, "val"),
        (["train", "validation", "test"], None, "val", "validation"),
        (["train", "validation", "test"], None, "test", "test"),
        (["train"], None, "val", "train"),  # a single split is used whatever the default
        (["train", "test"], "test", "val", "test"),
    ],
)
def test_split_selection(splits, split, default, want):
    assert select_split(splits, split, "d", default) == want


def test_split_errors_list_the_splits():
    with pytest.raises(ValueError, match=r"got 'validation'; it has \['test', 'train'\]"):
        select_split(["train", "test"], "validation", "d")
    with pytest.raises(ValueError, match=r"several splits \['test', 'train'\]"):
        select_split(["train", "test"], None, "d", "val")


def test_the_three_local_sources(tmp_path):
    saved = digits_dataset_dict()
    saved.save_to_disk(str(tmp_path / "dict"))
    saved["test"].save_to_disk(str(tmp_path / "single"))
    write_image_folder(tmp_path / "folder")

    from_dict = load_image_dataset(tmp_path / "dict", "test")
    assert from_dict.num_rows == 37 and from_dict["digit"] == saved["test"]["digit"]
    assert load_image_dataset(str(tmp_path / "dict"), default_split="val").num_rows == 61
    assert load_image_dataset(tmp_path / "single").num_rows == 37
    folder = load_image_dataset(tmp_path / "folder", "validation")
    assert folder.num_rows == 61 and sorted(folder["label"]) == sorted(saved["validation"]["digit"])
    assert find_image_column(folder.features) == "image" and find_label_column(folder.features) == "label"
    assert load_image_dataset(saved, "val").num_rows == 61  # a DatasetDict object
    with pytest.raises(ValueError, match=r"it has \['test', 'validation'\]"):
        load_image_dataset(tmp_path / "dict", "train")
    with pytest.raises(ValueError, match="config_name"):
        load_image_dataset(tmp_path / "folder", "test", config_name="x")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        load_image_dataset(tmp_path / "file.txt")
    with pytest.raises(TypeError, match="`dataset`"):
        load_image_dataset(42)


def test_a_hub_id_asks_for_the_split_names_then_loads_one_split(monkeypatch):
    """The Hub path (offline here, so datasets' two entry points are stood in for): the split is resolved against
    the names the Hub lists ("val" finds "validation") and only that split is loaded, with config and revision."""
    calls = []
    split_data = digits_dataset_dict()["validation"]

    def split_names(name, config_name=None, **kwargs):
        calls.append(("names", name, config_name, kwargs.get("revision")))
        return ["train", "validation", "test"]

    def load(name, config_name=None, *, split=None, revision=None, **kwargs):
        calls.append(("load", name, config_name, split, revision))
        return split_data

    monkeypatch.setattr(datasets, "get_dataset_split_names", split_names)
    monkeypatch.setattr(datasets, "load_dataset", load)
    assert load_image_dataset("org/images", "val", config_name="small", revision="v1") is split_data
    assert calls == [("names", "org/images", "small", "v1"), ("load", "org/images", "small", "validation", "v1")]
    calls.clear()
    load_image_dataset("org/images", default_split="test")
    assert calls[-1] == ("load", "org/images", None, "test", None)
    with pytest.raises(ValueError, match=r"got 'dev2'; it has \['test', 'train', 'validation'\]"):
        load_image_dataset("org/images", "dev2")
