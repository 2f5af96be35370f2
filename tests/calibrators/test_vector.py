"""Vector scaling (Guo et al. 2017): the fit against scipy on the same NLL, per-class sizing, torch-uncertainty."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from _affine_reference import canonical, fit_affine_reference
from _calibrator_data import overconfident

from hf_calibration.calibrators import VectorScaling


@pytest.mark.parametrize("reg", [0.0, None, 0.5])
def test_fit_reaches_the_scipy_minimum_of_the_same_objective(reg):
    z, y = overconfident(800, 8, seed=3)
    lam, mu = (8 / 100, 8 / 1000) if reg is None else (reg, reg)  # the defaults: K / 100, K / 1000
    ref_x, ref_objective, ref_nll = fit_affine_reference(canonical(z), y, diagonal=True, reg_lambda=lam, reg_mu=mu)
    vs = VectorScaling(reg_lambda=reg, reg_mu=reg).fit(z, y, progress_bar=False)
    assert vs.fit_info_["reg_lambda"] == lam and vs.fit_info_["reg_mu"] == mu
    assert vs.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-6)
    assert vs.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    # and the calibrated logits are w * z + b with the fitted parameters, on z relative to its row maximum
    zt = torch.from_numpy(canonical(z))
    torch.testing.assert_close(vs(zt), zt * vs.weight + vs.bias, rtol=0, atol=1e-12)
    # any row offset gives the same map (up to the float32 rounding of z - max z above)
    torch.testing.assert_close(vs(torch.from_numpy(z).double() + 7.0), vs(zt), rtol=0, atol=1e-5)
    np.testing.assert_allclose(vs.weight.detach().numpy(), ref_x[:8], atol=1e-3)


def test_sized_by_the_fit_and_refuses_other_class_counts():
    z, y = overconfident(300, 5, seed=1)
    vs = VectorScaling()
    assert vs.num_classes is None
    vs.fit(z, y, progress_bar=False)
    assert vs.num_classes == 5 and vs.weight.shape == (5,) and vs._hub_mixin_config["num_classes"] == 5
    with pytest.raises(ValueError, match="K = 5 classes"):
        vs(torch.zeros(2, 6))
    assert vs.fit_info_["accuracy_after"] == pytest.approx(
        float((vs(torch.from_numpy(z)).argmax(1).numpy() == y).mean())
    )


def test_warns_about_classes_without_samples(caplog):
    z, y = overconfident(300, 5, seed=1)
    keep = y != 3
    with caplog.at_level(logging.WARNING):
        VectorScaling().fit(z[keep], y[keep], progress_bar=False)
    assert "no calibration sample" in caplog.text and "class 3" in caplog.text


def test_bad_arguments():
    with pytest.raises(TypeError, match="max_iter"):
        VectorScaling(max_iter=1.5)
    with pytest.raises(ValueError, match="num_classes"):
        VectorScaling(num_classes=1)


def test_card_says_it_may_change_predictions(tmp_path):
    z, y = overconfident(300, 5, seed=2)
    VectorScaling().fit(z, y, progress_bar=False).save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert (
        "may change the predicted class" in card
        and "vector scaling, Guo et al. 2017" in card
        and "lambda = 0.05, mu = 0.005" in card
    )
    config = (tmp_path / "config.json").read_text()
    assert '"num_classes": 5' in config and '"calibrator": "vector_scaling"' in config


def test_strong_weight_shrinkage_is_temperature_scaling():
    # the weights shrink towards their mean, not towards 1: with lambda and mu large the fit is temperature scaling,
    # whose T is found here by scipy's scalar minimiser on the NLL of z / T
    from scipy.optimize import minimize_scalar
    from scipy.special import logsumexp

    z, y = overconfident(600, 6, seed=4)
    zc = canonical(z)

    def nll(t):
        s = zc / t
        return float(np.mean(logsumexp(s, axis=1) - s[np.arange(len(y)), y]))

    t_ref = minimize_scalar(nll, bounds=(0.05, 20), method="bounded", options={"xatol": 1e-10}).x
    assert t_ref > 1.2  # over-confident data: the reference is far from the identity map
    vs = VectorScaling(reg_lambda=1e7, reg_mu=1e7).fit(z, y, progress_bar=False)
    np.testing.assert_allclose(vs.weight.detach().numpy(), 1 / t_ref, rtol=1e-4)
    np.testing.assert_allclose(vs.bias.detach().numpy(), 0.0, atol=1e-5)


@pytest.mark.parametrize("kind", ["float32", "float64", "probabilities"])
def test_starts_at_temperature_scaling_and_reports_what_the_forward_gives(kind):
    """The fit starts at temperature scaling (``w = 1 / T``, where the shrinkage is 0), so it ends at an NLL no higher
    than temperature scaling's; the fit-set report's calibrated logits (numpy, no forward call) give exactly the ECE
    and accuracy of the forward's outputs."""
    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.metrics import ece

    z, y = overconfident(3000, 40, seed=4)
    x = {
        "float32": z,
        "float64": z.astype(np.float64),
        "probabilities": torch.softmax(torch.from_numpy(z).double(), 1).numpy(),
    }[kind]
    ts = TemperatureScaling().fit(x, y, progress_bar=False)
    vs = VectorScaling().fit(x, y, progress_bar=False)
    assert vs.fit_info_["start_temperature"] == pytest.approx(ts.fitted_temperature, rel=1e-9)
    ts_nll = float(torch.nn.functional.cross_entropy(ts(torch.from_numpy(x)).double(), torch.from_numpy(y)))
    assert vs.fit_info_["best_objective"] <= ts_nll + 1e-7  # the objective at the start is temperature scaling's NLL
    assert vs.fit_info_["nll"] < ts_nll - 1e-3  # and per-class weights and biases improve on it here
    out = vs(torch.from_numpy(x)).numpy()
    assert vs.fit_info_["ece_after"] == ece(out, y)
    assert vs.fit_info_["accuracy_after"] == (out.argmax(1) == y).mean()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_reports_compiled_map_is_the_forwards_arithmetic_bit_for_bit(dtype):
    from hf_calibration.calibrators._machinery.fitting.affine import diagonal_map

    rng = np.random.default_rng(0)
    z = (5 * rng.standard_normal((500, 301))).astype(dtype)
    w, b = rng.uniform(0.2, 3.0, 301), rng.standard_normal(301)
    out = np.empty_like(z)
    diagonal_map(z, w.astype(dtype), b.astype(dtype), True, out)
    zt = torch.from_numpy(z)
    expected = (zt - zt.amax(1, keepdim=True)) * torch.from_numpy(w).to(zt.dtype) + torch.from_numpy(b).to(zt.dtype)
    np.testing.assert_array_equal(out, expected.numpy())
    diagonal_map(z, w.astype(dtype), b.astype(dtype), False, out)  # SVS's: the features as they are
    np.testing.assert_array_equal(
        out, (zt * torch.from_numpy(w).to(zt.dtype) + torch.from_numpy(b).to(zt.dtype)).numpy()
    )


def test_passes_of_seconds_take_their_threads_from_the_load_and_fit_the_same(monkeypatch):
    """From LONG_PASS_VALUES logits a pass runs on the threads the load average leaves (``run_pass``) rather than the
    timed choice, whose first passes ran on one thread; the kernels' sums do not depend on it."""
    from hf_calibration.calibrators._machinery.fitting import affine as _affine

    z, y = overconfident(2000, 30, seed=5)
    timed = VectorScaling().fit(z, y, progress_bar=False)
    sizes = []
    run = _affine.run_pass
    monkeypatch.setattr(_affine, "run_pass", lambda kernel, size, *args: sizes.append(size) or run(kernel, size, *args))
    monkeypatch.setattr(_affine, "LONG_PASS_VALUES", z.size)
    by_load = VectorScaling().fit(z, y, progress_bar=False)
    assert sizes and set(sizes) == {z.size}
    torch.testing.assert_close(by_load.weight, timed.weight, rtol=0, atol=0)
    torch.testing.assert_close(by_load.bias, timed.bias, rtol=0, atol=0)
