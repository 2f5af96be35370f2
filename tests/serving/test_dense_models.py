"""A detector / segmenter folder with its calibrator in ``calibrator/``: ``load_calibrated_model`` and
``hf_calibration.pipeline`` serve calibrated scores and probability maps. Tiny random-init YOLOS, DETR and SegFormer
built from configs; every served number is recomputed by hand from the plain model's outputs (loaded with
transformers alone) and the calibrator's parameters."""

from pathlib import Path

import numpy as np
import pytest
import torch
from _models import tiny_detr, tiny_segformer, tiny_yolos

from hf_calibration import load_calibrated_model, pipeline
from hf_calibration.detection import (
    BoxLogisticCalibration,
    DetectionPlatt,
    DetectionTemperatureScaling,
    match_detections,
)
from hf_calibration.io.detection import predict_detections
from hf_calibration.io.shapes import shapes_dataset
from hf_calibration.segmentation import LocalTemperatureScaling, pixel_rows


@pytest.fixture(scope="module")
def shapes():
    return shapes_dataset(4, size=32, seed=3)


def _folder(tmp_path, model, processor, calibrator, name):
    folder = tmp_path / name
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    calibrator.save_pretrained(folder / "calibrator")
    return folder


def _detections(model, processor, shapes):
    preds, target, sizes = predict_detections(model, processor, shapes, threshold=0.0)
    d = match_detections(preds, target, image_sizes=sizes)
    return d.select(np.arange(len(d)), matched=np.arange(len(d)) % 3 == 0)  # random weights: force some true ones


def _raw(folder, image, processor):
    """The plain model's post-processed detections at threshold 0 and its query logits (transformers alone)."""
    from transformers import AutoModelForObjectDetection

    plain = AutoModelForObjectDetection.from_pretrained(folder).eval()
    with torch.no_grad():
        out = plain(**processor(images=[image], return_tensors="pt"))
    raw = processor.post_process_object_detection(out, 0.0, [image.size[::-1]])[0]
    return raw, out.logits[0].double()


def _served(results):
    return (
        np.array([r["score"] for r in results]),
        [r["label"] for r in results],
        [tuple(r["box"].values()) for r in results],
    )


def _expected_boxes(raw, model):
    labels = [model.config.id2label[int(c)] for c in raw["labels"]]
    return labels, [tuple(int(v) for v in b.int().tolist()) for b in raw["boxes"]]


@pytest.mark.parametrize("kind", ["platt", "box_logistic"])
def test_yolos_folder_serves_calibrated_scores(shapes, tmp_path, kind):
    model, processor = tiny_yolos()
    forced = _detections(model, processor, shapes)
    calibrator = (DetectionPlatt() if kind == "platt" else BoxLogisticCalibration()).fit(forced)
    folder = _folder(tmp_path, model, processor, calibrator, "yolos")
    detector = pipeline("object-detection", model=folder)
    image = shapes[0]["image"].convert("RGB")
    raw, _ = _raw(folder, image, detector.image_processor)
    s = raw["scores"].double().numpy()
    z = np.log(s) - np.log1p(-s)
    if kind == "platt":  # sigmoid(a logit(s) + b), by hand
        expected = 1 / (1 + np.exp(-(calibrator.weight.item() * z + calibrator.bias.item())))
    else:  # sigmoid(w . [logit(s), cx, cy, w, h] + b), the float boxes clipped to the 32 x 32 image, by hand
        b = raw["boxes"].double().numpy().clip(0, 32)
        geometry = np.stack(
            [(b[:, 0] + b[:, 2]) / 64, (b[:, 1] + b[:, 3]) / 64, (b[:, 2] - b[:, 0]) / 32, (b[:, 3] - b[:, 1]) / 32], 1
        )
        w = calibrator.weight.detach().numpy()
        expected = 1 / (1 + np.exp(-(w[0] * z + geometry @ w[1:] + calibrator.bias.item())))
    scores, labels, boxes = _served(detector(image, threshold=0.0))
    np.testing.assert_allclose(scores, expected, rtol=1e-9)
    assert (labels, boxes) == _expected_boxes(raw, model)  # same detections, same order
    kept = detector(image, threshold=0.5)  # the threshold applies to the calibrated scores
    np.testing.assert_allclose([r["score"] for r in kept], expected[expected > 0.5], rtol=1e-9)


def test_detr_folder_serves_a_temperature_on_the_logits(shapes, tmp_path):
    model, processor = tiny_detr()
    ts = DetectionTemperatureScaling("softmax").fit(_detections(model, processor, shapes))
    assert abs(ts.temperature - 1) > 1e-3
    folder = _folder(tmp_path, model, processor, ts, "detr")
    detector = pipeline(model=folder)  # the task read from the config
    image = shapes[1]["image"].convert("RGB")
    raw, logits = _raw(folder, image, detector.image_processor)
    expected = (logits / ts.temperature).softmax(-1)[:, :-1].max(-1).values.numpy()  # every query, in order
    scores, labels, boxes = _served(detector(image, threshold=0.0))
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
    assert (labels, boxes) == _expected_boxes(raw, model)
    loaded = load_calibrated_model(folder)  # model(...).logits are calibrated too
    with torch.no_grad():
        served = loaded(**detector.image_processor(images=[image], return_tensors="pt")).logits[0].double()
    torch.testing.assert_close(served, logits / ts.temperature, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="agree with the model's config"):
        load_calibrated_model(folder, task="image-segmentation")


@pytest.mark.parametrize("kind", ["local", "rows"])
def test_segformer_folder_serves_calibrated_probability_maps(shapes, tmp_path, kind):
    from transformers import AutoModelForSemanticSegmentation

    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.io.detection import pixel_logits

    model, processor = tiny_segformer()
    masks = torch.stack([torch.as_tensor(np.array(m), dtype=torch.int64) for m in shapes["mask"]])
    logits = torch.cat(pixel_logits(model, processor, shapes["image"], [(32, 32)] * len(shapes)))
    if kind == "local":
        calibrator = LocalTemperatureScaling(4, image_channels=0, hidden=4).fit(logits, masks, steps=5)
        torch.nn.init.normal_(calibrator.net[-1].weight, std=0.5)  # a temperature that varies over the image
    else:
        calibrator = TemperatureScaling().fit(*pixel_rows(logits, masks), progress_bar=False)
    folder = _folder(tmp_path, model, processor, calibrator, "segformer")
    segmenter = pipeline("image-segmentation", model=folder)
    image = shapes[2]["image"].convert("RGB")
    plain = AutoModelForSemanticSegmentation.from_pretrained(folder).eval()
    with torch.no_grad():
        z = plain(**segmenter.image_processor(images=[image], return_tensors="pt")).logits
        t = calibrator.temperature(z) if kind == "local" else calibrator.fit_info_["temperature"]
    up = torch.nn.functional.interpolate(z / t, size=(32, 32), mode="bilinear", align_corners=False)[0]
    probs = up.double().softmax(0)
    served = segmenter(image)
    assert sorted(int(model.config.label2id[r["label"]]) for r in served) == up.argmax(0).unique().tolist()
    for r in served:
        c = model.config.label2id[r["label"]]
        mask = np.asarray(r["mask"]) > 0
        np.testing.assert_array_equal(mask, (up.argmax(0) == c).numpy())  # the masks of the calibrated logits
        np.testing.assert_allclose(r["probabilities"], probs[c].numpy(), atol=1e-5)
        assert r["score"] == pytest.approx(float(probs[c][torch.from_numpy(mask)].mean()), abs=1e-5)
    card = Path(folder, "calibrator", "README.md").read_text()
    assert "image-segmentation" in card.split("---")[1]  # tagged with the segmenter's task, either kind
    assert 'pipeline("image-segmentation"' in card and "load_classifier" not in card


def test_a_calibrator_of_another_model_is_refused(shapes, tmp_path):
    model, processor = tiny_yolos()
    lts = LocalTemperatureScaling(3, image_channels=0, hidden=2)
    lts.fit(torch.randn(1, 3, 4, 4), torch.randint(0, 3, (1, 4, 4)), steps=1)
    folder = _folder(tmp_path, model, processor, lts, "mixed")
    with pytest.raises(ValueError, match="Expected a calibrator for object-detection"):
        load_calibrated_model(folder)
