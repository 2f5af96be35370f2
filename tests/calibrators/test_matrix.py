"""Matrix scaling with ODIR (Kull et al. 2019): the regularised fit against scipy, the paper's cross-validation
against a brute-force one, torch-uncertainty on shared logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import affine_objective, canonical, fit_affine_reference
from _calibrator_data import SHARED_LOGITS, overconfident

from hf_calibration.calibrators import MatrixScaling
from hf_calibration.calibrators._cv import stratified_folds


@pytest.mark.parametrize("lam, mu", [(0.0, 0.0), (2.0, 0.5), (50.0, 50.0)])
def test_fit_reaches_the_scipy_minimum_of_the_same_objective(lam, mu):
    z, y = overconfident(400, 4, seed=5)
    f = canonical(z)  # what the map sees
    _, ref_objective, ref_nll = fit_affine_reference(f, y, reg_lambda=lam, reg_mu=mu)
    ms = MatrixScaling(reg_lambda=lam, reg_mu=mu, tol=1e-14, max_iter=5000).fit(z, y, progress_bar=False)
    assert ms.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-6)
    assert ms.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    x = np.concatenate([ms.weight.detach().numpy().reshape(-1), ms.bias.detach().numpy()])
    assert affine_objective(x, f, y, False, lam, mu)[0] == pytest.approx(ms.fit_info_["best_objective"], abs=1e-12)
    zt = torch.from_numpy(f)
    torch.testing.assert_close(ms(zt), zt @ ms.weight.T + ms.bias, rtol=0, atol=1e-12)


def _brute_force_cv(features, labels, lambdas, mus_of, cv=5, seed=0):
    """Every candidate, every fold, fitted by scipy; the candidate with the lowest mean held-out NLL."""
    folds = stratified_folds(labels, cv, seed)
    scores = {}
    for lam in lambdas:
        for mu in mus_of(lam):
            total = 0.0
            for train, val in folds:
                x, _, _ = fit_affine_reference(features[train], labels[train], reg_lambda=lam, reg_mu=mu)
                total += affine_objective(x, features[val], labels[val])[2] * len(val) / len(labels)
            scores[(lam, mu)] = total
    return min(scores, key=scores.get), scores


def test_cross_validation_picks_what_a_brute_force_search_picks():
    z, y = overconfident(240, 3, seed=7, scale=4.0)
    f = canonical(z)
    lambdas = (100.0, 10.0, 1.0, 0.1)
    best, scores = _brute_force_cv(f, y, lambdas, lambda lam: (lam / 2,))  # mu tied: lambda / (K - 1)
    ms = MatrixScaling(lambdas=lambdas, cv_patience=None).fit(z, y, progress_bar=False)
    assert (ms.fit_info_["reg_lambda"], ms.fit_info_["reg_mu"]) == pytest.approx(best)
    for row in ms.fit_info_["cv"]:  # the cross-validation fits stop at a relative 1e-7 (they only rank candidates)
        assert row["cv_nll"] == pytest.approx(scores[(row["reg_lambda"], row["reg_mu"])], abs=1e-4)


def test_a_mu_grid_is_searched_with_lambda():
    z, y = overconfident(200, 3, seed=8, scale=4.0)
    lambdas, mus = (10.0, 0.1), (5.0, 0.05)
    best, _ = _brute_force_cv(canonical(z), y, lambdas, lambda lam: mus)
    ms = MatrixScaling(lambdas=lambdas, mus=mus, cv_patience=None).fit(z, y, progress_bar=False)
    assert len(ms.fit_info_["cv"]) == 4
    assert (ms.fit_info_["reg_lambda"], ms.fit_info_["reg_mu"]) == pytest.approx(best)


def test_the_walk_stops_after_the_best_candidate():
    z, y = overconfident(400, 4, seed=9)
    ms = MatrixScaling(cv_patience=1).fit(z, y, progress_bar=False)
    table = ms.fit_info_["cv"]
    scores = [row["cv_nll"] for row in table]
    best = int(np.argmin(scores))
    assert len(table) == best + 2 or len(table) == 6  # one candidate past the best (or the grid ran out)
    # the default grid is a weight of 10, 1, 0.1, ... per off-diagonal entry: lambda = K (K - 1) w, mu = lambda / (K - 1)
    assert table[0]["reg_lambda"] == pytest.approx(10 * 4 * 3) and table[0]["reg_mu"] == pytest.approx(10 * 4)
    assert "cross-validation" in ms._card_description()


def test_bad_arguments():
    with pytest.raises(TypeError, match="lambdas"):
        MatrixScaling(lambdas="1,2")
    with pytest.raises(ValueError, match="reg_mu"):
        MatrixScaling(reg_mu=-1.0)
    with pytest.raises(ValueError, match="cv"):
        MatrixScaling(cv=1)
    with pytest.raises(TypeError, match="cv_seed"):
        MatrixScaling(cv_seed=0.5)


def test_a_diverging_fit_is_a_value_error_that_says_why(monkeypatch):
    # ODIR leaves the diagonal free: on a calibration set too small for K^2 + K parameters the LBFGS objective can
    # run to -inf; the user gets a sentence about the data, not the optimiser's FloatingPointError
    def diverge(*args, **kwargs):
        raise FloatingPointError("The fit objective or its gradient became non-finite (the fit diverged).")

    monkeypatch.setattr(MatrixScaling, "_fit_final", diverge)
    rng = np.random.default_rng(0)
    y = np.array([0, 1, 2, 3] * 5)
    z = rng.normal(size=(20, 6)).astype(np.float32)
    with pytest.raises(ValueError, match=r"diverged on 20 labelled samples with K = 6 classes \(2 of them never a label\).*temperature_scaling"):
        MatrixScaling(reg_lambda=1e-3, reg_mu=1e-3).fit(z, y, progress_bar=False)


@pytest.mark.skipif(not (SHARED_LOGITS / "netcal_wideresnet-16-4-cifar-100.npz").is_file(), reason="needs ../shared")
def test_fifty_samples_of_a_hundred_classes_diverge_with_a_clear_error():
    with np.load(SHARED_LOGITS / "netcal_wideresnet-16-4-cifar-100.npz") as data:
        z, y = data["logits_val"][:50], data["labels_val"][:50]
    with pytest.raises(ValueError, match=r"K = 100 classes \(63 of them never a label\)"):
        MatrixScaling().fit(z, y, progress_bar=False)
