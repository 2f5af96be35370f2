"""Detections and pixel logits of tiny random-init YOLOS / SegFormer models over the drawn shapes set."""

import numpy as np
import pytest
import torch
from _models import tiny_mask2former, tiny_segformer, tiny_yolos

from hf_calibration.detection import detection_calibration_report, match_detections
from hf_calibration.io.detection import predict_detections, stream_pixel_metrics
from hf_calibration.io.shapes import shapes_dataset
from hf_calibration.segmentation import PixelCalibrationAccumulator


@pytest.fixture(scope="module")
def shapes():
    return shapes_dataset(6, size=32, seed=1)


def test_shapes_are_deterministic(shapes):
    again = shapes_dataset(6, size=32, seed=1)
    assert again[3]["objects"] == shapes[3]["objects"]
    assert np.array_equal(np.asarray(again[3]["mask"]), np.asarray(shapes[3]["mask"]))
    for row in shapes:
        mask = np.asarray(row["mask"])
        assert set(np.unique(mask)) <= {0, 1, 2, 3, 255} and (mask == 255).any()
        assert {c + 1 for c in row["objects"]["category"]} >= set(np.unique(mask)) - {0, 255}


def test_yolos_detections_match_and_calibrate(shapes):
    model, processor = tiny_yolos()
    preds, target, sizes = predict_detections(model, processor, shapes, threshold=0.0, batch_size=4)
    assert len(preds) == len(target) == 6 and sizes[0] == (32, 32)
    assert all(p["logits"].shape == (p["scores"].shape[0], 4) for p in preds)  # 3 classes + "no object"
    # the scores are the head's own: max softmax over the object classes of the kept queries
    p0 = preds[0]
    torch.testing.assert_close(p0["logits"].softmax(-1)[:, :-1].max(-1).values, p0["scores"])
    x, y, w, h = shapes[0]["objects"]["bbox"][0]
    torch.testing.assert_close(target[0]["boxes"][0], torch.tensor([x, y, x + w, y + h], dtype=torch.float64))
    detections = match_detections(preds, target, image_sizes=sizes)
    assert len(detections) == 6 * 12 and detections.logits.shape == (72, 4)
    report = detection_calibration_report(detections, score_threshold=0.0)
    assert report["score_threshold"] == 0.0 and 0 <= report["d_ece"] <= 1


def test_segformer_pixel_metrics_stream(shapes):
    model, processor = tiny_segformer()
    acc = stream_pixel_metrics(model, processor, shapes, batch_size=4, boundary_width=1)
    got = acc.compute()
    masks = np.stack([np.asarray(m) for m in shapes["mask"]])
    assert got["pixels"] == (masks != 255).sum() and 0 <= got["ece"] <= 1 and got["boundary_pixels"] > 0
    one = stream_pixel_metrics(
        model, processor, shapes, batch_size=6, accumulator=PixelCalibrationAccumulator(4, boundary_width=1)
    )
    assert one.compute()["ece"] == pytest.approx(got["ece"], abs=1e-6)  # batching does not change the pixels
    hot = stream_pixel_metrics(model, processor, shapes, calibrate=lambda z: z * 50).compute()
    assert hot["ece"] != got["ece"]


def test_mask2former_pixel_metrics_are_its_post_processed_map(shapes):
    """A universal head's pixel probabilities: transformers' semantic score map, normalised over the classes; its argmax
    is the processor's segmentation, and the streamed ECE is torchmetrics' on that map."""
    import inspect

    from torchmetrics.functional.classification import multiclass_calibration_error

    from hf_calibration.io.detection import pixel_logits

    model, processor = tiny_mask2former()
    post = processor.post_process_semantic_segmentation
    if "return_segmentation_scores" not in inspect.signature(post).parameters:
        with pytest.raises(ValueError, match="universal segmentation head"):
            stream_pixel_metrics(model, processor, shapes)
        return
    masks = [torch.as_tensor(np.array(m), dtype=torch.int64) for m in shapes["mask"]]
    sizes = [tuple(m.shape) for m in masks]
    with torch.no_grad():
        outputs = model(**processor(images=[im.convert("RGB") for im in shapes["image"]], return_tensors="pt"))
    theirs = post(outputs, target_sizes=sizes, return_segmentation_scores=True)
    ours = pixel_logits(model, processor, shapes["image"], sizes)
    for z, out in zip(ours, theirs):
        assert torch.equal(z[0].argmax(0), out.segmentation)
    probs = torch.cat([(s.segmentation_scores / s.segmentation_scores.sum(0)).flatten(1).T for s in theirs]).double()
    labels = torch.cat([m.flatten() for m in masks])
    keep = labels != 255
    expected = multiclass_calibration_error(probs[keep], labels[keep], num_classes=4, n_bins=15).item()
    got = stream_pixel_metrics(model, processor, shapes, batch_size=4).compute()
    assert got["pixels"] == int(keep.sum())
    assert got["ece"] == pytest.approx(expected, abs=1e-6)  # the model's float32 map


def test_pipeline_serves_calibrated_detection_scores(shapes):
    from transformers import pipeline

    from hf_calibration.detection import DetectionPlatt, DetectionTemperatureScaling
    from hf_calibration.serving.detection import attach_logit_calibrator, calibrate_results, detach_logit_calibrator

    model, processor = tiny_yolos()
    preds, target, sizes = predict_detections(model, processor, shapes, threshold=0.0)
    d = match_detections(preds, target, image_sizes=sizes)
    # a fit needs true and false positives: on random weights, mark every third detection a true one
    forced = d.select(np.arange(len(d)), matched=np.arange(len(d)) % 3 == 0)
    ts = DetectionTemperatureScaling().fit(forced)
    detector = pipeline(
        "object-detection", model=attach_logit_calibrator(model, ts), image_processor=processor, threshold=0.0
    )
    served = sorted(r["score"] for r in detector(shapes[0]["image"].convert("RGB")))
    z = preds[0]["logits"]
    expected = sorted((z / ts.temperature).softmax(-1)[:, :-1].max(-1).values.tolist())
    np.testing.assert_allclose(served, expected, rtol=1e-5)
    detach_logit_calibrator(model)
    plain = sorted(r["score"] for r in detector(shapes[0]["image"].convert("RGB")))
    np.testing.assert_allclose(plain, sorted(preds[0]["scores"].tolist()), rtol=1e-5)
    platt = DetectionPlatt().fit(forced)
    results = calibrate_results(detector(shapes[0]["image"].convert("RGB")), platt, (32, 32))
    np.testing.assert_allclose([r["score"] for r in results], platt([r["uncalibrated_score"] for r in results]).numpy())


def test_segformer_logits_calibrated_by_an_attached_local_temperature(shapes):
    from hf_calibration.segmentation import LocalTemperatureScaling
    from hf_calibration.serving.detection import attach_logit_calibrator, detach_logit_calibrator

    model, processor = tiny_segformer()
    lts = LocalTemperatureScaling(4, image_channels=3)
    torch.nn.init.normal_(lts.net[-1].weight, std=0.5)  # a non-constant temperature map
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plain = model(pixel_values=x).logits
        attach_logit_calibrator(model, lts)
        served = model(pixel_values=x).logits
        image = torch.nn.functional.interpolate(x, size=plain.shape[-2:], mode="bilinear", align_corners=False)
        torch.testing.assert_close(served, plain / lts.temperature(plain, image))
        detach_logit_calibrator(model)
        torch.testing.assert_close(model(pixel_values=x).logits, plain)
