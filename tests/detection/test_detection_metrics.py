"""Detection matching against pycocotools, D-ECE against netcal, LaECE by hand, and the bad inputs."""

import math

import numpy as np
import pytest
import torch

from hf_calibration.detection import (
    Detections,
    d_ece,
    detection_calibration_report,
    detection_ece,
    laece,
    match_detections,
    ranking_ap,
)

# the matching and D-ECE kernels: CI runs these again with numba targeting a CPU without AVX-512 (.ci/run)
pytestmark = pytest.mark.kernels

SIZE = (60.0, 80.0)  # (height, width) of every synthetic image


def _boxes(rng, n):
    xy = rng.uniform([0, 0], [60, 40], (n, 2))
    wh = rng.uniform(4, 20, (n, 2))
    return np.concatenate([xy, xy + wh], 1)


@pytest.fixture(scope="module")
def scene():
    """30 images, 3 classes: ground truth, and detections near it (jittered copies) or anywhere, continuous scores."""
    rng = np.random.default_rng(0)
    preds, target = [], []
    for i in range(30):
        n_gt = 0 if i == 3 else int(rng.integers(1, 6))
        gt = _boxes(rng, n_gt)
        gt_labels = rng.integers(0, 3, n_gt)
        near = gt[rng.integers(0, max(n_gt, 1), 8)] + rng.normal(0, 3, (8, 4)) if n_gt else np.zeros((0, 4))
        boxes = np.concatenate([near, _boxes(rng, 4)]) if i != 5 else np.zeros((0, 4))
        boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        m = boxes.shape[0]
        labels = np.where(
            rng.random(m) < 0.8, gt_labels[rng.integers(0, max(n_gt, 1), m)] if n_gt else 0, rng.integers(0, 3, m)
        )
        preds.append(
            {
                "boxes": torch.tensor(boxes),
                "scores": torch.tensor(rng.uniform(0.01, 0.99, m)),
                "labels": torch.tensor(labels),
            }
        )
        target.append({"boxes": torch.tensor(gt), "labels": torch.tensor(gt_labels)})
    return preds, target


def test_matching_equals_pycocotools(scene):
    COCO = pytest.importorskip("pycocotools.coco").COCO
    COCOeval = pytest.importorskip("pycocotools.cocoeval").COCOeval
    preds, target = scene
    images, anns, dets = [], [], []
    for i, (p, t) in enumerate(zip(preds, target)):
        images.append({"id": i, "height": SIZE[0], "width": SIZE[1]})
        for b, c in zip(t["boxes"].tolist(), t["labels"].tolist()):
            w, h = b[2] - b[0], b[3] - b[1]
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i,
                    "category_id": c,
                    "bbox": [b[0], b[1], w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        for b, s, c in zip(p["boxes"].tolist(), p["scores"].tolist(), p["labels"].tolist()):
            dets.append({"image_id": i, "category_id": c, "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "score": s})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns, "categories": [{"id": c} for c in range(3)]}
    gt.createIndex()
    coco_eval = COCOeval(gt, gt.loadRes(dets), "bbox")
    coco_eval.params.iouThrs = np.array([0.5])
    coco_eval.params.maxDets = [1000]
    coco_eval.params.areaRng, coco_eval.params.areaRngLbl = [[0, 1e10]], ["all"]
    coco_eval.evaluate()
    expected = {}
    for e in coco_eval.evalImgs:
        if e is not None:
            for det_id, gt_id in zip(e["dtIds"], e["dtMatches"][0]):
                expected[det_id] = gt_id > 0
    ours = match_detections(preds, target, iou_threshold=0.5)
    # loadRes numbers the detections 1.. in input order, which is ours
    assert len(expected) == len(ours) == len(dets) and sum(expected.values()) > 20
    assert ours.matched.tolist() == [expected[k + 1] for k in range(len(dets))]


@pytest.fixture(scope="module")
def matched(scene):
    return match_detections(*scene, image_sizes=[SIZE] * 30)


@pytest.mark.parametrize(
    ("features", "n_bins"), [((), 10), ((), 7), (("cx", "cy", "w", "h"), 5), (("cx", "cy", "w", "h"), (4, 3, 3, 2, 2))]
)
def test_d_ece_equals_netcal(matched, features, n_bins):
    netcal_ece = pytest.importorskip("netcal.metrics").ECE
    kept = matched.above(0.3)
    columns = [kept.scores] + [kept.features[:, "cx cy w h".split().index(f)] for f in features]
    x = np.stack(columns, 1) if features else kept.scores
    bins = list(n_bins) if isinstance(n_bins, tuple) else n_bins
    expected = netcal_ece(bins=bins, detection=True).measure(x, kept.matched.astype(np.int64))
    ours = d_ece(matched, features=features, n_bins=n_bins, score_threshold=0.3)
    assert ours > 0.01
    assert ours == pytest.approx(expected, abs=1e-12)


def test_laece_by_hand():
    # class 0: bin (0.5, 0.75] holds 0.6 (TP, IoU 0.8) and 0.7 (FP): |0.65 - 0.4| = 0.25, weight 1 → 0.25
    # class 1: bin (0.75, 1] holds 0.9 (TP, IoU 0.6): |0.9 - 0.6| = 0.3
    d = Detections(
        scores=np.array([0.6, 0.7, 0.9, 0.2]),
        labels=np.array([0, 0, 1, 1]),
        matched=np.array([True, False, True, True]),
        iou=np.array([0.8, 0.0, 0.6, 0.9]),
        image=np.zeros(4, int),
        features=None,
        logits=None,
        iou_threshold=0.5,
        num_ground_truth=3,
    )
    assert laece(d, n_bins=4, score_threshold=0.5) == pytest.approx((0.25 + 0.3) / 2, abs=1e-15)
    report = detection_calibration_report(d, score_threshold=0.5, n_bins=4)
    assert report["score_threshold"] == 0.5 and report["detections"] == 3 and "d_ece" not in report
    assert report["detection_ece"] == pytest.approx(detection_ece(d, n_bins=4), abs=0)


def _one(boxes, scores=(0.9,), labels=(0,), gt=((0.0, 0, 10, 10),)):
    return (
        [
            {
                "boxes": torch.tensor(boxes, dtype=torch.float64).reshape(-1, 4),
                "scores": torch.tensor(scores, dtype=torch.float64),
                "labels": torch.tensor(labels),
            }
        ],
        [
            {
                "boxes": torch.tensor(gt, dtype=torch.float64).reshape(-1, 4),
                "labels": torch.zeros(len(gt), dtype=torch.int64),
            }
        ],
    )


def test_documented_handling():
    # zero-area detection: a false positive; zero-area ground truth: never matched
    assert not match_detections(*_one([[5.0, 5, 5, 9]])).matched[0]
    assert not match_detections(*_one([[0.0, 0, 10, 10]], gt=[[0.0, 0, 0, 10]])).matched[0]
    # no predictions in an image, no ground truth in another
    preds, target = _one(np.zeros((0, 4)), scores=[], labels=[])
    p2, t2 = _one([[0.0, 0, 10, 10]], gt=np.zeros((0, 4)))
    d = match_detections(preds + p2, target + t2, image_sizes=[(20, 20)] * 2)
    assert len(d) == 1 and not d.matched[0] and d.num_ground_truth == 1
    # a box partly outside the image is clipped for its geometry
    d = match_detections(*_one([[-10.0, 0, 10, 10]]), image_sizes=[(20, 20)])
    np.testing.assert_allclose(d.features[0], [0.25, 0.25, 0.5, 0.5])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (dict(boxes=[[0.0, 0, 10, 10]], scores=(float("nan"),)), "finite"),
        (dict(boxes=[[0.0, 0, 10, 10]], scores=(1.5,)), r"in \[0, 1\]"),
        (dict(boxes=[[10.0, 0, 0, 10]]), "inverted"),
        (dict(boxes=[[0.0, float("inf"), 10, 10]]), "finite"),
        (dict(boxes=[[30.0, 30, 40, 40]]), "wholly outside"),
    ],
)
def test_bad_input(case, message):
    with pytest.raises(ValueError, match=message):
        match_detections(*_one(**case), image_sizes=[(20, 20)])


def test_bad_arguments(matched):
    with pytest.raises(ValueError, match="none"):
        detection_ece(matched, score_threshold=1.0)
    with pytest.raises(ValueError, match="`n_bins`"):
        d_ece(matched, n_bins=(3, 3))
    with pytest.raises(ValueError, match="`features`"):
        d_ece(matched, features=("x",))
    with pytest.raises(ValueError, match="image_sizes"):
        d_ece(match_detections(*_one([[0.0, 0, 10, 10]])))
    with pytest.raises(ValueError, match="`iou_threshold`"):
        match_detections(*_one([[0.0, 0, 10, 10]]), iou_threshold=1.5)


def test_thresholds_follow_the_current_scores(matched):
    high = matched.above(0.5)
    assert high.score_threshold == 0.5 and (high.scores >= 0.5).all() and high.above(0.3) is not None
    assert len(high.above(0.3)) == len(high)
    lowered = high.with_scores(high.scores / 2)  # calibrated scores: a threshold on the old ones no longer holds
    assert lowered.score_threshold == 0.0
    assert len(lowered.above(0.3)) == int((high.scores / 2 >= 0.3).sum()) < len(high)


def test_ranking_ap_by_hand():
    # class 0: .9 T, .8 F, .7 T, .6 F -> AP = .5 * 1 + .5 * 2/3; class 1: .5 F, .4 T -> .5; class 2: no false positive
    d = Detections(
        scores=np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.95]),
        labels=np.array([0, 0, 0, 0, 1, 1, 2]),
        matched=np.array([True, False, True, False, False, True, True]),
        iou=np.zeros(7),
        image=np.zeros(7, int),
        features=None,
        logits=None,
        iou_threshold=0.5,
        num_ground_truth=3,
    )
    assert ranking_ap(d, score_threshold=0.0) == pytest.approx((0.5 + 1 / 3 + 0.5) / 2, abs=1e-15)
    assert ranking_ap(d, score_threshold=0.45) == pytest.approx(0.5 + 1 / 3, abs=1e-15)  # class 1: no true positive
    assert math.isnan(ranking_ap(d, score_threshold=0.92))  # only class 2 is left
