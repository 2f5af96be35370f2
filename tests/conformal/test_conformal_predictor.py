"""ConformalPredictor: thresholds computed independently, calibrators, RAPS's automatic parameters, inputs, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _conformal_data import synthetic
from scipy.special import softmax

from hf_calibration.calibrators import NotFittedError, TemperatureScaling, VectorScaling
from hf_calibration.conformal import ConformalPredictor, coverage, set_size
from hf_calibration.conformal.tuning import choose_k_reg, choose_penalty


@pytest.fixture(scope="module")
def data():
    z, y = synthetic(3000, 10, seed=0)
    return z[:1500], y[:1500], z[1500:], y[1500:]


def _kth(scores, alpha):
    n = len(scores)
    return np.sort(scores)[math.ceil((n + 1) * (1 - alpha) - 1e-9) - 1]


def test_thr_threshold_and_sets_computed_independently(data):
    z, y, zt, _ = data
    p = softmax(z.astype(np.float64), axis=1)
    q = _kth(1 - p[np.arange(len(y)), y], 0.1)
    predictor = ConformalPredictor("thr", allow_empty=True).fit(z, y, alpha=0.1)
    assert float(predictor.q_hat) == pytest.approx(q, rel=0, abs=1e-15)
    expected = softmax(zt.astype(np.float64), axis=1) >= 1 - q
    assert np.array_equal(predictor.predict_sets(zt), expected)


def test_non_randomised_aps_threshold_computed_independently(data):
    z, y, _, _ = data
    p = softmax(z.astype(np.float64), axis=1)
    order = np.argsort(-p, axis=1, kind="stable")
    cum = np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
    rank = np.argmax(order == y[:, None], axis=1)
    q = _kth(cum[np.arange(len(y)), rank], 0.2)
    predictor = ConformalPredictor("aps", randomized=False, allow_empty=True).fit(z, y, alpha=0.2)
    assert float(predictor.q_hat) == pytest.approx(q, rel=0, abs=1e-12)


def test_fit_report_on_the_calibration_data(data):
    z, y, _, _ = data
    predictor = ConformalPredictor("aps", allow_empty=True).fit(z, y, alpha=0.1)
    info = predictor.fit_info_
    assert info["num_samples"] == 1500 and info["num_tune"] == 0 and info["quantile_rank"] == math.ceil(1501 * 0.9)
    # with randomised (tie-free) scores exactly k of the n calibration labels have a score <= q_hat
    assert info["coverage"] == info["quantile_rank"] / 1500
    assert 1 < info["mean_set_size"] < 10


def test_numpy_in_numpy_out_torch_in_torch_out(data):
    z, y, zt, _ = data
    predictor = ConformalPredictor("raps", k_reg=1, penalty=0.1).fit(z, y)
    a = predictor.predict_sets(zt, generator=3)
    b = predictor.predict_sets(torch.from_numpy(zt), generator=3)
    assert isinstance(a, np.ndarray) and a.dtype == np.bool_ and a.shape == zt.shape
    assert isinstance(b, torch.Tensor) and b.dtype == torch.bool and np.array_equal(a, b.numpy())
    predictor.fit(z, y)  # restarts the prediction stream: calling the module is predict_sets
    called = predictor(torch.from_numpy(zt))
    predictor.fit(z, y)
    assert torch.equal(called, predictor.predict_sets(torch.from_numpy(zt)))


def test_probabilities_give_the_logits_sets(data):
    z, y, zt, _ = data
    from_logits = ConformalPredictor("aps").fit(z, y).predict_sets(zt)
    probs = softmax(z.astype(np.float64), axis=1)
    from_probs = ConformalPredictor("aps").fit(probs, y).predict_sets(softmax(zt.astype(np.float64), axis=1))
    assert ConformalPredictor("aps").fit(probs, y).fit_info_["input"] == "probabilities"
    assert (from_logits != from_probs).mean() < 1e-4  # the same up to rounding at the threshold


def test_seeded_and_reproducible(data):
    z, y, zt, _ = data
    first = ConformalPredictor("aps", seed=1).fit(z, y)
    again = ConformalPredictor("aps", seed=1).fit(z, y)
    other = ConformalPredictor("aps", seed=2).fit(z, y)
    assert float(first.q_hat) == float(again.q_hat) != float(other.q_hat)
    a, b = first.predict_sets(zt), again.predict_sets(zt)
    assert np.array_equal(a, b)
    assert not np.array_equal(first.predict_sets(zt), a)  # the stream moves on: new draws
    first.fit(z, y)  # a fit restarts it
    assert np.array_equal(first.predict_sets(zt), a)
    assert np.array_equal(
        first.predict_sets(zt, generator=9), first.predict_sets(zt, generator=torch.Generator().manual_seed(9))
    )
    # non-randomised methods do not depend on the seed at all
    thr = [ConformalPredictor("thr", seed=s).fit(z, y).predict_sets(zt) for s in (0, 1)]
    assert np.array_equal(*thr)


def test_ignored_labels_and_prediction_outputs(data):
    from transformers.trainer_utils import PredictionOutput

    z, y, zt, _ = data
    masked = y.copy()
    masked[::7] = -100
    keep = masked != -100
    a = ConformalPredictor("thr").fit(z, masked)
    b = ConformalPredictor("thr").fit(z[keep], y[keep])
    c = ConformalPredictor("thr").fit(PredictionOutput(predictions=z[keep], label_ids=y[keep], metrics={}))
    assert float(a.q_hat) == float(b.q_hat) == float(c.q_hat) and a.fit_info_["num_samples"] == keep.sum()


def test_a_fitted_calibrator_is_applied_first(data):
    z, y, zt, _ = data
    ts = TemperatureScaling().fit(*synthetic(1000, 10, seed=9), progress_bar=False)
    with_calibrator = ConformalPredictor("aps", seed=4).fit(z, y, calibrator=ts)
    on_calibrated = ConformalPredictor("aps", seed=4).fit(ts(torch.from_numpy(z)).numpy(), y)
    assert float(with_calibrator.q_hat) == pytest.approx(float(on_calibrated.q_hat), abs=1e-12)
    assert np.array_equal(
        with_calibrator.predict_sets(zt), on_calibrated.predict_sets(ts(torch.from_numpy(zt)).numpy())
    )
    assert with_calibrator.calibrator is ts and with_calibrator.fit_info_["calibrator"] == {
        "kind": "temperature_scaling",
        "fitted_on": "given fitted",
    }


def test_an_unfitted_calibrator_is_fitted_on_the_tuning_split_only(data):
    z, y, _, _ = data
    ts = TemperatureScaling()
    predictor = ConformalPredictor("thr", tune_fraction=0.3).fit(z, y, calibrator=ts)
    assert ts.is_fitted and ts.fit_info_["num_samples"] == math.ceil(0.3 * 1500) == predictor.fit_info_["num_tune"]
    assert predictor.fit_info_["num_samples"] == 1500 - math.ceil(0.3 * 1500)
    assert predictor.fit_info_["calibrator"]["fitted_on"] == "fitted on the tuning split"


def test_raps_auto_k_reg_is_the_papers_rule():
    z, y = synthetic(800, 10, seed=5)
    p = softmax(z.astype(np.float64), axis=1)
    ranks = np.argmax(np.argsort(-p, axis=1, kind="stable") == y[:, None], axis=1)  # 0-based rank of the label
    for alpha in (0.05, 0.1, 0.3):
        expected = int(np.sort(ranks)[math.ceil((len(y) - 1) * (1 - alpha))]) + 1  # numpy's "higher" quantile, + 1
        assert choose_k_reg(torch.from_numpy(p), torch.from_numpy(y), alpha) == expected


def test_raps_auto_lambda_has_the_smallest_tuning_sets():
    z, y = synthetic(600, 20, seed=6)
    p = softmax(z.astype(np.float64), axis=1)
    rng = np.random.default_rng(0)
    u_cal, u_pred = rng.uniform(size=600), rng.uniform(size=600)
    lam, sizes = choose_penalty(
        torch.from_numpy(p), torch.from_numpy(y), 0.1, 2, torch.from_numpy(u_cal), torch.from_numpy(u_pred)
    )
    # every lambda by brute force: the RAPS score of each class from its rank, the threshold, the mean set size
    order = np.argsort(-p, axis=1, kind="stable")
    ordered = np.take_along_axis(p, order, axis=1)
    for grid_lam, size in sizes.items():

        def score(u):
            return np.cumsum(ordered, axis=1) - u[:, None] * ordered + grid_lam * np.maximum(np.arange(1, 21) - 2, 0)

        rank = np.argmax(order == y[:, None], axis=1)
        q = _kth(score(u_cal)[np.arange(600), rank], 0.1)
        assert size == pytest.approx(np.maximum((score(u_pred) <= q).sum(axis=1), 1).mean(), abs=1e-12)
    assert sizes[lam] == min(sizes.values())


def test_raps_tuning_split_and_record(data):
    z, y, zt, yt = data
    predictor = ConformalPredictor("raps").fit(z, y, alpha=0.1)
    info = predictor.fit_info_
    assert info["num_tune"] == 450 and info["num_samples"] == 1050
    assert info["tuned"] == ["choose RAPS's k_reg", "choose RAPS's lambda"] and info["penalty"] in (
        0.001,
        0.01,
        0.1,
        0.2,
        0.5,
    )
    fixed = ConformalPredictor("raps", k_reg=info["k_reg"], penalty=info["penalty"]).fit(z, y)
    assert fixed.fit_info_["num_tune"] == 0 and fixed.fit_info_["tuned"] == []
    result = predictor.evaluate(zt, yt)
    sets = predictor.predict_sets(zt, generator=0)
    assert set(result) == {"coverage", "mean_set_size"} and 0.8 < coverage(sets, yt) and 1 <= set_size(sets)


# ----------------------------------------------------------------------------- bad input
def test_bad_alpha(data):
    z, y, _, _ = data
    for alpha in (0.0, 1.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="`alpha`"):
            ConformalPredictor("thr").fit(z, y, alpha=alpha)
    with pytest.raises(ValueError, match=r"`alpha`.*n = 15 calibration samples.*every class"):
        ConformalPredictor("thr").fit(z[:15], y[:15], alpha=0.05)
    with pytest.raises(ValueError, match=r"after the tuning split"):
        ConformalPredictor("raps").fit(z[:25], y[:25], alpha=0.05)  # 25 - ceil(7.5) = 17 < 19


def test_bad_inputs_at_fit(data):
    z, y, _, _ = data
    with pytest.raises(ValueError, match=r"`labels`.*\[0, 10\).*found 10"):
        ConformalPredictor("thr").fit(z, np.where(np.arange(len(y)) == 3, 10, y))
    bad = z.copy()
    bad[5, 2] = np.nan
    with pytest.raises(ValueError, match="`logits`.*row 5.*NaN"):
        ConformalPredictor("thr").fit(bad, y)
    with pytest.raises(ValueError, match="same number of samples"):
        ConformalPredictor("thr").fit(z, y[:-1])
    with pytest.raises(TypeError, match="`calibrator`"):
        ConformalPredictor("thr").fit(z, y, calibrator="ts")
    with pytest.raises(ValueError, match="`calibrator`.*K = 10.*fitted on 4"):
        ConformalPredictor("thr").fit(
            z, y, calibrator=VectorScaling().fit(*synthetic(400, 4, seed=1), progress_bar=False)
        )


def test_bad_inputs_at_predict(data):
    z, y, zt, _ = data
    predictor = ConformalPredictor("aps").fit(z, y)
    with pytest.raises(ValueError, match=r"`logits`.*K = 10.*got K = 9"):
        predictor.predict_sets(zt[:, :9])
    bad = zt[:4].copy()
    bad[2, 0] = np.inf
    with pytest.raises(ValueError, match="`logits`.*row 2"):
        predictor.predict_sets(bad)
    with pytest.raises(ValueError, match="rank 2"):
        predictor.predict_sets(zt[0])
    with pytest.raises(TypeError, match="`generator`"):
        predictor.predict_sets(zt, generator="seed")
    with pytest.raises(NotFittedError, match="not fitted"):
        ConformalPredictor("aps").predict_sets(zt)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="`method`"):
        ConformalPredictor("lac")
    with pytest.raises(ValueError, match="`randomized`.*thr"):
        ConformalPredictor("thr", randomized=True)
    with pytest.raises(ValueError, match="`k_reg`.*RAPS"):
        ConformalPredictor("aps", k_reg=2)
    with pytest.raises(ValueError, match="`penalty`"):
        ConformalPredictor("raps", penalty=-0.1)
    with pytest.raises(ValueError, match="`k_reg`"):
        ConformalPredictor("raps", k_reg=-1)
    with pytest.raises(ValueError, match="`tune_fraction`"):
        ConformalPredictor("raps", tune_fraction=1.0)
    with pytest.raises(TypeError, match="`allow_empty`"):
        ConformalPredictor("aps", allow_empty="no")


# ----------------------------------------------------------------------------- issue 29 (fourth sweep)


def test_the_input_kind_of_the_fit_is_used_not_detected_per_call():
    """Item 3: a single logits row that happens to look like probabilities ([0.5078, 0.4828], summing to 0.9906) was
    taken for probabilities alone and for logits in a batch; the predictor now uses what it was fitted on."""
    z, y = synthetic(400, 2, seed=3)
    predictor = ConformalPredictor("thr", allow_empty=True).fit(z, y, alpha=0.1)
    predictor.q_hat.fill_(0.509)  # a threshold between the two readings: 1 - q = 0.491 lies in (0.4874, 0.4938)
    row = np.array([[0.5078, 0.4828]], dtype=np.float32)
    batch = np.concatenate([row, z[:5]])
    q = float(predictor.q_hat)
    expected = softmax(row.astype(np.float64), axis=1) >= 1 - q  # the row as logits, by scipy
    with pytest.warns(UserWarning, match="fitted on logits: they are treated as logits"):
        alone = predictor.predict_sets(row)
    assert np.array_equal(alone, expected) and np.array_equal(predictor.predict_sets(batch)[:1], expected)
    assert expected.sum() == 2  # both classes: the set a batch gave before, {0} alone (the row read as probabilities)
    assert (softmax(np.log(row.astype(np.float64)), axis=1) >= 1 - q).sum() == 1
    assert np.array_equal(
        predictor.predict_sets(row, from_logits=False), softmax(np.log(row.astype(np.float64)), axis=1) >= 1 - q
    )


def test_predict_sets_takes_lists_as_fit_does(data):
    """Item 11: ``fit`` took nested lists, ``predict_sets`` refused them."""
    z, y, zt, _ = data
    predictor = ConformalPredictor("thr").fit(z.tolist(), y.tolist())
    got = predictor.predict_sets(zt[:5].tolist())
    assert isinstance(got, np.ndarray) and np.array_equal(got, predictor.predict_sets(zt[:5].astype(np.float64)))
    with pytest.raises(TypeError, match="`logits`"):
        predictor.predict_sets([[0.1, 0.2], [0.3]])


def test_ties_at_the_threshold_are_counted_and_the_ceiling_is_not_claimed():
    """Item 5: non-randomised APS at K = 2 gives every image's second class the score 1 (the whole mass), so scores
    tie at q_hat = 1 and coverage exceeds 1 - alpha + 1/(n+1); the fit counts the ties and the card says so."""
    from hf_calibration.conformal.card import card_values

    def weak(n, seed):  # ~75 % accurate: more than alpha of the labels rank second
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 2, n)
        return (rng.normal(size=(n, 2)) + 1.0 * np.eye(2)[labels]).astype(np.float32), labels

    z, y = weak(1000, 4)
    zt, yt = weak(20000, 5)
    p = softmax(z.astype(np.float64), axis=1)
    top = p.max(axis=1)
    label_scores = np.where(p.argmax(axis=1) == y, top, 1.0)  # cumulative mass up to the label's rank, by hand
    with pytest.warns(UserWarning, match="tie at the threshold"):
        predictor = ConformalPredictor("aps", randomized=False, allow_empty=True).fit(z, y, alpha=0.1)
    q = float(predictor.q_hat)
    assert q == 1.0 == _kth(label_scores, 0.1)
    assert predictor.fit_info_["ties_at_threshold"] == int((label_scores == 1.0).sum()) > 1
    covered = predictor.evaluate(zt, yt)["coverage"]
    assert covered > 0.9 + 1 / 1001 + 0.02  # above the ceiling: it does not hold with ties
    guarantee = card_values(predictor)["guarantee"]
    assert (
        "does not hold here" in guarantee
        and f"{predictor.fit_info_['ties_at_threshold']} calibration scores tie" in guarantee
    )
    randomised = ConformalPredictor("aps", allow_empty=True, seed=1).fit(z, y, alpha=0.1)
    assert (
        randomised.fit_info_["ties_at_threshold"] == 1
        and "at most 1 - alpha + 1/(n+1)" in card_values(randomised)["guarantee"]
    )
    assert randomised.evaluate(zt, yt)["coverage"] <= 0.9 + 1 / 1001 + 0.01
