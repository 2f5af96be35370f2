"""Brier score and NLL against scikit-learn, a direct formula and hand-worked values."""

import math

import _metric_reference as ref
import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss, log_loss

from hf_calibration.metrics import brier, nll


def test_hand_worked():
    # row (.7, .2, .1), label 0: Brier = .3^2 + .2^2 + .1^2 = .14, NLL = -ln .7
    # row (.5, .25, .25), label 2: Brier = .25 + .0625 + .5625 = .875, NLL = -ln .25
    probs = np.array([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]])
    target = np.array([0, 2])
    assert brier(probs, target, from_logits=False) == pytest.approx((0.14 + 0.875) / 2, abs=1e-12)
    assert nll(probs, target, from_logits=False) == pytest.approx((-math.log(0.7) - math.log(0.25)) / 2, abs=1e-12)


@pytest.mark.parametrize("k", [2, 5, 50])
def test_equal_sklearn_and_direct_formula(k):
    rng = np.random.default_rng(k)
    logits = rng.normal(size=(700, k)) * 2
    target = rng.integers(0, k, 700)
    probs = ref.softmax(logits)
    onehot = np.eye(k)[target]
    direct = ((probs - onehot) ** 2).sum(axis=1).mean()
    assert brier(logits, target) == pytest.approx(direct, abs=1e-12)
    assert brier(logits, target) == pytest.approx(
        brier_score_loss(target, probs, labels=np.arange(k), scale_by_half=False), abs=1e-12
    )
    assert nll(logits, target) == pytest.approx(log_loss(target, probs, labels=np.arange(k)), abs=1e-10)
    assert nll(probs, target, from_logits=False) == pytest.approx(
        log_loss(target, probs, labels=np.arange(k)), abs=1e-10
    )
    # torch's cross-entropy is the same NLL
    ce = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(target)).item()
    assert nll(torch.from_numpy(logits), torch.from_numpy(target)) == pytest.approx(ce, abs=1e-12)


def test_nll_is_exact_for_extreme_logits():
    # softmax underflows to 0 for the true class, the log-softmax does not: NLL = 1000 - 0 + log(1 + e^-1000)
    logits = np.array([[0.0, 1000.0], [5.0, 0.0]])
    target = np.array([0, 0])
    assert nll(logits, target) == pytest.approx((1000.0 + math.log1p(math.exp(-5.0))) / 2, rel=1e-12)
    # from probabilities a true-class probability of exactly 0 is an infinite NLL, not a clipped one
    assert nll(np.array([[0.0, 1.0]]), np.array([0]), from_logits=False) == math.inf


def test_brier_range_and_ignore_index():
    probs = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    target = np.array([1, 1, -100])
    # row 0 completely wrong: 1 + 1 = 2; row 1 right: 0; row 2 ignored
    assert brier(probs, target, from_logits=False) == pytest.approx(1.0, abs=1e-15)
    assert nll(probs[1:2], target[1:2], from_logits=False) == 0.0
