"""Detection score calibrators against scikit-learn / scipy / netcal fits, hand cases, and a save / load round trip."""

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from hf_calibration.detection import (
    BoxLogisticCalibration,
    DetectionIsotonic,
    DetectionPlatt,
    Detections,
    DetectionTemperatureScaling,
    d_ece,
    detection_ece,
    load_detection_calibrator,
)


@pytest.fixture(scope="module")
def overconfident():
    """2,000 detections whose true-positive rate is a softened, position-dependent function of the score."""
    rng = np.random.default_rng(0)
    n, c = 2000, 3
    logits = rng.normal(0, 3, (n, c + 1))
    labels = logits[:, :c].argmax(1)
    scores = torch.softmax(torch.from_numpy(logits), 1).numpy()[np.arange(n), labels]
    features = rng.uniform(0.05, 0.95, (n, 4))
    z = np.log(scores / (1 - scores))
    tp = rng.random(n) < 1 / (1 + np.exp(-(0.5 * z - 0.3 + 2 * (features[:, 0] - 0.5))))
    return Detections(
        scores=scores,
        labels=labels,
        matched=tp,
        iou=np.where(tp, 0.8, 0.0),
        image=np.zeros(n, int),
        features=features,
        logits=logits,
        iou_threshold=0.5,
        num_ground_truth=int(tp.sum()),
    )


def test_platt_equals_sklearn_logistic_regression(overconfident):
    from sklearn.linear_model import LogisticRegression

    d = overconfident
    x = np.log(d.scores / (1 - d.scores))[:, None]
    ref = LogisticRegression(C=1e12, tol=1e-12, max_iter=10000).fit(x, d.matched)
    ours = DetectionPlatt().fit(d)
    assert ours.weight.item() == pytest.approx(ref.coef_[0, 0], rel=1e-5)
    assert ours.bias.item() == pytest.approx(ref.intercept_[0], abs=1e-5)
    assert detection_ece(ours.calibrate(d), score_threshold=0.0) < detection_ece(d, score_threshold=0.0)


def test_box_logistic_reaches_netcal_likelihood_and_lowers_d_ece(overconfident):
    netcal_logistic = pytest.importorskip("netcal.scaling").LogisticCalibration
    d = overconfident
    ours = BoxLogisticCalibration().fit(d)
    x = np.concatenate([d.scores[:, None], d.features], 1)
    ref = netcal_logistic(detection=True).fit(x, d.matched.astype(np.int64))
    p_ref = np.clip(ref.transform(x), 1e-12, 1 - 1e-12)
    p_ours = ours.calibrate(d).scores

    def nll(p):
        return -np.mean(np.where(d.matched, np.log(p), np.log1p(-p)))

    assert nll(p_ours) <= nll(p_ref) + 1e-6  # the same convex likelihood: ours at its minimum
    assert ours.weight[1].item() > 1  # it found the dependence on cx
    assert d_ece(ours.calibrate(d), score_threshold=0.0) < d_ece(d, score_threshold=0.0)


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_temperature_equals_scipy_minimiser(overconfident, activation):
    d = overconfident
    z, label, y = torch.from_numpy(d.logits), torch.from_numpy(d.labels), d.matched

    def score(t):
        if activation == "sigmoid":
            return torch.sigmoid(z[torch.arange(len(y)), label] / t).numpy()
        return torch.softmax(z / t, 1)[torch.arange(len(y)), label].numpy()

    def bce(log_t):
        p = np.clip(score(np.exp(log_t)), 1e-15, 1 - 1e-15)
        return -np.mean(np.where(y, np.log(p), np.log1p(-p)))

    best = np.exp(minimize_scalar(bce, bounds=(-3, 3), method="bounded", options={"xatol": 1e-10}).x)
    if activation == "sigmoid":
        d = d.with_scores(score(1.0))
    ours = DetectionTemperatureScaling(activation).fit(d)
    assert ours.temperature == pytest.approx(best, rel=1e-5)
    np.testing.assert_allclose(ours.calibrate(d).scores, score(best), rtol=1e-4)


def test_isotonic_per_class_by_hand():
    # class 0: scores .2 .4 .6 .8 with outcomes 0 1 0 1 → pool adjacent violators: 0, .5, .5, 1; class 1 untouched
    d = Detections(
        scores=np.array([0.2, 0.4, 0.6, 0.8, 0.3, 0.7]),
        labels=np.array([0, 0, 0, 0, 1, 1]),
        matched=np.array([False, True, False, True, False, True]),
        iou=np.zeros(6),
        image=np.zeros(6, int),
        features=None,
        logits=None,
        iou_threshold=0.5,
        num_ground_truth=3,
    )
    # centred: blocks {.2} -> 0, {.4, .6} -> .5 placed at their mean .5, {.8} -> 1; linear between the three knots
    iso = DetectionIsotonic(num_classes=3).fit(d)
    np.testing.assert_allclose(iso(d.scores[:4], d.labels[:4]).numpy(), [0, 1 / 3, 2 / 3, 1], atol=1e-15)
    np.testing.assert_allclose(
        iso([0.5, 0.1, 0.9, 0.35], [0, 0, 0, 0]).numpy(), [0.5, 0, 1, 0.25], atol=1e-15
    )  # at a knot, clipped below / above the fitted range, between knots
    np.testing.assert_allclose(iso([0.3, 0.42], [2, 2]).numpy(), [0.3, 0.42], atol=1e-15)  # class 2 never fitted


@pytest.mark.parametrize(
    "make",
    [
        DetectionPlatt,
        BoxLogisticCalibration,
        lambda: DetectionTemperatureScaling("softmax"),
        lambda: DetectionIsotonic(3),
    ],
)
def test_save_load_round_trip(overconfident, make, tmp_path):
    """The one persistence: outputs equal after a load, any kind through ``load_detection_calibrator``, a non-empty
    folder refused, an edited config refused with the error every calibrator gives, a card with the numbers."""
    fitted = make().fit(overconfident, held_out=overconfident.select(np.arange(500)))
    fitted.save_pretrained(tmp_path / "cal")
    loaded = type(fitted).from_pretrained(tmp_path / "cal")
    d = overconfident
    np.testing.assert_array_equal(loaded.calibrate(d).scores, fitted.calibrate(d).scores)
    again = load_detection_calibrator(tmp_path / "cal")
    assert type(again) is type(fitted) and again.fit_info_ == fitted.fit_info_
    with pytest.raises(ValueError, match="holds a calibrator; pass overwrite=True"):
        fitted.save_pretrained(tmp_path / "cal")
    card = (tmp_path / "cal" / "README.md").read_text()
    assert "object-detection" in card.split("---")[1]  # the Hub task tag
    held = fitted.fit_info_["held_out"]
    assert f"| D-ECE | held-out set | {100 * held['d_ece_before']:.2f}% | {100 * held['d_ece_after']:.2f}% |" in card
    config = json.loads((tmp_path / "cal" / "config.json").read_text())
    config["fit"]["score_threshold"] = 0.3
    (tmp_path / "cal" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json' does not match its weights \(fit\.score_threshold"):
        type(fitted).from_pretrained(tmp_path / "cal")


def test_record_by_hand_and_a_nan_saves(overconfident, tmp_path):
    """The fit record's numbers are the metrics of the detections before / after the map; an empty held-out set
    (no detection above the threshold) records NaN, which saves and loads."""
    platt = DetectionPlatt().fit(overconfident, score_threshold=0.2, held_out=overconfident.select(np.arange(0)))
    kept = overconfident.above(0.2)
    after = kept.with_scores(platt(kept.scores).numpy())
    record = platt.fit_info_["fit_set"]
    assert record["d_ece_before"] == d_ece(kept, score_threshold=0.0)
    assert record["detection_ece_after"] == detection_ece(after, score_threshold=0.0)
    assert record["d_ece_after"] < record["d_ece_before"]
    assert math.isnan(platt.fit_info_["held_out"]["laece_after"])
    platt.save_pretrained(tmp_path / "p")
    assert math.isnan(DetectionPlatt.from_pretrained(tmp_path / "p").fit_info_["held_out"]["laece_after"])
    with pytest.raises(ValueError, match="Expected a DetectionIsotonic checkpoint"):
        DetectionIsotonic.from_pretrained(tmp_path / "p")
    pushed = platt.push_to_hub("someone/platt", dry_run=True)  # the folder push_to_hub would upload, nothing sent
    assert sorted(p.name for p in Path(pushed).iterdir()) == ["README.md", "config.json", "model.safetensors"]


def test_bad_use(overconfident):
    with pytest.raises(ValueError, match="not fitted"):
        DetectionPlatt()([0.5])
    with pytest.raises(ValueError, match="`features`"):
        BoxLogisticCalibration().fit(Detections(**{**overconfident.__dict__, "features": None}))
    with pytest.raises(ValueError, match="true and false"):
        DetectionPlatt().fit(overconfident.above(0.999999))
    with pytest.raises(ValueError, match="`activation`"):
        DetectionTemperatureScaling("relu")


def _positional(seed: int, by_position: bool) -> Detections:
    """600 detections of one class, true positives with probability (cx + score) / 2 (``by_position``) or the score."""
    rng = np.random.default_rng(seed)
    n = 600
    scores, features = rng.uniform(0.1, 0.9, n), rng.uniform(0.05, 0.95, (n, 4))
    tp = rng.random(n) < ((features[:, 0] + scores) / 2 if by_position else scores)
    return Detections(
        scores=scores,
        labels=np.zeros(n, int),
        matched=tp,
        iou=np.where(tp, 0.8, 0.0),
        image=np.zeros(n, int),
        features=features,
        logits=None,
        iou_threshold=0.5,
        num_ground_truth=int(tp.sum()),
    )


def test_fit_warns_when_the_map_lowers_the_held_out_ranking():
    """A box map fitted where position counts, measured where only the score does: it ranks the held-out detections
    by position, their ranking AP (scikit-learn's, recomputed here) falls and ``fit`` says so; Platt keeps the order."""
    from sklearn.metrics import average_precision_score

    fit_set, held_out = _positional(0, by_position=True), _positional(1, by_position=False)
    with pytest.warns(UserWarning, match="re-ranks the detections.*held-out"):
        box = BoxLogisticCalibration().fit(fit_set, held_out=held_out)
    record = box.fit_info_["held_out"]
    assert record["ranking_ap_before"] == pytest.approx(average_precision_score(held_out.matched, held_out.scores))
    after = box.calibrate(held_out).scores
    assert record["ranking_ap_after"] == pytest.approx(average_precision_score(held_out.matched, after))
    assert record["ranking_ap_after"] < record["ranking_ap_before"] - 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        platt = DetectionPlatt().fit(fit_set, held_out=held_out)
    assert platt.fit_info_["held_out"]["ranking_ap_after"] == pytest.approx(record["ranking_ap_before"], abs=1e-12)
