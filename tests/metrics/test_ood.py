"""OOD metrics against scikit-learn (roc_auc_score, average_precision_score) and a brute-force FPR95, to 1e-12."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from hf_calibration.metrics import ood_metrics, ood_metrics_from_scores, ood_scores


def brute_force_fpr95(in_scores: np.ndarray, out_scores: np.ndarray) -> float:
    """Smallest FPR over every threshold t (each distinct score) with TPR = P_in(s >= t) >= 0.95."""
    best = 1.0
    for t in np.unique(np.r_[in_scores, out_scores]):
        if (in_scores >= t).sum() * 20 >= 19 * len(in_scores):
            best = min(best, float((out_scores >= t).mean()))
    return best


def references(in_scores: np.ndarray, out_scores: np.ndarray) -> dict[str, float]:
    y = np.r_[np.ones(len(in_scores)), np.zeros(len(out_scores))]
    s = np.r_[in_scores, out_scores]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    assert (
        abs(fpr[np.argmax(tpr >= 0.95 - 1e-15)] - brute_force_fpr95(in_scores, out_scores)) < 1e-12
    )  # two references agree
    return {
        "auroc": roc_auc_score(y, s),
        "aupr_in": average_precision_score(y, s),
        "aupr_out": average_precision_score(1 - y, -s),
        "fpr95": brute_force_fpr95(in_scores, out_scores),
    }


@pytest.mark.parametrize("seed", range(20))
def test_metrics_from_scores_match_sklearn_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    if seed % 2:  # heavy ties
        a, b = (
            rng.integers(0, 5, rng.integers(1, 60)).astype(float),
            rng.integers(0, 5, rng.integers(1, 60)).astype(float),
        )
    else:
        a, b = rng.normal(1.0, 1.0, rng.integers(1, 300)), rng.normal(0.0, 1.0, rng.integers(1, 300))
    got, ref = ood_metrics_from_scores(a, b), references(a, b)
    assert set(got) == {"auroc", "aupr_in", "aupr_out", "fpr95"}
    for key in ref:
        assert abs(got[key] - ref[key]) <= 1e-12, key


@pytest.mark.parametrize("score", ["msp", "max_logit", "energy"])
def test_scores_from_logits(score):
    rng = np.random.default_rng(0)
    z_in, z_out = rng.normal(0, 3, (200, 10)), rng.normal(0, 1, (150, 10))
    expected = {
        "msp": lambda z: softmax(z, axis=1).max(axis=1),
        "max_logit": lambda z: z.max(axis=1),
        "energy": lambda z: logsumexp(z, axis=1),  # negative free energy at T = 1
    }[score]
    np.testing.assert_allclose(ood_scores(z_in, score), expected(z_in), rtol=1e-13, atol=0)
    got, ref = ood_metrics(z_in, z_out, score), references(expected(z_in), expected(z_out))
    for key in ref:
        assert abs(got[key] - ref[key]) <= 1e-12, key
    # torch, float32 in and float32 out: same numbers as their float64 upcast
    t = ood_metrics(torch.tensor(z_in, dtype=torch.float32), torch.tensor(z_out, dtype=torch.float32), score)
    assert t == ood_metrics(
        z_in.astype(np.float32).astype(np.float64), z_out.astype(np.float32).astype(np.float64), score
    )


def test_energy_temperature():
    z = np.random.default_rng(1).normal(0, 2, (50, 5))
    np.testing.assert_allclose(ood_scores(z, "energy", temperature=2.5), 2.5 * logsumexp(z / 2.5, axis=1), rtol=1e-13)


def test_hand_worked_example():
    # MSP of [4,0],[3,0],[1,0] vs [0.5,0],[2,0]: in 0.982, 0.953, 0.731; out 0.622, 0.881
    got = ood_metrics(np.array([[4.0, 0.0], [3.0, 0.0], [1.0, 0.0]]), np.array([[0.5, 0.0], [2.0, 0.0]]))
    assert got["auroc"] == pytest.approx(5 / 6, abs=1e-15)  # 5 of the 6 (in, out) pairs ordered right
    assert got["aupr_in"] == pytest.approx((1 + 1 + 3 / 4) / 3, abs=1e-15)  # precision 1, 1, 3/4 at each in sample
    assert got["fpr95"] == 0.5  # accepting all 3 in samples also accepts the OOD 0.881
    # all tied: AUROC 1/2 (ties count half), AP = base rate, FPR95 = 1
    tied = ood_metrics_from_scores(np.zeros(3), np.zeros(2))
    assert tied == {"auroc": 0.5, "aupr_in": 0.6, "aupr_out": 0.4, "fpr95": 1.0}


def test_fpr95_is_the_at_least_95_percent_point():
    in_scores = np.arange(100, dtype=float)  # accept >= t: TPR 95 % exactly at t = 5
    out_scores = np.array([4.5, 5.5, 50.0])
    assert ood_metrics_from_scores(in_scores, out_scores)["fpr95"] == pytest.approx(2 / 3)  # 5.5 and 50 >= 5


def test_probabilities_are_detected_for_msp_and_refused_for_logit_scores():
    rng = np.random.default_rng(2)
    z_in, z_out = rng.normal(0, 3, (40, 4)), rng.normal(0, 1, (30, 4))
    p_in, p_out = softmax(z_in, axis=1), softmax(z_out, axis=1)
    assert ood_metrics(p_in, p_out, "msp") == pytest.approx(ood_metrics(z_in, z_out, "msp"), abs=1e-12)
    for score in ("max_logit", "energy"):
        with pytest.raises(ValueError, match="logits"):
            ood_metrics(p_in, p_out, score)


@pytest.mark.parametrize(
    "a,b,kwargs,error,match",
    [
        (np.zeros((3, 2)), np.zeros((2, 3)), {}, ValueError, "same K"),
        (np.zeros(3), np.zeros((2, 3)), {}, ValueError, "`in_logits`"),
        (np.zeros((0, 3)), np.zeros((2, 3)), {}, ValueError, "non-empty"),
        (np.zeros((3, 1)), np.zeros((2, 1)), {}, ValueError, "K >= 2"),
        (np.zeros((3, 2), dtype=np.int64), np.zeros((2, 2)), {}, TypeError, "floating"),
        (np.array([[0.0, np.nan]]), np.zeros((2, 2)), {}, ValueError, "finite"),
        (np.zeros((3, 2)), np.array([[np.inf, 0.0]]), {}, ValueError, "`out_logits`"),
        (np.zeros((3, 2)), np.zeros((2, 2)), {"score": "odin"}, ValueError, "`score`"),
        (np.zeros((3, 2)), np.zeros((2, 2)), {"score": "energy", "temperature": 0.0}, ValueError, "`temperature`"),
        (np.zeros((3, 2)), np.zeros((2, 2)), {"from_logits": "yes"}, TypeError, "`from_logits`"),
        ("logits", np.zeros((2, 2)), {}, TypeError, "`in_logits`"),
    ],
)
def test_bad_input(a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        ood_metrics(a, b, **kwargs)


def test_bad_scores():
    with pytest.raises(ValueError, match="`in_scores`"):
        ood_metrics_from_scores(np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="`out_scores`"):
        ood_metrics_from_scores(np.zeros(2), np.array([np.nan]))


def test_docstring_examples():
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module("hf_calibration.metrics.ood"), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
