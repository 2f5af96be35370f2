"""``load_calibrated_model`` / ``hf_calibration.pipeline``: a model folder or Hub repo holding ``calibrator/`` (and
``conformal/``) loads calibrated in one call; without them, the plain model with one warning; with transformers alone,
the same repo loads as the plain model. Calibrated outputs are checked against ``z / T`` computed by hand."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _image_data import MEAN, STD, digits_dataset_dict
from _models import make_model

from hf_calibration import load_calibrated_model, load_calibrator, pipeline
from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.calibrators.attach import attached_calibrator

torch.set_num_threads(1)
LOGGER = "hf_calibration.serving.calibrated_model"


def _save_model(folder: Path):
    """A tiny ViT (3 channels, 8x8) with sizeable logits, and its image processor; returns the model."""
    from transformers import ViTImageProcessor

    model = make_model("vit", seed=0, num_channels=3).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)  # random-init logits are ~0.05: scale them so that T matters
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD).save_pretrained(folder)
    return model


def _fitted_temperature_scaling() -> TemperatureScaling:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (400,), generator=g)
    z = 4 * torch.randn(400, 10, generator=g) + 4 * torch.nn.functional.one_hot(y, 10)  # over-confident: T > 1
    return TemperatureScaling().fit(z, y, progress_bar=False)


def _temperature(calibrator) -> float:
    return float(calibrator.log_temperature.detach().exp())


@pytest.fixture(scope="module")
def images():
    return digits_dataset_dict()["test"]["img"][:4]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A model folder with ``calibrator/``; returns (folder, plain model, T)."""
    folder = tmp_path_factory.mktemp("calibrated") / "vit"
    model = _save_model(folder)
    calibrator = _fitted_temperature_scaling()
    calibrator.save_pretrained(folder / "calibrator")
    T = _temperature(calibrator)
    assert T > 1.5  # the calibration is visible in every check below
    return folder, model, T


def _pixels(folder: Path, images) -> torch.Tensor:
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(folder)(images=images, return_tensors="pt")["pixel_values"]


def _plain_logits(model, pixels) -> np.ndarray:
    with torch.no_grad():
        return model(pixel_values=pixels).logits.double().numpy()


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _scores(results) -> np.ndarray:
    """Pipeline results (all classes) as an (N, K) array in class order."""
    out = np.zeros((len(results), 10))
    for i, row in enumerate(results):
        for entry in row:
            out[i, int(entry["label"].split("_")[-1])] = entry["score"]
    return out


# ----------------------------------------------------------------------------- a folder holding calibrator/


def test_load_calibrated_model_from_a_folder(repo, images):
    folder, model, T = repo
    loaded = load_calibrated_model(folder)
    pixels = _pixels(folder, images)
    with torch.no_grad():
        got = loaded(pixel_values=pixels).logits.double().numpy()
    np.testing.assert_allclose(got, _plain_logits(model, pixels) / T, rtol=1e-5, atol=1e-5)
    assert type(attached_calibrator(loaded)).__name__ == "TemperatureScaling" and not loaded.training
    assert loaded.conformal_predictor is None
    assert not any(
        "calibrator" in key for key in loaded.state_dict()
    )  # the hook is no submodule: save_pretrained unchanged


def test_pipeline_scores_are_the_calibrated_softmax(repo, images):
    folder, model, T = repo
    classify = pipeline("image-classification", model=str(folder), top_k=10)
    want = _softmax(_plain_logits(model, _pixels(folder, images)) / T)
    np.testing.assert_allclose(_scores(classify(images)), want, atol=1e-5)
    # the uncalibrated scores are far from these: the check above sees the calibration
    assert np.abs(_softmax(_plain_logits(model, _pixels(folder, images))) - want).max() > 0.05


def test_a_hub_repo_loads_calibrated_from_the_hub_cache(repo, images, tmp_path):
    """A Hub id resolves through huggingface_hub's cache (offline here): model, image processor and calibrator/."""
    folder, model, T = repo
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, cache / "models--me--vit" / "snapshots" / commit)
    (cache / "models--me--vit" / "refs").mkdir(parents=True)
    (cache / "models--me--vit" / "refs" / "main").write_text(commit)

    loaded = load_calibrated_model("me/vit", cache_dir=cache)
    pixels = _pixels(folder, images)
    with torch.no_grad():
        np.testing.assert_allclose(
            loaded(pixel_values=pixels).logits.double().numpy(), _plain_logits(model, pixels) / T, rtol=1e-5, atol=1e-5
        )
    classify = pipeline("image-classification", model="me/vit", model_kwargs={"cache_dir": cache}, top_k=10)
    np.testing.assert_allclose(_scores(classify(images)), _softmax(_plain_logits(model, pixels) / T), atol=1e-5)


# ----------------------------------------------------------------------------- no calibrator/: the plain model, said once


def test_without_calibrator_the_plain_model_and_one_warning(repo, images, tmp_path, caplog):
    folder, model, _ = repo
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain, ignore=shutil.ignore_patterns("calibrator"))
    pixels = _pixels(folder, images)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = load_calibrated_model(plain)
        classify = pipeline("image-classification", model=plain, top_k=10)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "no calibrator/" in warnings[0] and "uncalibrated" in warnings[0], warnings
    assert attached_calibrator(loaded) is None
    with torch.no_grad():
        np.testing.assert_allclose(
            loaded(pixel_values=pixels).logits.double().numpy(), _plain_logits(model, pixels), atol=1e-6
        )
    np.testing.assert_allclose(_scores(classify(images)), _softmax(_plain_logits(model, pixels)), atol=1e-5)


def test_only_transformers_loads_the_repo_as_the_plain_model(repo, images, tmp_path):
    """Without hf_calibration, the subfolders are invisible: the Auto class and pipeline load the plain model."""
    from PIL import Image

    folder, model, _ = repo
    both = tmp_path / "with_conformal"
    shutil.copytree(folder, both)
    (both / "conformal").mkdir()
    (both / "conformal" / "config.json").write_text(json.dumps({"method": "thr", "alpha": 0.1}))
    paths = []
    for i, image in enumerate(images):
        paths.append(str(tmp_path / f"{i}.png"))
        image.save(paths[-1])
    script = f"""
import json, sys
import torch
sys.modules["hf_calibration"] = None  # not installed, as far as this process can tell
try:
    import hf_calibration
except ImportError:
    pass
else:
    raise SystemExit("hf_calibration is importable")
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline
from PIL import Image
folder, paths = {str(both)!r}, {paths!r}
images = [Image.open(p) for p in paths]
model = AutoModelForImageClassification.from_pretrained(folder).eval()
pixels = AutoImageProcessor.from_pretrained(folder)(images=images, return_tensors="pt")["pixel_values"]
with torch.no_grad():
    logits = model(pixel_values=pixels).logits.double().tolist()
results = pipeline("image-classification", model=folder, top_k=10)(paths)
print(json.dumps({{"logits": logits, "results": results, "type": type(model).__name__}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["type"] == "ViTForImageClassification"
    plain = _plain_logits(model, _pixels(folder, [Image.open(p) for p in paths]))
    np.testing.assert_allclose(np.array(got["logits"]), plain, atol=1e-5)
    np.testing.assert_allclose(_scores(got["results"]), _softmax(plain), atol=1e-5)


# ----------------------------------------------------------------------------- conformal/


def test_conformal_predictor_is_loaded_and_attached_to_the_pipeline(repo, tmp_path, monkeypatch):
    """The loader's contract with ``hf_calibration.conformal``: ``ConformalPredictor.from_pretrained(folder)`` and
    ``attach(pipeline)`` (a stand-in module here; the real one is tested below when it exists)."""
    folder, _, _ = repo
    both = tmp_path / "both"
    shutil.copytree(folder, both)
    (both / "conformal").mkdir()
    (both / "conformal" / "config.json").write_text("{}")
    calls = {}

    class ConformalPredictor:
        @classmethod
        def from_pretrained(cls, path):
            calls["path"] = Path(path)
            return cls()

        def attach(self, pipe, draws="input"):
            calls["attached"], calls["draws"] = pipe, draws
            return pipe

    monkeypatch.setitem(
        sys.modules, "hf_calibration.conformal", types.SimpleNamespace(ConformalPredictor=ConformalPredictor)
    )
    model = load_calibrated_model(both)
    assert isinstance(model.conformal_predictor, ConformalPredictor) and calls["path"] == both / "conformal"
    assert attached_calibrator(model) is not None
    classify = pipeline("image-classification", model=both)
    assert calls["attached"] is classify and calls["draws"] == "input"  # one image, one set, by default
    pipeline("image-classification", model=both, conformal_draws="stream")
    assert calls["draws"] == "stream"


def test_conformal_folder_without_the_module_is_said_and_skipped(repo, tmp_path, monkeypatch, caplog):
    folder, _, _ = repo
    both = tmp_path / "both"
    shutil.copytree(folder, both)
    (both / "conformal").mkdir()
    (both / "conformal" / "config.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "hf_calibration.conformal", None)  # an hf_calibration without the module
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = load_calibrated_model(both)
    assert model.conformal_predictor is None and attached_calibrator(model) is not None
    assert any("prediction sets are not attached" in r.getMessage() for r in caplog.records)


def test_real_conformal_predictor_round_trip(repo, images, tmp_path):
    """With ``hf_calibration.conformal`` present: a predictor saved in conformal/ comes back with the model and gives
    the same prediction sets."""
    conformal = pytest.importorskip("hf_calibration.conformal")
    folder, model, _ = repo
    both = tmp_path / "both"
    shutil.copytree(folder, both)
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 10, (500,), generator=g)
    z = 3 * torch.randn(500, 10, generator=g) + 3 * torch.nn.functional.one_hot(y, 10)
    served = load_calibrator(both / "calibrator")  # the sets fitted behind the served calibrator (else refused)
    predictor = conformal.ConformalPredictor(method="thr").fit(z, y, alpha=0.1, calibrator=served)
    predictor.save_pretrained(both / "conformal")
    loaded = load_calibrated_model(both)
    assert type(loaded.conformal_predictor) is conformal.ConformalPredictor
    np.testing.assert_array_equal(
        np.asarray(loaded.conformal_predictor.predict_sets(z)), np.asarray(predictor.predict_sets(z))
    )
    pipeline("image-classification", model=both)(images)  # attach(pipeline) runs on real inputs


# ----------------------------------------------------------------------------- bad input


def test_bad_arguments_name_themselves(repo):
    folder, _, _ = repo
    with pytest.raises(ValueError, match="`task`"):
        pipeline("object-detection", model=str(folder))
    with pytest.raises(TypeError, match="`model`"):
        pipeline("image-classification", model=make_model("vit"))
    with pytest.raises(TypeError, match="`model`"):
        load_calibrated_model(None)


# ----------------------------------------------------------------------------- issue 29 (fourth sweep)


def test_a_calibrator_folder_that_is_not_one_is_named_not_skipped(repo, tmp_path, caplog):
    """Item 10: a calibrator/ without config.json, or a file named calibrator, loaded the plain model with a warning
    that said the folder did not exist."""
    folder, _, _ = repo
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    (partial / "calibrator" / "config.json").unlink()
    with pytest.raises(
        ValueError,
        match=r"Expected a calibrator checkpoint with a config.json in '.*partial/calibrator', but there is none \(it holds",
    ):
        load_calibrated_model(partial)
    a_file = tmp_path / "a_file"
    shutil.copytree(folder, a_file, ignore=shutil.ignore_patterns("calibrator"))
    (a_file / "calibrator").write_text("not a folder")
    with pytest.raises(ValueError, match=r"'.*a_file/calibrator' to be a folder .* but it is a file"):
        pipeline("image-classification", model=a_file)
    empty = tmp_path / "empty"
    shutil.copytree(folder, empty, ignore=shutil.ignore_patterns("calibrator"))
    (empty / "calibrator").mkdir()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert (
            attached_calibrator(load_calibrated_model(empty)) is None
        )  # nothing there: the plain model, as without it
    assert "(or an empty one)" in caplog.text


def test_a_calibrator_for_another_number_of_classes_is_refused_at_load(repo, tmp_path):
    """Item 10: a calibrator fitted for another K loaded; vector scaling then failed at the first image without naming
    the folder (temperature scaling only logged a line)."""
    from hf_calibration.calibrators import VectorScaling

    folder, _, _ = repo
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (300,), generator=g)
    z = 3 * torch.randn(300, 5, generator=g) + 3 * torch.nn.functional.one_hot(y, 5)
    for calibrator in (
        TemperatureScaling().fit(z, y, progress_bar=False),
        VectorScaling().fit(z, y, progress_bar=False),
    ):
        other = tmp_path / calibrator.kind
        shutil.copytree(folder, other, ignore=shutil.ignore_patterns("calibrator"))
        calibrator.save_pretrained(other / "calibrator")
        with pytest.raises(
            ValueError,
            match=rf"{type(calibrator).__name__} in '.*{calibrator.kind}/calibrator' was fitted on K = 5 classes, but the model .* has 10",
        ):
            load_calibrated_model(other)


def test_a_missing_folder_or_a_file_is_named(repo, tmp_path):
    """Item 11: a missing folder gave OSError "Repo id must be in the form..."; a file gave an UnpicklingError."""
    folder, _, _ = repo
    with pytest.raises(ValueError, match=r"`model` to be a folder or a Hub model id .* no folder '\./no/such/folder'"):
        load_calibrated_model("./no/such/folder")
    with pytest.raises(
        ValueError, match=r"`model` to be a folder or a Hub model id, but '.*model.safetensors' is a file"
    ):
        pipeline("image-classification", model=folder / "model.safetensors")
