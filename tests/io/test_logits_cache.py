"""The logits cache key: one flipped weight bit, a buffer, an attached calibrator, the processor, the split or the
dataset rows each give a new key; entries are written whole and a broken one is recomputed."""

from __future__ import annotations

import logging

import numpy as np
import torch
from _image_data import digits_dataset_dict
from _models import make_model

from hf_calibration.io.logits_cache import cache_key, load_cached, model_fingerprint, save_cached


def _processor(mean: float = 0.5):
    from transformers import ViTImageProcessor

    return ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[mean] * 3, image_std=[0.25] * 3)


def _key(model, processor=None, data=None, **overrides):
    processor = processor if processor is not None else _processor()
    data = data if data is not None else digits_dataset_dict()["test"]
    kwargs = {"split": "test", "image_column": "img", "label_column": "digit", "image_mode": "RGB", **overrides}
    return cache_key(model, processor, data, **kwargs)[0]


def test_one_flipped_bit_of_one_weight_changes_the_fingerprint():
    model = make_model("vit", seed=0)
    before = model_fingerprint(model)["weights"]
    assert model_fingerprint(make_model("vit", seed=0))["weights"] == before  # same weights, same hash
    with torch.no_grad():
        w = model.classifier.weight
        bits = w.view(torch.int32)
        bits[0, 0] ^= 1  # the last mantissa bit of one float
    assert model_fingerprint(model)["weights"] != before


def test_every_input_of_the_logits_is_in_the_key():
    from hf_calibration.calibrators import TemperatureScaling

    model = make_model("vit", seed=0)
    data = digits_dataset_dict()["test"]
    base = _key(model, data=data)
    assert _key(model, data=data) == base
    assert _key(model, processor=_processor(mean=0.4), data=data) != base
    assert _key(model, data=data, split="validation") != base
    assert _key(model, data=data, image_mode="L") != base
    assert _key(model, data=data, label_column="other") != base
    assert _key(model, data=data.select(range(10))) != base
    assert _key(make_model("vit", seed=1), data=data) != base
    assert _key(make_model("resnet", seed=0), data=data) != base
    calibrator = TemperatureScaling().fit(torch.randn(64, 10) * 3, torch.randint(0, 10, (64,)))
    calibrator.attach(model)
    assert _key(model, data=data) != base  # an attached calibrator changes the outputs
    calibrator.detach()
    assert _key(model, data=data) == base
    resnet = make_model("resnet", seed=0)
    key = _key(resnet, data=data)
    resnet.train()(torch.rand(4, 1, 8, 8))  # updates BatchNorm running statistics: buffers, not parameters
    assert _key(resnet, data=data) != key


def test_a_dataset_without_fingerprint_is_not_cached():
    class Rows(list):
        pass

    key, description = cache_key(
        make_model("vit"), _processor(), Rows([1, 2]), split=None, image_column="i", label_column="l", image_mode=None
    )
    assert key is None and description["dataset"]["fingerprint"] is None
    assert description["not_cached"] == "the dataset has no fingerprint"


def test_what_the_key_cannot_describe_is_not_cached():
    # issue 23 item 4: a forward hook that rewrites the logits got the old cached logits; a plain callable processor
    # was keyed by its repr
    from hf_calibration.calibrators import TemperatureScaling

    model = make_model("vit", seed=0)
    assert _key(model) is not None
    handle = model.register_forward_hook(lambda module, args, output: output)
    assert _key(model) is None
    assert (
        "forward hooks the cache cannot key"
        in cache_key(
            model,
            _processor(),
            digits_dataset_dict()["test"],
            split="test",
            image_column="img",
            label_column="digit",
            image_mode="RGB",
        )[1]["not_cached"]
    )
    handle.remove()
    handle = model.classifier.register_forward_pre_hook(lambda module, args: None)  # on a submodule
    assert _key(model) is None
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: output)  # global
    try:
        assert _key(model) is None
    finally:
        handle.remove()
    calibrator = TemperatureScaling().fit(torch.randn(64, 10) * 3, torch.randint(0, 10, (64,)))
    calibrator.attach(model)  # the attached calibrator's own hook is keyed by its weights
    try:
        assert _key(model) is not None
    finally:
        calibrator.detach()
    assert _key(model) is not None
    for processor in (lambda images, return_tensors: None, "P"):
        key, description = cache_key(
            model,
            processor,
            digits_dataset_dict()["test"],
            split="test",
            image_column="img",
            label_column="digit",
            image_mode="RGB",
        )
        assert key is None and "without to_dict()" in description["not_cached"]


def test_entries_round_trip_and_broken_ones_are_ignored(tmp_path, caplog):
    logits, labels = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32), np.arange(5) % 3
    path = save_cached(tmp_path / "c", "k1", {"what": 1}, logits, labels)
    assert path == tmp_path / "c" / "k1.npz" and not list((tmp_path / "c").glob(".k1*"))  # no temporary left
    got = load_cached(tmp_path / "c", "k1")
    np.testing.assert_array_equal(got[0], logits)
    np.testing.assert_array_equal(got[1], labels)
    assert load_cached(tmp_path / "c", "missing") is None
    (tmp_path / "c" / "k2.npz").write_bytes(b"not a zip")
    with caplog.at_level(logging.WARNING, logger="hf_calibration.io.logits_cache"):
        assert load_cached(tmp_path / "c", "k2") is None
    assert "unreadable" in caplog.text
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="hf_calibration.io.logits_cache"):
        assert save_cached(blocker / "sub", "k", {}, logits, labels) is None  # warns, never raises
    assert "could not write" in caplog.text
