"""The guarantee on real logits: over 50 random calibration / test splits of the shared files, the mean empirical
coverage is within one point of 1 - alpha (skipped when ../shared is absent)."""

from __future__ import annotations

import numpy as np
import pytest
from _conformal_data import shared_file

from hf_calibration.conformal import ConformalPredictor, coverage

FILES = {
    "resnet50-cifar10": "cifar10_resnet50_cross_entropy_calibench.npz",  # K = 10, 95 % accurate
    "densenet-cifar100": "netcal_densenet-bc-100-cifar-100.npz",  # K = 100
}
SPLITS, N_CAL, N_TEST = 50, 1000, 2000
CASES = [  # (method, randomized): the paper's randomised APS / RAPS, and the non-randomised forms
    ("thr", False),
    ("aps", True),
    ("raps", True),
    ("aps", False),
    ("raps", False),
]


def _pooled(name):
    path = shared_file(FILES[name])
    if path is None:
        pytest.skip("the shared real-logit files are not beside the repo")
    d = np.load(path)
    return np.concatenate([d["logits_val"], d["logits_test"]]), np.concatenate([d["labels_val"], d["labels_test"]])


def _mean_coverage(z, y, alpha, **predictor_kwargs) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    covered, sizes = [], []
    for split in range(SPLITS):
        rows = rng.permutation(len(y))[: N_CAL + N_TEST]
        cal, test = rows[:N_CAL], rows[N_CAL:]
        predictor = ConformalPredictor(seed=split, **predictor_kwargs).fit(z[cal], y[cal], alpha=alpha)
        sets = predictor.predict_sets(z[test])
        covered.append(coverage(sets, y[test]))
        sizes.append(sets.sum(axis=1).mean())
    return float(np.mean(covered)), float(np.mean(sizes))


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("method,randomized", CASES)
def test_mean_coverage_is_within_one_point_of_the_target(name, method, randomized):
    z, y = _pooled(name)
    for alpha in (0.05, 0.1, 0.2):
        mean, _ = _mean_coverage(z, y, alpha, method=method, randomized=randomized, allow_empty=True)
        assert abs(mean - (1 - alpha)) <= 0.01, (name, method, randomized, alpha, mean)


@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
def test_never_empty_sets_keep_the_lower_bound(method):
    # the default (an empty set gets the top class): at least 1 - alpha, here more since the model is 95 % accurate
    z, y = _pooled("resnet50-cifar10")
    for alpha in (0.05, 0.2):
        mean, size = _mean_coverage(z, y, alpha, method=method)
        exact, exact_size = _mean_coverage(z, y, alpha, method=method, allow_empty=True)
        assert mean >= 1 - alpha - 0.005 and mean >= exact and size >= exact_size
