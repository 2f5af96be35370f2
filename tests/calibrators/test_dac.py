"""Density-aware calibration (DAC): kNN distances against scikit-learn's exact search (with faiss and without), the
per-sample temperature against ``w_0 + w . s`` worked out from those distances, the fit on data whose far samples are
less accurate, save / load, serving through ``load_calibrated_model`` and ``hf_calibration.pipeline`` (features
captured from the head's input, checked against the head input computed by hand), and the ONNX refusal."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from _image_data import MEAN, STD, digits_dataset_dict
from _models import make_model
from sklearn.neighbors import NearestNeighbors

from hf_calibration import load_calibrated_model, load_calibrator, pipeline
from hf_calibration.calibrators import DensityAwareCalibrator, list_calibrators
from hf_calibration.calibrators.dac import knn_distance, logits_and_features

torch.set_num_threads(1)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _sklearn_kth(queries: np.ndarray, reference: np.ndarray, k: int, exclude_self: bool = False) -> np.ndarray:
    nn = NearestNeighbors(n_neighbors=k + int(exclude_self)).fit(_unit(reference))
    return nn.kneighbors(_unit(queries))[0][:, -1]


@pytest.fixture(scope="module")
def density_data():
    """Features in two groups: near the class means (mostly right) and far from them (labels mostly random), logits a
    fixed linear map of the features: a model over-confident exactly where the features are far from the data."""
    rng = np.random.default_rng(0)
    n, d, k = 600, 12, 5
    means = rng.normal(size=(k, d)) * 3
    y = rng.integers(0, k, n)
    far = rng.random(n) < 0.4
    f = means[y] + rng.normal(size=(n, d)) * np.where(far, 4.0, 0.7)[:, None]
    y = np.where(far & (rng.random(n) < 0.6), rng.integers(0, k, n), y)
    z = 2.0 * f @ np.linalg.pinv(means)  # the logits of the nearest-mean direction, sharp everywhere
    return torch.from_numpy(z), torch.from_numpy(y), torch.from_numpy(f.astype(np.float32)), far


@pytest.mark.parametrize("use_faiss", [True, False])
def test_knn_distance_matches_sklearn(use_faiss, monkeypatch):
    if use_faiss:
        pytest.importorskip("faiss")
    else:
        monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError: the torch path
    rng = np.random.default_rng(1)
    q, r = rng.normal(size=(40, 7)).astype(np.float32), rng.normal(size=(90, 7)).astype(np.float32)
    got = knn_distance(torch.from_numpy(q), torch.from_numpy(r), 4).numpy()
    np.testing.assert_allclose(got, _sklearn_kth(q, r, 4), atol=1e-4)
    loo = knn_distance(torch.from_numpy(r), torch.from_numpy(r), 4, exclude_self=True).numpy()
    np.testing.assert_allclose(loo, _sklearn_kth(r, r, 4, exclude_self=True), atol=1e-4)


def test_fit_makes_far_samples_less_confident_and_keeps_every_prediction(density_data):
    z, y, f, far = density_data
    dac = DensityAwareCalibrator(base="temperature_scaling", k=5).fit(z, y, features=f)
    info = dac.fit_info_
    assert info["weights"]["features"] > 0.05 and info["nll_after"] < info["nll_base"] - 0.01
    t = dac.temperature(z, f).numpy()
    assert t[far].mean() > 1.3 * t[~far].mean()
    out = dac(z, features=f)
    assert torch.equal(out.argmax(1), z.argmax(1))
    # T(x) = w_0 + w_f s_f + w_z s_z with s the k-th neighbour distance (left out: the fit set is the reference) over
    # its fit-set mean, computed here with scikit-learn; at serving time the reference is the stored sub-sample
    ref_f = dac.reference_features.float().numpy()
    ref_z = dac.reference_logits.float().numpy()
    s = (
        np.stack([_sklearn_kth(f.numpy(), ref_f, 5), _sklearn_kth(z.numpy(), ref_z, 5)], axis=1)
        / dac.score_scale.numpy()
    )
    w = info["weights"]
    np.testing.assert_allclose(t, w["bias"] + 1e-3 + s @ [w["features"], w["logits"]], rtol=1e-3)
    base = dac.base(z).double()
    np.testing.assert_allclose(out.numpy(), (base / torch.from_numpy(t)[:, None]).numpy(), rtol=1e-6)


def test_reference_is_subsampled_and_saved_beside_the_weights(density_data, tmp_path):
    z, y, f, _ = density_data
    dac = DensityAwareCalibrator(base="ets", k=5, max_reference=100).fit(
        z[:300], y[:300], features=f[:300], reference_features=f[300:], reference_logits=z[300:]
    )
    assert dac.reference_features.shape == (100, 12) and dac.reference_features.dtype == torch.float16
    assert dac.fit_info_["base"] == "ets" and not dac.fit_info_["reference_is_fit_set"]
    dac.save_pretrained(tmp_path / "dac")
    back = load_calibrator(tmp_path / "dac")
    assert type(back) is DensityAwareCalibrator and back.base.fit_info_ == dac.base.fit_info_
    assert torch.equal(back(z, features=f), dac(z, features=f))
    assert "dac" not in list_calibrators()  # it needs features: not among the logits-only calibrators


def test_bad_inputs_name_the_argument(density_data):
    z, y, f, _ = density_data
    dac = DensityAwareCalibrator(base="temperature_scaling", k=5).fit(z, y, features=f)
    with pytest.raises(ValueError, match="`features`"):
        dac(z)
    with pytest.raises(ValueError, match="D = 12"):
        dac(z, features=f[:, :5])
    with pytest.raises(ValueError, match="`features`"):
        DensityAwareCalibrator().fit(z, y)
    with pytest.raises(ValueError, match="`base`"):
        DensityAwareCalibrator(base="dac")
    with pytest.raises(TypeError, match="base.adapt"):
        dac.adapt(z)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny ViT folder with a DAC calibrator in ``calibrator/``, fitted on the model's own head inputs."""
    from transformers import ViTImageProcessor

    folder = tmp_path_factory.mktemp("dac") / "vit"
    model = make_model("vit", seed=0, num_channels=3).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)
    model.save_pretrained(folder)
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD)
    processor.save_pretrained(folder)
    images = list(digits_dataset_dict()["validation"]["img"])
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        feats = model.vit.layernorm(model.vit(pixel_values=pixels).last_hidden_state)[:, 0]  # what the head sees
        logits = model.classifier(feats)
    y = torch.from_numpy(np.asarray(digits_dataset_dict()["validation"]["digit"]))
    dac = DensityAwareCalibrator(base="temperature_scaling", k=3).fit(logits, y, features=feats)
    dac.save_pretrained(folder / "calibrator")
    return folder, model, processor, dac


def _head_input(model, pixels):
    with torch.no_grad():
        return model.vit.layernorm(model.vit(pixel_values=pixels).last_hidden_state)[:, 0]


def test_served_by_load_calibrated_model_and_pipeline(served):
    folder, model, processor, dac = served
    images = list(digits_dataset_dict()["test"]["img"][:6])
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    feats = _head_input(model, pixels)
    want = dac(model.classifier(feats), features=feats).detach()
    got_z, got_f = logits_and_features(model, pixels)  # the helper a user fits with: the same head input
    torch.testing.assert_close(got_f, feats)
    torch.testing.assert_close(got_z, model.classifier(feats))
    loaded = load_calibrated_model(folder)
    with torch.no_grad():
        got = loaded(pixel_values=pixels).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    results = pipeline("image-classification", model=str(folder), top_k=10)(images)
    scores = np.zeros((6, 10))
    for i, row in enumerate(results):
        for entry in row:
            scores[i, int(entry["label"].split("_")[-1])] = entry["score"]
    np.testing.assert_allclose(scores, torch.softmax(want.double(), 1).numpy(), atol=1e-5)


def test_onnx_export_refuses_it(served):
    pytest.importorskip("onnx")
    from hf_calibration.serving import export_onnx

    folder, *_ = served
    with pytest.raises(ValueError, match="Cannot export calibrator 'dac'.*nearest"):
        export_onnx(folder, folder.parent / "m.onnx")
