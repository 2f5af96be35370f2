"""``export_onnx``: the ONNX graph run by onnxruntime on real images gives the PyTorch model's calibrated probabilities
(to 1e-5) and ``ConformalPredictor.predict_sets``'s sets, for tiny ViT, Swin, ResNet and timm models trained on the
digits; every registered calibrator exports; a calibrator that cannot is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import onnx  # noqa: E402
import onnxruntime  # noqa: E402
from _trained import accuracy, logits_of, pixels, splits, trained  # noqa: E402

from hf_calibration.calibrators import TemperatureScaling, create_calibrator, list_calibrators  # noqa: E402
from hf_calibration.conformal import ConformalPredictor  # noqa: E402
from hf_calibration.serving import CalibratedClassifier, export_onnx, exportable  # noqa: E402

torch.set_num_threads(1)
TOLERANCE = 1e-5


def _run(path, inputs: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in inputs.items()})


# architecture, calibrator of the scores, conformal method and the predictor's own calibrator
CASES = [
    ("vit", "temperature_scaling", "raps", "temperature_scaling"),
    ("swin", "smart", "aps", None),
    ("resnet", "histogram_binning", "thr", "isotonic"),
    ("timm", "spline", "raps", "ets"),
]


@pytest.mark.parametrize("name, kind, method, set_kind", CASES, ids=[c[0] for c in CASES])
def test_onnx_graph_matches_the_calibrated_model_on_real_images(tmp_path, name, kind, method, set_kind):
    data = splits()
    model = trained(name)
    x_cal, x_test = pixels(data.calibration_images), pixels(data.test_images)
    assert accuracy(model, x_test, data.test_labels) > 0.5  # trained for real: far above the 10 % of chance
    z_cal = logits_of(model, x_cal)
    half = len(z_cal) // 2
    calibrator = create_calibrator(kind).fit(z_cal[:half], data.calibration_labels[:half], progress_bar=False)
    predictor = ConformalPredictor(method).fit(
        z_cal[half:],
        data.calibration_labels[half:],
        alpha=0.1,
        calibrator=None if set_kind is None else create_calibrator(set_kind),
    )
    calibrator.attach(model)
    model.__dict__["conformal_predictor"] = predictor
    path = tmp_path / f"{name}.onnx"
    result = export_onnx(model, path, example_inputs=x_test[:8])
    assert result["max_abs_diff"] <= TOLERANCE and result["sets_equal"] in (True, None)

    # onnxruntime on all 200 test images against the PyTorch model, eager: its (attached) calibrated scores, and the
    # predictor's sets drawn from the same uniform stream
    u = predictor.draw_uniforms(len(x_test), generator=7)
    inputs = {"pixel_values": x_test, **({"u": u} if predictor.randomized else {})}
    logits, probabilities, sets = _run(path, inputs)
    with torch.no_grad():
        expected = torch.softmax(model(pixel_values=x_test).logits, dim=1).numpy()
    raw = logits_of(calibrator.detach(), x_test)
    expected_sets = predictor.predict_sets(raw, from_logits=True, generator=7).numpy()
    assert np.abs(probabilities.astype(np.float64) - expected).max() <= TOLERANCE
    np.testing.assert_array_equal(sets, expected_sets)
    assert sets.any(1).all()
    if (
        name != "resnet"
    ):  # sets of several classes occur (the ResNet is 99.5 % accurate: its THR sets are single classes)
        assert sets.sum(1).max() > 1
    np.testing.assert_array_equal(logits.argmax(1), raw.numpy().argmax(1))  # these calibrators keep the prediction

    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["calibrator"] == kind and meta["conformal_method"] == method
    assert float(meta["conformal_q_hat"]) == predictor.fit_info_["q_hat"]
    assert json.loads(meta["id2label"])["3"] == model.config.id2label[3]


class Logits(nn.Module):
    """A "model" whose output is its input, (N, K, 1, 1) read as (N, K): graphs of the calibrator alone, on logits."""

    def forward(self, logits):
        return logits.flatten(1)


@pytest.fixture(scope="module")
def real_logits():
    data = splits()
    model = trained("resnet")
    z = logits_of(model, pixels(data.calibration_images + data.test_images)) * 3  # sharper: an over-confident model
    y = np.concatenate([data.calibration_labels, data.test_labels])
    return z[:300], y[:300], z[300:]


@pytest.mark.parametrize("kind", list_calibrators("multiclass"))  # sigmoid ones: test_sigmoid_heads.py
def test_every_registered_calibrator_exports(tmp_path, real_logits, kind):
    z_fit, y_fit, z_test = real_logits
    assert exportable(kind) is None
    calibrator = create_calibrator(kind).fit(z_fit, y_fit, progress_bar=False)
    predictor = ConformalPredictor("aps", randomized=False).fit(z_fit, y_fit, alpha=0.2, calibrator=calibrator)
    graph = CalibratedClassifier(Logits(), calibrator, predictor)
    path = tmp_path / f"{kind}.onnx"
    export_onnx(graph.model, path, calibrator=calibrator, conformal=predictor, example_inputs=z_test[:4, :, None, None])
    logits, probabilities, sets = _run(path, {"pixel_values": z_test[:, :, None, None]})
    expected = calibrator.predict_proba(z_test, from_logits=True).numpy()
    assert np.abs(probabilities.astype(np.float64) - expected).max() <= TOLERANCE
    np.testing.assert_array_equal(sets, predictor.predict_sets(z_test, from_logits=True).numpy())


def test_a_saturated_predictors_sets_are_predict_sets_in_the_graph(tmp_path):
    """Issue 53 item 11: a predictor whose every calibration score is 1 (the label is each row's least probable class,
    the last rank's score: the whole mass) has q_hat = 1, and every class's score is at most 1, so every set is all K
    classes, in predict_sets as in the graph. The graph's cumulated sums were not capped at 1 (as ``ranked_scores``
    caps them): on rows whose sums round to 1 + 2^-52 it dropped the tail. (test_every_registered_calibrator_exports
    met it with Dirichlet, matrix, vector, temperature scaling and CTS, q_hat = 1, when the ResNet was trained before
    any fit, and not when a fit had already set torch's thread count to 2: tests/_core/test_threads.py.)"""
    g = torch.Generator().manual_seed(0)
    z = 8 * torch.randn(400, 10, generator=g)  # sharp rows: a quarter of their sorted cumulated sums exceed 1
    predictor = ConformalPredictor("aps", randomized=False).fit(z[:200], z[:200].argmin(1), alpha=0.2)
    assert float(predictor.q_hat) == 1.0
    path = tmp_path / "saturated.onnx"
    export_onnx(Logits(), path, calibrator=None, conformal=predictor, example_inputs=z[:4, :, None, None])
    sets = _run(path, {"pixel_values": z[200:, :, None, None]})[2]
    assert predictor.predict_sets(z[200:], from_logits=True).all() and sets.all()


class _Unexportable(TemperatureScaling):
    export_refusal = "its map calls a Python library at every step"


def test_a_calibrator_that_cannot_export_is_refused_by_name(tmp_path, real_logits):
    z_fit, y_fit, _ = real_logits
    calibrator = _Unexportable().fit(z_fit, y_fit, progress_bar=False)
    with pytest.raises(ValueError, match="temperature_scaling.*Python library"):
        export_onnx(
            Logits(),
            tmp_path / "x.onnx",
            calibrator=calibrator,
            conformal=None,
            example_inputs=z_fit[:2, :, None, None],
        )
    assert not (tmp_path / "x.onnx").exists()


def test_export_refuses_an_existing_file_and_bad_inputs(tmp_path, real_logits):
    path = tmp_path / "taken.onnx"
    path.write_text("mine")
    with pytest.raises(ValueError, match="exists"):
        export_onnx(Logits(), path, calibrator=None, conformal=None)
    assert path.read_text() == "mine"
    with pytest.raises(ValueError, match="example_inputs"):
        export_onnx(Logits(), tmp_path / "y.onnx", calibrator=None, conformal=None, example_inputs=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="example_inputs"):  # no config, no image processor: the size is unknown
        export_onnx(Logits(), tmp_path / "y.onnx", calibrator=None, conformal=None)
