"""Sigmoid heads (binary with one logit, multi-label) in the serving graph: every sigmoid calibrator's ``graph_forward``
equals its ``forward`` in every layout; each exports to ONNX and onnxruntime returns its ``predict_proba`` (to 1e-5);
a tiny multi-label ViT calibrated by Platt scaling and saved is served the same calibrated per-label sigmoid scores by
onnxruntime, ``torch.export`` and the Endpoint handler as by ``hf_calibration.pipeline`` and by hand
(``sigmoid(a z + b)``); a prediction-set predictor with a sigmoid head is refused by name."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import onnxruntime  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _image_data import MEAN, STD, digits_dataset_dict  # noqa: E402
from _models import make_model  # noqa: E402

from hf_calibration.calibrators import create_calibrator, list_calibrators  # noqa: E402
from hf_calibration.serving import CalibratedClassifier, export_onnx  # noqa: E402

torch.set_num_threads(1)
TOLERANCE = 1e-5
SIGMOID = list_calibrators("multilabel")
LABELS = 3


def _multilabel_data(n: int, labels: int, seed: int):
    """Over-confident logits of (n, labels) multi-hot targets: z = 4 (2y - 1) + 3 noise."""
    rng = np.random.default_rng(seed)
    y = (rng.random((n, labels)) < 0.4).astype(np.int64)
    return 4.0 * (2 * y - 1) + 3.0 * rng.normal(size=(n, labels)), y


def _run(path, array: np.ndarray) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"pixel_values": array})


class Logits(nn.Module):
    """A "model" whose output is its input, (N, L, 1, 1) read as (N, L): graphs of the calibrator alone."""

    def forward(self, logits):
        return logits.flatten(1)


@pytest.mark.parametrize("kind", SIGMOID)
@pytest.mark.parametrize("layout", ["multilabel", "vector", "column", "softmax2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_graph_forward_equals_forward(kind, layout, dtype):
    if layout == "multilabel":
        z, y = _multilabel_data(600, 4, seed=0)
        fit_z, test_z = z[:400], torch.from_numpy(z[400:])
        calibrator = create_calibrator(kind).fit(fit_z, y[:400], progress_bar=False)
    else:
        z, y = _multilabel_data(600, 1, seed=1)
        calibrator = create_calibrator(kind).fit(z[:400], y[:400, 0], task="binary", progress_bar=False)
        test_z = torch.from_numpy(z[400:])
        test_z = {
            "vector": test_z[:, 0],
            "column": test_z,
            "softmax2": torch.cat([-test_z / 2 + 0.3, test_z / 2 + 0.3], dim=1),
        }[layout]  # a shift: only z_1 - z_0 counts
    test_z = test_z.to(dtype)
    eager = calibrator(test_z, from_logits=True)
    graph = calibrator.graph_forward(test_z)
    assert graph.dtype == eager.dtype == dtype and graph.shape == eager.shape == test_z.shape
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    p_eager, p_graph = torch.sigmoid(eager.double()), torch.sigmoid(graph.double())
    assert float((p_eager - p_graph).abs().max()) <= tol
    if layout in ("multilabel", "softmax2") and dtype == torch.float32:
        torch._dynamo.reset()
        compiled = torch.compile(
            calibrator.graph_forward, fullgraph=True, backend="eager"
        )  # traced whole: no graph break
        assert float((torch.sigmoid(compiled(test_z).double()) - p_eager).abs().max()) <= tol


@pytest.mark.parametrize("kind", SIGMOID)
@pytest.mark.parametrize("task", ["multilabel", "binary"])
def test_every_sigmoid_calibrator_exports(tmp_path, kind, task):
    labels = 4 if task == "multilabel" else 1
    z, y = _multilabel_data(700, labels, seed=2)
    calibrator = create_calibrator(kind).fit(
        z[:400], y[:400] if labels > 1 else y[:400, 0], task=task, progress_bar=False
    )
    test = torch.from_numpy(z[400:]).float()
    path = tmp_path / f"{kind}.onnx"
    result = export_onnx(Logits(), path, calibrator=calibrator, conformal=None, example_inputs=test[:4, :, None, None])
    assert result.max_abs_diff <= TOLERANCE and result.outputs == ["logits", "probabilities"]
    _, probabilities = _run(path, test[:, :, None, None].numpy())
    expected = calibrator.predict_proba(test, from_logits=True).double().numpy()
    assert probabilities.shape == (300, labels)
    assert np.abs(probabilities.astype(np.float64) - expected).max() <= TOLERANCE
    uncalibrated = torch.sigmoid(test.double()).numpy()
    assert np.abs(expected - uncalibrated).max() > 1e-2  # the calibration shows


@pytest.fixture(scope="module")
def calibrated_folder(tmp_path_factory):
    """A tiny multi-label ViT (3 tags of a digit) with a Platt calibrator fitted on the validation digits, saved."""
    from transformers import AutoImageProcessor, ViTImageProcessor

    from hf_calibration.calibrators import PlattScaling

    folder = tmp_path_factory.mktemp("serving_multilabel") / "vit"
    model = make_model(
        "vit", seed=0, num_channels=3, num_labels=LABELS, problem_type="multi_label_classification"
    ).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)  # random-init logits are ~0.05: make the calibration visible
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD).save_pretrained(folder)
    data = digits_dataset_dict()
    digits = np.asarray(data["validation"]["digit"])
    labels = np.stack([digits < 5, digits % 2 == 0, np.isin(digits, [0, 6, 8, 9])], axis=1).astype(np.int64)
    processor = AutoImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        z = model(
            pixel_values=processor(images=list(data["validation"]["img"]), return_tensors="pt")["pixel_values"]
        ).logits
    platt = PlattScaling().fit(z.double(), labels, progress_bar=False)
    platt.save_pretrained(folder / "calibrator")
    test_images = list(data["test"]["img"][:6])
    pixels = processor(images=test_images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        z_test = model(pixel_values=pixels).logits.double()
    expected = torch.sigmoid(platt.weight.detach().double() * z_test + platt.bias.detach().double()).numpy()  # by hand
    return folder, test_images, pixels, expected


def test_multilabel_model_served_by_onnx_export_and_handler(calibrated_folder, tmp_path):
    from hf_calibration import load_calibrated_model, pipeline
    from hf_calibration.serving import write_endpoint_handler

    folder, images, pixels, expected = calibrated_folder
    assert not np.allclose(expected.sum(axis=1), 1.0)  # independent sigmoids
    # ONNX Runtime, from the saved folder
    result = export_onnx(folder, tmp_path / "vit.onnx", example_inputs=pixels)
    assert result.max_abs_diff <= TOLERANCE
    logits, probabilities = _run(tmp_path / "vit.onnx", pixels.numpy())
    assert np.abs(probabilities.astype(np.float64) - expected).max() <= TOLERANCE
    # torch.export of the calibrated model (attach sets forward: model and calibrator in one graph)
    model = load_calibrated_model(folder).eval()
    program = torch.export.export(model, (), {"pixel_values": pixels})
    with torch.no_grad():
        exported = program.module()(pixel_values=pixels)
    exported_logits = exported["logits"] if isinstance(exported, dict) else exported.logits
    assert np.abs(torch.sigmoid(exported_logits.double()).numpy() - expected).max() <= TOLERANCE
    # hf_calibration.pipeline and the Endpoint handler (in process; the fresh-process case is test_endpoint.py's)
    classify = pipeline("image-classification", model=str(folder), top_k=LABELS)
    served = shutil.copytree(folder, tmp_path / "endpoint")
    write_endpoint_handler(served, requirement="hf-calibration @ git+https://example.org/hf-calibration@v0.1.0")
    sys.path.insert(0, str(served))
    try:
        import importlib

        handler_module = importlib.import_module("handler")
        importlib.reload(handler_module)  # another test may have imported another folder's handler
        handler = handler_module.EndpointHandler(str(served))
    finally:
        sys.path.remove(str(served))
    id2label = classify.model.config.id2label
    for i, image in enumerate(images):
        for rows in (classify(image), handler({"inputs": image})):
            scores = {row["label"]: row["score"] for row in rows}
            got = np.array([scores[id2label[l]] for l in range(LABELS)])
            assert np.abs(got - expected[i]).max() <= TOLERANCE


def test_a_predictor_of_another_kind_of_head_is_refused_by_name(calibrated_folder):
    from hf_calibration import load_calibrated_model
    from hf_calibration.calibrators.attach import attached_calibrator
    from hf_calibration.conformal import ConformalPredictor

    folder = calibrated_folder[0]
    model = load_calibrated_model(folder)
    rng = np.random.default_rng(0)
    y = rng.integers(0, LABELS, 200)
    predictor = ConformalPredictor("thr").fit(rng.normal(size=(200, LABELS)) + 3 * np.eye(LABELS)[y], y, alpha=0.2)
    with pytest.raises(ValueError, match="problem_type='multi_label_classification'.*MultiLabelConformalPredictor"):
        CalibratedClassifier(model, attached_calibrator(model), predictor)


def _handler(folder: Path):
    import importlib

    from hf_calibration.serving import write_endpoint_handler

    write_endpoint_handler(folder, requirement="hf-calibration @ git+https://example.org/hf-calibration@v0.1.0")
    sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module("handler")
        importlib.reload(module)  # another test may have imported another folder's handler
        return module.EndpointHandler(str(folder))
    finally:
        sys.path.remove(str(folder))


def test_multilabel_sets_are_served_by_the_pipeline_the_handler_and_onnx(calibrated_folder, tmp_path):
    """Issue 40 item 1: a multi-label folder with conformal/ raised a TypeError in the pipeline and the handler; the
    predictor was dropped from the ONNX graph. Each now serves the sets predict_sets gives, computed here by hand."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_calibration import pipeline
    from hf_calibration.calibrators import PlattScaling
    from hf_calibration.conformal import MultiLabelConformalPredictor

    folder, images, pixels, _ = calibrated_folder
    served = shutil.copytree(folder, tmp_path / "served")
    platt = PlattScaling.from_pretrained(served / "calibrator")
    model = AutoModelForImageClassification.from_pretrained(served).eval()
    data = digits_dataset_dict()
    digits = np.asarray(data["validation"]["digit"])  # Platt's images too: this test is of serving, not of coverage
    labels = np.stack([digits < 5, digits % 2 == 0, np.isin(digits, [0, 6, 8, 9])], axis=1).astype(np.int64)
    processor = AutoImageProcessor.from_pretrained(served)
    with torch.no_grad():
        z = model(pixel_values=processor(images=list(data["validation"]["img"]), return_tensors="pt")["pixel_values"])
        z_test = model(pixel_values=pixels).logits.double()
    predictor = MultiLabelConformalPredictor().fit(z.logits.double(), labels, alpha=0.2, calibrator=platt)
    predictor.save_pretrained(served / "conformal")
    a, b = platt.weight.detach().double(), platt.bias.detach().double()
    expected = (torch.sigmoid(a * z_test + b) > float(predictor.threshold)).numpy()  # by hand: p_l > t
    assert 0 < expected.sum() < expected.size  # the threshold decides something
    classify = pipeline("image-classification", model=str(served), top_k=LABELS)
    handler = _handler(served)
    id2label = classify.model.config.id2label
    for i, image in enumerate(images):
        for rows in (classify(image), handler({"inputs": image})):
            in_set = {row["label"]: row["in_set"] for row in rows}
            assert [in_set[id2label[l]] for l in range(LABELS)] == expected[i].tolist()
    result = export_onnx(served, tmp_path / "vit.onnx", example_inputs=pixels)
    assert result.outputs == ["logits", "probabilities", "prediction_set"] and result.sets_equal
    _, _, sets = _run(tmp_path / "vit.onnx", pixels.numpy())
    np.testing.assert_array_equal(sets, expected)


def test_one_logit_binary_sets_are_served_by_the_pipeline_the_handler_and_onnx(tmp_path):
    """Issue 40 item 1: ConformalPredictor("thr") on a one-logit binary head, as the docs show, was refused by the
    pipeline, the handler and export_onnx ("fitted on K = 2 classes, but the model has 1"). The sets are of the classes
    {0, 1}: by hand, class c is in the set when its probability (sigmoid(z) or 1 - sigmoid(z)) is >= 1 - q_hat."""
    from transformers import ViTImageProcessor

    from hf_calibration import pipeline
    from hf_calibration.conformal import ConformalPredictor

    folder = tmp_path / "binary"
    model = make_model("vit", seed=1, num_channels=3, num_labels=1, problem_type="multi_label_classification").eval()
    model.config.id2label, model.config.label2id = {0: "small digit"}, {"small digit": 0}
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)
    model.save_pretrained(folder)
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD)
    processor.save_pretrained(folder)
    data = digits_dataset_dict()
    with torch.no_grad():
        z = model(pixel_values=processor(images=list(data["validation"]["img"]), return_tensors="pt")["pixel_values"])
    y = (np.asarray(data["validation"]["digit"]) < 5).astype(np.int64)
    predictor = ConformalPredictor("thr").fit(z.logits[:, 0], y, alpha=0.3)
    predictor.save_pretrained(folder / "conformal")
    images = list(data["test"]["img"][:12])
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        p1 = torch.sigmoid(model(pixel_values=pixels).logits[:, 0].double()).numpy()
    bound = 1 - float(predictor.q_hat)
    expected = np.stack([1 - p1 >= bound, p1 >= bound], axis=1)
    sizes = {tuple(row) for row in expected.tolist()}
    assert {(True, False), (False, True), (True, True)} <= sizes  # {0}, {1} and {0, 1} all occur here
    classify = pipeline("image-classification", model=str(folder))
    handler = _handler(folder)
    for i, image in enumerate(images):
        for rows in (classify(image), handler({"inputs": image})):
            assert rows[0]["label"] == "small digit" and rows[0]["in_set"] == bool(expected[i, 1])
            assert rows[0]["score"] == pytest.approx(p1[i], abs=1e-6)
            negative = [r for r in rows[1:] if r["label"] == "not small digit"]
            assert len(rows) == 1 + len(negative) and bool(negative) == bool(expected[i, 0])
    result = export_onnx(folder, tmp_path / "binary.onnx", example_inputs=pixels)
    assert result.sets_equal
    _, probabilities, sets = _run(tmp_path / "binary.onnx", pixels.numpy())
    assert probabilities.shape == (12, 1) and sets.shape == (12, 2)
    np.testing.assert_array_equal(sets, expected)
