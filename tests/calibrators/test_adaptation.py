"""calibrator.adapt(unlabeled_logits): ATC's accuracy estimate (Garg et al., ICLR 2022), then the one temperature whose
mean confidence matches it; checked by hand, on a shift where ATC holds, and through save / load / attach / export."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident

from hf_calibration.calibrators import create_calibrator, load_calibrator
from hf_calibration.calibrators.adaptation import atc_threshold, estimated_accuracy, temperature_for_mean_confidence


def test_atc_threshold_by_hand():
    """Ten confidences 0.1 .. 1.0 with accuracy 0.7: three at or below t, seven above: t between 0.3 and 0.4."""
    confidence = np.linspace(0.1, 1.0, 10)
    correct = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0, 0])
    t = atc_threshold(confidence, correct)
    assert t == pytest.approx(0.35) and np.mean(confidence > t) == pytest.approx(0.7)
    assert estimated_accuracy(np.array([0.2, 0.36, 0.5, 0.9]), t) == 0.75
    assert atc_threshold(confidence, np.ones(10)) < 0.1 and atc_threshold(confidence, np.zeros(10)) == 1.0


def test_the_temperature_matches_the_mean_confidence():
    z = torch.from_numpy(3 * np.random.default_rng(0).normal(size=(500, 6)))
    for target in (0.3, 0.5, 0.9):
        t = temperature_for_mean_confidence(z, target)
        assert float(torch.softmax(z / t, 1).amax(1).mean()) == pytest.approx(target, abs=1e-9)


def _shifted(seed: int, n: int, k: int, signal: float):
    """Logits ``s * mu_y + noise`` whose softmax at temperature 1 is the true posterior at signal 1; a lower ``signal``
    is a covariate shift (the images carry less of the class): accuracy falls, the model's confidence less so."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    means = 3 * np.eye(k)
    z = signal * means[y] + rng.normal(size=(n, k))
    return 2.5 * z, y  # an over-confident model: logits scaled up 2.5x


@pytest.mark.parametrize("method", ["temperature_scaling", "ets", "smart"])
@pytest.mark.parametrize("signal", [0.8, 0.45])
def test_adaptation_without_labels_moves_towards_the_shifted_accuracy(method, signal):
    """On this covariate shift the model's confidence falls less than its accuracy; ATC's estimate lies between the two
    (it under-reads the fall: 0.736 against an accuracy of 0.590 and a confidence of 0.801 at signal 0.45), and the
    adapted calibrator's ECE on a disjoint half is lower (by a fifth or more on the larger shift). No label is used."""
    from hf_calibration.metrics import ece

    z, y = _shifted(0, 4000, 5, 1.0)
    calibrator = create_calibrator(method).fit(z, y, progress_bar=False)
    shifted, labels = _shifted(1, 4000, 5, signal)
    adapted = calibrator.adapt(shifted[:2000])
    info = adapted.fit_info_["adaptation"]
    accuracy = float((shifted[2000:].argmax(1) == labels[2000:]).mean())
    assert info["num_samples"] == 2000 and info["method"] == "atc"
    assert accuracy < info["estimated_accuracy"] < info["mean_confidence_before"]
    before, after = ece(calibrator(shifted[2000:]), labels[2000:]), ece(adapted(shifted[2000:]), labels[2000:])
    assert after < (0.8 if signal < 0.5 else 1.0) * before, (before, after)
    assert torch.equal(adapted(shifted[2000:]).argmax(1), calibrator(shifted[2000:]).argmax(1))  # accuracy unchanged
    assert "adaptation" not in calibrator.fit_info_  # the original is left as it was


def test_an_adapted_calibrator_saves_loads_cards_and_exports(tmp_path):
    z, y = overconfident(600, 5, seed=2)
    calibrator = create_calibrator("temperature_scaling").fit(z, y, progress_bar=False)
    adapted = calibrator.adapt(0.5 * z[:300])
    adapted.save_pretrained(tmp_path / "adapted")
    loaded = load_calibrator(tmp_path / "adapted")
    assert loaded.fit_info_["adaptation"] == adapted.fit_info_["adaptation"]
    torch.testing.assert_close(loaded(z), adapted(z))
    card = (tmp_path / "adapted" / "README.md").read_text()
    assert "Adapted without labels" in card and "300 unlabeled samples" in card
    t = adapted.fit_info_["adaptation"]["temperature"]
    torch.testing.assert_close(adapted(z), calibrator(z) / t)
    torch.testing.assert_close(
        adapted.graph_forward(torch.from_numpy(z)), adapted(torch.from_numpy(z))
    )  # export's path
    again = adapted.adapt(0.5 * z[:300])  # starts again from the fitted map, not from the adapted one
    assert again.fit_info_["adaptation"]["temperature"] == pytest.approx(t, rel=1e-12)


def test_adapt_refuses_what_it_cannot_do():
    rng = np.random.default_rng(0)
    y = (rng.random((300, 2)) < 0.4).astype(int)
    platt = create_calibrator("platt").fit(2 * (2 * y - 1) + rng.normal(size=y.shape), y, progress_bar=False)
    with pytest.raises(ValueError, match="sigmoid head"):
        platt.adapt(rng.normal(size=(10, 2)))
    z, yy = overconfident(300, 4, seed=3)
    calibrator = create_calibrator("temperature_scaling").fit(z, yy, progress_bar=False)
    del calibrator.fit_info_["atc_threshold"]  # as fitted by 0.1.0
    with pytest.raises(ValueError, match="source"):
        calibrator.adapt(z)
    adapted = calibrator.adapt(z, source=(z, yy))
    assert math.isfinite(adapted.fit_info_["adaptation"]["temperature"])


def _softmax_top(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).max(axis=1)


def test_adapt_with_source_reads_the_source_s_calibrated_confidences():
    """The temperature from ATC's definition, worked with numpy and scipy: the source's calibrated confidences
    softmax(z / T_fit), the threshold t with mean(conf > t) = the source accuracy, the estimate mean(conf_target > t),
    and brentq's T_a with mean top softmax(z_target / (T_fit T_a)) = the estimate. The uncalibrated source confidences
    give another threshold, 0.643 against 0.599, and T_a 1.16 against 0.94."""
    from scipy.optimize import brentq

    z, y = overconfident(300, 4, seed=3)
    calibrator = create_calibrator("temperature_scaling").fit(z, y, progress_bar=False)
    t_fit = calibrator.fitted_temperature
    target = 0.5 * overconfident(400, 4, seed=4)[0]
    source = _softmax_top(z.astype(np.float64) / t_fit)
    accuracy = np.mean(z.argmax(1) == y)
    ranked = np.sort(source)
    below = round((1 - accuracy) * len(ranked))
    threshold = (ranked[below - 1] + ranked[below]) / 2
    assert np.mean(source > threshold) == pytest.approx(accuracy)
    estimate = np.mean(_softmax_top(target.astype(np.float64) / t_fit) > threshold)
    expected = brentq(lambda t: _softmax_top(target / (t_fit * t)).mean() - estimate, 1e-2, 1e2, xtol=1e-12)
    del calibrator.fit_info_["atc_threshold"]  # as fitted by 0.1.0: the threshold comes from `source`
    info = calibrator.adapt(target, source=(z, y)).fit_info_["adaptation"]
    assert info["threshold"] == pytest.approx(threshold, rel=1e-6)
    assert info["estimated_accuracy"] == pytest.approx(estimate)
    assert info["temperature"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("rows", [0, 1, 2, 9])
def test_adapt_refuses_too_few_unlabeled_rows(rows):
    """ATC's estimate is a share of the rows: on 0 rows NaN (the temperature then fell to 1e-3 and the copy did not
    load), on 1 or 2 rows 0, 0.5 or 1. As TemperatureScaling's fit, adapt takes 10 rows at least."""
    z, y = overconfident(300, 4, seed=3)
    calibrator = create_calibrator("temperature_scaling").fit(z, y, progress_bar=False)
    with pytest.raises(ValueError, match=r"at least 10 rows in `unlabeled_logits`.* got " + str(rows)):
        calibrator.adapt(z[:rows])
    assert calibrator.adapt(z[:10]).fit_info_["adaptation"]["num_samples"] == 10


def test_adapt_warns_when_the_temperature_stops_at_its_bound():
    """Rows of nearly flat logits: every calibrated confidence is below ATC's threshold (which lies above 1/K), the
    estimate is 0, and only T -> infinity brings the mean confidence to 1/K: the search stops at T = 1e3, with a word."""
    z, y = overconfident(300, 4, seed=3)
    calibrator = create_calibrator("temperature_scaling").fit(z, y, progress_bar=False)
    flat = 0.01 * np.random.default_rng(5).normal(size=(20, 4)).astype(np.float32)
    with pytest.warns(UserWarning, match=r"estimated an accuracy of 0\.000 on these 20 rows.*T = 1000"):
        adapted = calibrator.adapt(flat)
    info = adapted.fit_info_["adaptation"]
    assert info["estimated_accuracy"] == 0.0 and info["temperature"] == pytest.approx(1e3, rel=1e-6)


def test_a_nan_in_a_fit_record_saves_and_loads(tmp_path):
    """JSON writes NaN and reads it back as NaN, which never equals itself: the load's edited-config check took every
    such save for an edited one (a copy adapt() made on 0 rows saved, then failed to load)."""
    z, y = overconfident(300, 4, seed=3)
    calibrator = create_calibrator("temperature_scaling").fit(z, y, progress_bar=False)
    calibrator.fit_info_["ece_before"] = float("nan")
    calibrator.save_pretrained(tmp_path / "nan")
    loaded = load_calibrator(tmp_path / "nan")
    assert math.isnan(loaded.fit_info_["ece_before"])
    torch.testing.assert_close(loaded(z), calibrator(z))
