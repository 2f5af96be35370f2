"""The same thresholds and sets as MAPIE (an independent implementation, in the `test` extra) on the same data.

MAPIE's LAC is our THR; its APS with ``include_last_label="randomized"`` draws one uniform per image for the
calibration scores and one per image for the sets, as the paper does, so given MAPIE's draws our scores must give its
threshold and its randomised sets exactly (up to MAPIE's 1e-8 tolerance at the threshold).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _conformal_data import shared_file, synthetic
from scipy.special import softmax

from hf_calibration.conformal import ConformalPredictor
from hf_calibration.conformal.quantile import conformal_quantile
from hf_calibration.conformal.scores import conformity_scores, sets_from_scores

pytest.importorskip("mapie", reason="MAPIE is not installed (pip install -e '.[test]')")
from mapie.classification import SplitConformalClassifier  # noqa: E402
from sklearn.base import BaseEstimator, ClassifierMixin  # noqa: E402

ALPHAS = (0.05, 0.1, 0.2)


class _GivenProbabilities(ClassifierMixin, BaseEstimator):
    """A fitted scikit-learn classifier whose inputs are its predicted probabilities (MAPIE wants an estimator)."""

    def __init__(self, num_classes: int = 10):
        self.num_classes = num_classes

    def fit(self, X, y):
        self.classes_ = np.arange(self.num_classes)
        return self

    def predict_proba(self, X):
        return np.asarray(X)

    def predict(self, X):
        return np.asarray(X).argmax(axis=1)


def _data():
    cases = [synthetic(4000, 10, seed=3), synthetic(4000, 100, seed=4)]
    path = shared_file("cifar10_resnet50_focal_loss_calibench.npz")
    if path is not None:
        d = np.load(path)
        cases.append((d["logits_val"], d["labels_val"]))
    return cases


def _mapie(probs, labels, alpha, score, seed=None):
    estimator = _GivenProbabilities(probs.shape[1]).fit(probs, labels)
    return SplitConformalClassifier(
        estimator, confidence_level=1 - alpha, conformity_score=score, prefit=True, random_state=seed
    ).conformalize(probs, labels)


def _equal_away_from_the_threshold(ours, theirs, scores, q_hat, probs=None):
    """Equal on every image where MAPIE's 1e-8 tolerances cannot act: no score within 1e-8 of the threshold and, for
    APS (``probs`` given), no two of the top |set| + 2 probabilities within 1e-8 (MAPIE keeps every class within 1e-8
    of the class crossing the threshold, then may drop only that one)."""
    clear = (np.abs(scores - q_hat) > 1e-8).all(axis=1)
    if probs is not None:
        gaps = -np.diff(np.sort(probs, axis=1)[:, ::-1], axis=1)  # gap after each rank
        near_the_set = np.arange(gaps.shape[1])[None, :] <= ours.sum(axis=1, keepdims=True)
        clear &= ~(near_the_set & (gaps <= 1e-8)).any(axis=1)
    assert clear.mean() > 0.95
    assert np.array_equal(ours[clear], theirs[clear])


def test_thr_equals_mapies_lac():
    for z, y in _data():
        n = len(y) // 2
        probs = softmax(z.astype(np.float64), axis=1)
        for alpha in ALPHAS:
            mapie = _mapie(probs[:n], y[:n], alpha, "lac")
            _, theirs = mapie.predict_set(probs[n:])  # computes MAPIE's threshold, quantiles_
            q_hat = float(mapie._mapie_classifier.conformity_score_function_.quantiles_[0])
            ours = ConformalPredictor("thr", allow_empty=True).fit(z[:n], y[:n], alpha=alpha)
            assert float(ours.q_hat) == pytest.approx(q_hat, rel=0, abs=1e-12)
            _equal_away_from_the_threshold(ours.predict_sets(z[n:]), theirs[:, :, 0], 1 - probs[n:], q_hat)


def test_randomised_aps_equals_mapies_from_the_same_draws():
    for z, y in _data():
        n = len(y) // 2
        probs = softmax(z.astype(np.float64), axis=1)
        p = torch.from_numpy(probs)
        for alpha in ALPHAS:
            mapie = _mapie(probs[:n], y[:n], alpha, "aps", seed=5)
            _, theirs = mapie.predict_set(probs[n:], conformity_score_params={"include_last_label": "randomized"})
            # MAPIE restarts RandomState(5) for the calibration scores and again for the sets: one draw per image each
            u_fit = torch.from_numpy(np.random.RandomState(5).uniform(size=n))
            u_sets = torch.from_numpy(np.random.RandomState(5).uniform(size=len(y) - n))
            q_hat = conformal_quantile(
                conformity_scores(p[:n], "aps", u_fit)[torch.arange(n), torch.from_numpy(y[:n])], alpha
            )
            assert q_hat == pytest.approx(
                float(mapie._mapie_classifier.conformity_score_function_.quantiles_[0]), rel=0, abs=1e-12
            )
            scores = conformity_scores(p[n:], "aps", u_sets)
            ours = sets_from_scores(scores, q_hat, allow_empty=True).numpy()
            _equal_away_from_the_threshold(ours, theirs[:, :, 0], scores.numpy(), q_hat, probs[n:])
