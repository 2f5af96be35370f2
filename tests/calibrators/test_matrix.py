"""Matrix scaling with ODIR (Kull et al. 2019): the regularised fit against scipy, the authors' grid and
cross-validation against a brute-force one, the warning when temperature scaling cross-validates better, and the
shared real logits (never worse than the uncalibrated model, within 0.02 of temperature scaling)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from _affine_reference import affine_objective, canonical, fit_affine_reference
from _calibrator_data import SHARED_LOGITS, overconfident, shared_files
from _paths import shared_params

from hf_calibration.calibrators import DirichletCalibration, MatrixScaling, TemperatureScaling
from hf_calibration.calibrators import matrix as matrix_module
from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds


@pytest.mark.parametrize("lam, mu, nu", [(0.0, 0.0, 0.0), (2.0, 0.5, 0.0), (2.0, 0.5, None), (50.0, 50.0, 3.0)])
def test_fit_reaches_the_scipy_minimum_of_the_same_objective(lam, mu, nu):
    z, y = overconfident(400, 4, seed=5)
    f = canonical(z)  # what the map sees
    ms = MatrixScaling(reg_lambda=lam, reg_mu=mu, reg_diagonal=nu, tol=1e-14, max_iter=5000).fit(
        z, y, progress_bar=False
    )
    nu = 4 / 100 if nu is None else nu  # the default: K / 100
    assert ms.fit_info_["reg_diagonal"] == pytest.approx(nu)
    _, ref_objective, ref_nll = fit_affine_reference(f, y, reg_lambda=lam, reg_mu=mu, reg_diagonal=nu)
    assert ms.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-6)
    assert ms.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    x = np.concatenate([ms.weight.detach().numpy().reshape(-1), ms.bias.detach().numpy()])
    assert affine_objective(x, f, y, False, lam, mu, nu)[0] == pytest.approx(ms.fit_info_["best_objective"], abs=1e-12)
    zt = torch.from_numpy(f)
    torch.testing.assert_close(ms(zt), zt @ ms.weight.T + ms.bias, rtol=0, atol=1e-12)


def _brute_force_cv(features, labels, candidates, cv=5, seed=0, nu=0.0):
    """Every candidate (lambda, mu), every fold, fitted by scipy; returns {candidate: mean held-out NLL}."""
    folds = stratified_folds(labels, cv, seed)
    scores = {}
    for lam, mu in candidates:
        total = 0.0
        for train, val in folds:
            x, _, _ = fit_affine_reference(features[train], labels[train], reg_lambda=lam, reg_mu=mu, reg_diagonal=nu)
            total += affine_objective(x, features[val], labels[val])[2] * len(val) / len(labels)
        scores[(lam, mu)] = total
    return scores


def test_cross_validation_of_given_lambdas_picks_what_a_brute_force_search_picks():
    z, y = overconfident(240, 3, seed=7, scale=4.0)
    f = canonical(z)
    lambdas = (100.0, 10.0, 1.0, 0.1)
    scores = _brute_force_cv(f, y, [(lam, lam / 2) for lam in lambdas], nu=0.03)  # mu tied: lambda / (K - 1)
    best = min(scores, key=scores.get)
    ms = MatrixScaling(lambdas=lambdas, cv_patience=None).fit(z, y, progress_bar=False)
    assert (ms.fit_info_["reg_lambda"], ms.fit_info_["reg_mu"]) == pytest.approx(best)
    for row in ms.fit_info_["cv"]:
        if row["folds"] == 5:  # the cross-validation fits stop at a relative 1e-6 (they only rank candidates)
            assert row["cv_nll"] == pytest.approx(scores[(row["reg_lambda"], row["reg_mu"])], abs=1e-4)


def test_a_mu_grid_is_searched_with_lambda():
    z, y = overconfident(200, 3, seed=8, scale=4.0)
    lambdas, mus = (10.0, 0.1), (5.0, 0.05)
    scores = _brute_force_cv(canonical(z), y, [(lam, mu) for lam in lambdas for mu in mus], nu=0.03)
    ms = MatrixScaling(lambdas=lambdas, mus=mus, cv_patience=None).fit(z, y, progress_bar=False)
    assert len(ms.fit_info_["cv"]) == 4
    assert (ms.fit_info_["reg_lambda"], ms.fit_info_["reg_mu"]) == pytest.approx(min(scores, key=scores.get))


@pytest.mark.parametrize("seed", [3])
def test_the_default_search_finds_the_best_point_of_the_authors_grid(monkeypatch, seed):
    # the authors' grid (weights per entry: lambda's 0.25, 0.5, 1 x 10^i, mu's 10^i), narrowed to i = -2..2, searched in
    # full: every candidate on every fold, each fold's fit a fixed-lambda MatrixScaling fit (which the test above checks
    # against scipy; scipy itself took ~3 minutes for these fits), three folds. The search must pick the best candidate,
    # or one within 1e-4 of it (two candidates that close are a tie at the cross-validation fits' tolerance).
    monkeypatch.setattr(matrix_module, "GRID_TOP", 2)
    monkeypatch.setattr(matrix_module, "GRID_BOTTOM_SMALL_K", -2)
    z, y = overconfident(300, 3, seed=seed, scale=3.0)
    k = 3
    decades = [10.0**i for i in range(2, -3, -1)]
    lambdas = [k * (k - 1) * w * s for w in decades for s in (1.0, 0.5, 0.25)]
    folds = stratified_folds(y, 3, 0)
    scores = {}
    for lam in lambdas:
        for mu in (k * m for m in decades):
            total = 0.0
            for train, val in folds:
                fold = MatrixScaling(reg_lambda=lam, reg_mu=mu).fit(z[train], y[train], progress_bar=False)
                total += _test_nll(fold, z[val], y[val]) * len(val) / len(y)
            scores[(lam, mu)] = total
    ms = MatrixScaling(cv=3).fit(z, y, progress_bar=False)
    chosen = (ms.fit_info_["reg_lambda"], ms.fit_info_["reg_mu"])
    assert (
        scores[min(scores, key=lambda c: abs(c[0] - chosen[0]) + abs(c[1] - chosen[1]))] <= min(scores.values()) + 1e-4
    )
    assert len(ms.fit_info_["cv"]) < len(scores) / 3  # it visits a fraction of the grid
    first = ms.fit_info_["cv"][
        0
    ]  # the walk starts at the strongest point, mu tied to lambda (the same weight per entry)
    assert first["reg_lambda"] == pytest.approx(k * (k - 1) * 100) and first["reg_mu"] == pytest.approx(k * 100)
    assert "cross-validation" in ms._card_description()


def test_a_given_mu_is_kept_while_lambda_is_searched():
    z, y = overconfident(200, 3, seed=2)
    ms = MatrixScaling(reg_mu=0.7).fit(z, y, progress_bar=False)
    assert {row["reg_mu"] for row in ms.fit_info_["cv"]} == {0.7} and ms.fit_info_["reg_mu"] == 0.7
    assert len({row["reg_lambda"] for row in ms.fit_info_["cv"]}) > 2


def test_the_grid_range_follows_the_authors_by_number_of_classes():
    assert list(matrix_module.grid_exponents(10)) == list(range(6, -6, -1))  # 10 classes: 1e6 down to 1e-5
    assert list(matrix_module.grid_exponents(100)) == list(range(6, -3, -1))  # 100 classes: 1e6 down to 1e-2


def test_warns_and_names_smaller_calibrators_when_temperature_scaling_cross_validates_better(caplog):
    # 60 samples of 20 classes: far too few for 420 parameters; the cross-validated NLL says so
    z, y = overconfident(60, 20, seed=4, scale=2.0)
    with caplog.at_level(logging.WARNING):
        ms = MatrixScaling().fit(z, y, progress_bar=False)
    assert ms.fit_info_["cv_nll"] > ms.fit_info_["cv_nll_temperature_scaling"]
    assert "above temperature scaling's" in caplog.text and "temperature_scaling, vector_scaling or svs" in caplog.text
    # the baseline is temperature scaling fitted and scored on the same folds (scipy's scalar minimiser below)
    from scipy.optimize import minimize_scalar
    from scipy.special import logsumexp

    total = 0.0
    for train, val in stratified_folds(y, 5, 0):
        zt, zv = z[train].astype(np.float64), z[val].astype(np.float64)

        def nll(log_t, zz, yy):
            s = zz / np.exp(log_t)
            return float(np.mean(logsumexp(s, axis=1) - s[np.arange(len(yy)), yy]))

        t = np.exp(
            minimize_scalar(nll, args=(zt, y[train]), bounds=(-3, 4), method="bounded", options={"xatol": 1e-10}).x
        )
        total += nll(np.log(t), zv, y[val]) * len(val) / len(y)
    assert ms.fit_info_["cv_nll_temperature_scaling"] == pytest.approx(total, abs=1e-6)


def test_no_warning_when_it_cross_validates_better(caplog):
    # per-class sharpness and offsets: what a matrix (or vector) map corrects and one temperature cannot
    z, y = overconfident(1500, 4, seed=6)
    z = z * np.array([0.5, 1.0, 2.0, 4.0], dtype=np.float32) + np.array([1.0, 0.0, -1.0, 2.0], dtype=np.float32)
    with caplog.at_level(logging.WARNING):
        ms = MatrixScaling().fit(z, y, progress_bar=False)
    assert ms.fit_info_["cv_nll"] <= ms.fit_info_["cv_nll_temperature_scaling"]
    assert "above temperature scaling's" not in caplog.text


def test_bad_arguments():
    with pytest.raises(TypeError, match="lambdas"):
        MatrixScaling(lambdas="1,2")
    with pytest.raises(ValueError, match="reg_mu"):
        MatrixScaling(reg_mu=-1.0)
    with pytest.raises(ValueError, match="reg_diagonal"):
        MatrixScaling(reg_diagonal=-0.1)
    with pytest.raises(ValueError, match="cv"):
        MatrixScaling(cv=1)
    with pytest.raises(TypeError, match="cv_seed"):
        MatrixScaling(cv_seed=0.5)


def test_a_diverging_fit_is_a_value_error_that_says_why(monkeypatch):
    # a class the fit set never shows can be pushed to -inf by a weakly regularised fit: the user gets a sentence
    # about the data, not the optimiser's FloatingPointError
    def diverge(*args, **kwargs):
        raise FloatingPointError("The fit objective or its gradient became non-finite (the fit diverged).")

    monkeypatch.setattr(MatrixScaling, "_fit_final", diverge)
    rng = np.random.default_rng(0)
    y = np.array([0, 1, 2, 3] * 5)
    z = rng.normal(size=(20, 6)).astype(np.float32)
    with pytest.raises(
        ValueError,
        match=r"diverged on 20 labelled samples with K = 6 classes \(2 of them never a label\).*temperature_scaling",
    ):
        MatrixScaling(reg_lambda=1e-3, reg_mu=1e-3).fit(z, y, progress_bar=False)


def test_the_papers_free_diagonal_has_no_optimum_when_a_class_is_always_right():
    # the reason for reg_diagonal: class 0's samples are all classified correctly, so with the diagonal free its weight
    # only grows (it makes class 0 impossible wherever it is not ranked first, at no cost on the fit set)
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 300)
    z = rng.normal(size=(300, 3)) + 1.5 * np.eye(3)[y]
    z[y == 0, 0] += 5.0
    free = MatrixScaling(reg_lambda=1.0, reg_mu=1.0, reg_diagonal=0.0, max_iter=300).fit(
        z.astype(np.float32), y, progress_bar=False
    )
    shrunk = MatrixScaling(reg_lambda=1.0, reg_mu=1.0).fit(z.astype(np.float32), y, progress_bar=False)
    free_w, shrunk_w = float(free.weight.detach()[0, 0]), float(shrunk.weight.detach()[0, 0])
    assert free_w > 10 * shrunk_w and shrunk_w < 5


# ---------------------------------------------------------------------------------------------------------- shared files
needs_shared = pytest.mark.skipif(not shared_files(), reason="the shared real-logit files are not beside the repo")


def _test_nll(cal, zt, yt) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(cal(torch.from_numpy(zt)).double(), torch.from_numpy(yt)))


@needs_shared
@pytest.mark.parametrize("cls", [MatrixScaling, DirichletCalibration], ids=["matrix", "dirichlet"])
@pytest.mark.parametrize("path", shared_params(shared_files()), ids=lambda p: getattr(p, "stem", p))
def test_never_worse_than_uncalibrated_and_within_0_02_of_temperature_scaling(cls, path):
    with np.load(path) as d:
        zv, yv, zt, yt = d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]
    cal = cls().fit(zv, yv, progress_bar=False)
    ours = _test_nll(cal, zt, yt)
    uncalibrated = float(torch.nn.functional.cross_entropy(torch.from_numpy(zt).double(), torch.from_numpy(yt)))
    ts = _test_nll(TemperatureScaling().fit(zv, yv, progress_bar=False), zt, yt)
    assert ours < uncalibrated
    assert ours <= ts + 0.02
    # the chosen lambda sits inside the authors' grid, not at one of its ends
    k = zv.shape[1]
    per_entry = cal.fit_info_["reg_lambda"] / (k * (k - 1))
    exponents = matrix_module.grid_exponents(k)
    assert 0.25 * 10.0 ** exponents[-1] * 1.0001 < per_entry < 10.0 ** exponents[0] * 0.9999


@needs_shared
def test_densenet_cifar100_matrix_scaling_no_longer_overfits():
    # the case: test NLL 1.287 with the paper's free diagonal (uncalibrated 1.230, temperature scaling 0.881)
    with np.load(SHARED_LOGITS / "netcal_densenet-bc-100-cifar-100.npz") as d:
        zv, yv, zt, yt = d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]
    ms = MatrixScaling().fit(zv, yv, progress_bar=False)
    assert _test_nll(ms, zt, yt) < 0.881
    assert float(torch.diagonal(ms.weight).max()) < 2  # no runaway diagonal weight
