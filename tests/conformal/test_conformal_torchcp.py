"""The same sets as TorchCP (an independent implementation) on the same data; skipped where TorchCP is not installed.

TorchCP's non-randomised THR (LAC), APS and RAPS threshold the same scores with the same finite-sample quantile, so the
thresholds and the sets must be equal. Its randomised sets draw one uniform per class (ours: one per image, as the
paper), so for those the calibration threshold is compared, from the same uniform draws.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _conformal_data import shared_file, synthetic

from hf_calibration.conformal import ConformalPredictor
from hf_calibration.conformal.quantile import conformal_quantile
from hf_calibration.conformal.scores import conformity_scores

torchcp = pytest.importorskip("torchcp.classification", reason="TorchCP is not installed")

ALPHAS = (0.05, 0.1, 0.2)
PENALTY, K_REG = 0.125, 2  # a lambda exact in float32: TorchCP builds its penalty in float32


def _data():
    cases = [synthetic(3000, 10, seed=1), synthetic(3000, 100, seed=2)]
    path = shared_file("netcal_wideresnet-16-4-cifar-100.npz")
    if path is not None:
        d = np.load(path)
        cases.append(
            (np.concatenate([d["logits_val"], d["logits_test"]]), np.concatenate([d["labels_val"], d["labels_test"]]))
        )
    return [(z.astype(np.float64), y) for z, y in cases]


def _torchcp(method: str, randomized: bool):
    from torchcp.classification.predictor import SplitPredictor
    from torchcp.classification.score import APS, LAC, RAPS

    score = {
        "thr": lambda: LAC(),
        "aps": lambda: APS(randomized=randomized),
        "raps": lambda: RAPS(randomized=randomized, penalty=PENALTY, kreg=K_REG),
    }[method]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # its `temperature` argument
        return SplitPredictor(score)


@pytest.mark.parametrize("method", ["thr", "aps", "raps"])
def test_non_randomised_sets_equal_torchcps(method):
    for z, y in _data():
        n = len(y) // 2
        for alpha in ALPHAS:
            ours = ConformalPredictor(
                method,
                randomized=False,
                allow_empty=True,
                **({"k_reg": K_REG, "penalty": PENALTY} if method == "raps" else {}),
            ).fit(z[:n], y[:n], alpha=alpha)
            theirs = _torchcp(method, randomized=False)
            theirs.calculate_threshold(torch.from_numpy(z[:n]), torch.from_numpy(y[:n]), alpha)
            # our compiled kernels take the float64 softmax with their own vectorised exp (a few ulp from torch's): the
            # thresholds agree to rounding, and the sets wherever no score lies within rounding of the threshold
            q_hat = float(theirs.q_hat)
            assert float(ours.q_hat) == pytest.approx(q_hat, rel=0, abs=1e-12)
            expected = theirs.predict_with_logits(torch.from_numpy(z[n:])).bool().numpy()
            got = ours.predict_sets(z[n:])
            scores = conformity_scores(
                torch.softmax(torch.from_numpy(z[n:]), 1), method, k_reg=K_REG, penalty=PENALTY
            ).numpy()
            clear = (np.abs(scores - q_hat) > 1e-12).all(axis=1)
            assert got.dtype == np.bool_ and clear.mean() > 0.99 and np.array_equal(got[clear], expected[clear])


@pytest.mark.parametrize("method", ["aps", "raps"])
def test_randomised_threshold_equals_torchcps_from_the_same_draws(method):
    for z, y in _data():
        zt, yt = torch.from_numpy(z), torch.from_numpy(y)
        for alpha in ALPHAS:
            theirs = _torchcp(method, randomized=True)
            torch.manual_seed(7)
            theirs.calculate_threshold(zt, yt, alpha)  # draws one uniform (float32) per calibration sample
            torch.manual_seed(7)
            u = torch.rand(len(y)).double()
            scores = conformity_scores(torch.softmax(zt, 1), method, u, k_reg=K_REG, penalty=PENALTY)
            assert conformal_quantile(scores[torch.arange(len(y)), yt], alpha) == float(theirs.q_hat)
