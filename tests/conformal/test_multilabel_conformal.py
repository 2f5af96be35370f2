"""Multi-label conformal risk control of the false-negative rate (against MAPIE, by hand, and over random splits) and
binary THR sets."""

import warnings

import numpy as np
import pytest
import torch

from hf_calibration.conformal import (
    ConformalPredictor,
    MultiLabelConformalPredictor,
    false_negative_rate,
    load_conformal_predictor,
)
from hf_calibration.conformal.multilabel import crc_threshold


def _calibrated_multilabel(n, labels=5, seed=0):
    """Logits whose sigmoid is each label's true probability; every sample carries at least one label."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, labels)) * 2.0 + np.linspace(-1.5, 0.5, labels)
    y = (rng.random((n, labels)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    empty = y.sum(axis=1) == 0
    y[empty, np.argmax(z[empty], axis=1)] = 1
    return z, y


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.1, 0.25])
def test_grid_threshold_equals_mapie(seed, alpha):
    from mapie.risk_control import MultiLabelClassificationController

    z, y = _calibrated_multilabel(300, seed=seed)
    p = 1 / (1 + np.exp(-z))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapie = MultiLabelClassificationController(
            predict_function=lambda x: x, risk="recall", method="crc", target_level=1 - alpha
        ).calibrate(p, y)
    grid = np.arange(0, 1, 0.01)
    threshold, controlled = crc_threshold(p, y, alpha, grid)
    assert controlled and threshold == pytest.approx(float(np.atleast_1d(mapie.best_predict_param)[0]))
    predictor = MultiLabelConformalPredictor(thresholds=grid).fit(z, y, alpha=alpha)
    assert np.array_equal(predictor.predict_sets(z), mapie.predict(p)[:, :, 0])


def test_exact_threshold_by_hand():
    # two samples; positives at p = 0.9 (sample 0) and 0.3, 0.6 (sample 1): R(t) = [t >= .9]/2 + ([t >= .3] + [t >= .6])/4
    p = np.array([[0.9, 0.1, 0.2], [0.3, 0.6, 0.05]])
    y = np.array([[1, 0, 0], [1, 1, 0]])
    # n = 2, alpha = 0.5: budget (0.5 * 3 - 1) / 2 = 0.25; R reaches 0.25 at t = 0.3 and exceeds it at t = 0.6
    threshold, controlled = crc_threshold(p, y, 0.5)
    assert controlled and threshold == np.nextafter(0.6, 0)
    sets = p > threshold
    assert sets.tolist() == [[True, False, False], [False, True, False]]
    assert false_negative_rate(sets, y) == pytest.approx(0.25)
    with pytest.warns(UserWarning, match="cannot bring the false-negative rate within alpha"):
        MultiLabelConformalPredictor().fit(np.log(p / (1 - p)), y, alpha=0.2)  # 1/(n + 1) = 1/3 > 0.2


def test_false_negative_rate_is_controlled_over_random_splits():
    """E[FNR(test)] <= alpha over calibration draws (Theorem 1), and not far below: alpha - 2/(n + 1) for a loss whose
    jumps are small (Theorem 2's lower bound with continuous probabilities)."""
    z, y = _calibrated_multilabel(6000, seed=11)
    alpha, n = 0.1, 400
    rng = np.random.default_rng(0)
    rates = []
    for _ in range(200):
        order = rng.permutation(z.shape[0])
        cal, test = order[:n], order[n:]
        predictor = MultiLabelConformalPredictor().fit(z[cal], y[cal], alpha=alpha)
        rates.append(predictor.evaluate(z[test], y[test])["false_negative_rate"])
    rates = np.array(rates)
    se = rates.std(ddof=1) / np.sqrt(rates.size)
    assert rates.mean() <= alpha + 3 * se
    assert rates.mean() >= alpha - 2 / (n + 1) - 3 * se


def test_calibrator_is_applied_and_saved(tmp_path):
    from hf_calibration.calibrators import PlattScaling

    z, y = _calibrated_multilabel(1200, seed=3)
    platt = PlattScaling().fit(2 * z[:600], y[:600], progress_bar=False)  # an over-confident head, calibrated
    predictor = MultiLabelConformalPredictor().fit(2 * z[600:], y[600:], alpha=0.15, calibrator=platt)
    predictor.save_pretrained(tmp_path / "conformal")
    loaded = load_conformal_predictor(tmp_path / "conformal")
    assert isinstance(loaded, MultiLabelConformalPredictor) and loaded.calibrator.kind == "platt"
    assert np.array_equal(loaded.predict_sets(2 * z), predictor.predict_sets(2 * z))
    assert "false-negative rate" in (tmp_path / "conformal" / "README.md").read_text()
    with pytest.raises(TypeError, match="softmax calibrator does not apply"):
        from hf_calibration.calibrators import TemperatureScaling

        rng = np.random.default_rng(0)
        labels = rng.integers(0, 3, 100)
        ts = TemperatureScaling().fit(rng.normal(size=(100, 3)) + 2 * np.eye(3)[labels], labels, progress_bar=False)
        MultiLabelConformalPredictor().fit(z, y, calibrator=ts)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda c: c["fit"].__setitem__("alpha", 0.3), "fit.alpha"),
        (lambda c: c["fit"].__setitem__("threshold", 0.25), "fit.threshold"),
        (lambda c: c["fit"].__setitem__("mean_set_size", 1.0), "fit.mean_set_size"),
    ],
)
def test_an_edited_config_is_refused(tmp_path, edit, field):
    """The card and repr read alpha and the threshold from config.json, the sets from the weights: an edit that made
    them disagree loaded silently; the settings are now checked against the weights file's copy."""
    import json

    z, y = _calibrated_multilabel(400, seed=1)
    predictor = MultiLabelConformalPredictor().fit(z, y, alpha=0.1)
    predictor.save_pretrained(tmp_path)
    assert np.array_equal(
        MultiLabelConformalPredictor.from_pretrained(tmp_path).predict_sets(z), predictor.predict_sets(z)
    )
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json' does not match its weights \(" + field.replace(".", r"\.")):
        MultiLabelConformalPredictor.from_pretrained(tmp_path)


def test_multilabel_bad_input():
    z, y = _calibrated_multilabel(100)
    with pytest.raises(ValueError, match="shape \\(N, L\\) of 0/1 labels"):
        MultiLabelConformalPredictor().fit(z, y.argmax(1))
    with pytest.raises(ValueError, match="0/1 labels"):
        MultiLabelConformalPredictor().fit(z, 2 * y)
    with pytest.raises(ValueError, match="L = 5 labels"):
        MultiLabelConformalPredictor().fit(z, y).predict_sets(z[:, :3])


def test_binary_thr_one_logit_equals_two_softmax_logits():
    rng = np.random.default_rng(5)
    z = rng.normal(size=2000) * 3
    y = (rng.random(2000) < 1 / (1 + np.exp(-z))).astype(np.int64)
    one = ConformalPredictor("thr").fit(z[:1000], y[:1000], alpha=0.1)
    two = ConformalPredictor("thr").fit(np.stack([np.zeros(1000), z[:1000]], 1), y[:1000], alpha=0.1)
    assert one.fit_info_["task"] == "binary" and float(one.q_hat) == float(two.q_hat)
    sets = one.predict_sets(z[1000:])
    assert sets.shape == (1000, 2)
    assert np.array_equal(sets, two.predict_sets(np.stack([np.zeros(1000), z[1000:]], 1)))
    assert np.array_equal(one.predict_sets(torch.from_numpy(z[1000:, None])).numpy(), sets)


def test_binary_thr_coverage_over_random_splits():
    rng = np.random.default_rng(6)
    z = rng.normal(size=8000) * 2.5
    y = (rng.random(8000) < 1 / (1 + np.exp(-z))).astype(np.int64)
    alpha, n, cover = 0.1, 300, []
    for _ in range(200):
        order = rng.permutation(z.size)
        predictor = ConformalPredictor("thr").fit(z[order[:n]], y[order[:n]], alpha=alpha)
        cover.append(predictor.evaluate(z[order[n:]], y[order[n:]])["coverage"])
    cover = np.array(cover)
    assert cover.mean() >= 1 - alpha - 3 * cover.std(ddof=1) / np.sqrt(cover.size)


def test_scores_tied_to_a_grid_value_by_hand():
    """Issue 45: with scores exactly on a grid value, ``p < t`` for ``p <= t`` in the grid's loss gave t = 0.20 for
    0.19-like cases and a calibration false-negative rate far above alpha. Worked by hand: 19 samples, one true label
    each, with scores 0.1, 0.2, 0.2 and sixteen at 0.5; alpha = 0.15 allows k misses where k/20 + 1/20 <= 0.15, k <= 2.
    Sets are {p > t}: at t = 0.1 one label is missed (feasible), at t = 0.2 three (not): t_hat = 0.1, FNR 1/19."""
    p = np.array([0.1, 0.2, 0.2] + [0.5] * 16)[:, None]
    probs = np.hstack([p, np.full_like(p, 0.05)])  # a second label, never true
    labels = np.hstack([np.ones_like(p, dtype=np.int64), np.zeros_like(p, dtype=np.int64)])
    grid = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert crc_threshold(probs, labels, 0.15, grid) == (0.1, True)
    predictor = MultiLabelConformalPredictor(thresholds=grid).fit(probs, labels, alpha=0.15, from_logits=False)
    assert predictor.fit_info_["threshold"] == 0.1
    assert predictor.fit_info_["false_negative_rate"] == pytest.approx(1 / 19, abs=1e-15)
    # the exact (grid-free) threshold: the loss jumps past the budget 2/19 at 0.2, so t_hat is just below 0.2
    t, controlled = crc_threshold(probs, labels, 0.15)
    assert controlled and t == np.nextafter(0.2, -np.inf)
    assert false_negative_rate(probs > t, labels) == pytest.approx(1 / 19, abs=1e-15)
