"""The shared calibrator interface and its edge cases, parametrised over every registered calibrator."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from transformers import EvalPrediction
from transformers.trainer_utils import PredictionOutput

from hf_calibration.calibrators import (
    NotFittedError,
    SMARTCalibrator,
    TemperatureCalibrator,
    TemperatureScaling,
    create_calibrator,
    list_calibrators,
    register_calibrator,
)
from hf_calibration.calibrators._machinery.registry import get_calibrator_class

# fewer steps for speed; 20 fit samples per bin so that per-class histogram binning has bins on 600 samples
# vector scaling unregularised (Guo et al.'s fit): its default shrinkage trades fit-set ECE (0.047 -> 0.054 on these
# 600 samples, short of halving it) for held-out NLL
FAST = {
    "smart": {"max_steps": 300},
    "histogram_binning": {"points_per_bin": 20},
    "vector_scaling": {"reg_lambda": 0.0, "reg_mu": 0.0},
}


# SMS / SVS lower this set's ECE from 0.103 to 0.055 / 0.058, not to half: the authors' probmetrics 1.3 gives the same
# (0.0548 / 0.0584); their smoothing towards the uniform distribution and NLL fit trade a little fit-set ECE away
# Dirichlet calibration's cross-validated NLL on these 600 samples is flat from lambda = 4,500 to 45,000 (equal to 5e-6,
# below the float32 noise of its CV fits), where fit-set ECE is 0.049 or 0.054: either choice is right
ECE_FACTOR = {"sms": 0.6, "svs": 0.6, "dirichlet": 0.55}


def make(name, **kw):
    return create_calibrator(name, **{**FAST.get(name, {}), **kw})


@pytest.fixture(scope="module")
def data():
    return overconfident(600, 10, seed=0)


@pytest.fixture(scope="module", params=list_calibrators("multiclass"))
def fitted(request, data):
    z, y = data
    return make(request.param).fit(z, y, progress_bar=False)


def test_registry():
    from hf_calibration import calibrators

    assert list_calibrators() == sorted(list_calibrators())
    assert {"histogram_binning", "isotonic", "isotonic_ovr", "smart", "spline", "temperature_scaling"} <= set(
        list_calibrators("multiclass")
    )
    parametric = {
        "ets": calibrators.EnsembleTemperatureScaling,
        "vector_scaling": calibrators.VectorScaling,
        "matrix_scaling": calibrators.MatrixScaling,
        "dirichlet": calibrators.DirichletCalibration,
        "pts": calibrators.ParameterizedTemperatureScaling,
        "cts": calibrators.ClassBasedTemperatureScaling,
        "sms": calibrators.StructuredMatrixScaling,
        "svs": calibrators.StructuredVectorScaling,
    }
    for kind, cls in parametric.items():
        assert type(create_calibrator(kind)) is cls and cls.kind == kind
    assert isinstance(create_calibrator("smart"), SMARTCalibrator)
    assert isinstance(create_calibrator("temperature_scaling"), TemperatureScaling)
    with pytest.raises(ValueError, match="name"):
        create_calibrator("no_such_method")
    with pytest.raises(ValueError, match="already registered"):

        @register_calibrator
        class Other(TemperatureScaling):
            kind = "smart"


def test_smart_has_49_trainable_parameters():
    smart = SMARTCalibrator()
    assert sum(p.numel() for p in smart.parameters() if p.requires_grad) == 49
    assert {"margin_mean", "margin_std"} <= set(smart.state_dict())


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_fit_returns_self_and_lowers_ece(name, data):
    from hf_calibration.metrics.ece import ece

    z, y = data
    cal = make(name)
    assert cal.fit(z, y, progress_bar=False) is cal
    assert ece(cal(torch.from_numpy(z)), y) < ECE_FACTOR.get(name, 0.5) * ece(z, y)
    info = cal.fit_info_
    assert info["num_samples"] == 600 and info["num_classes"] == 10 and info["objective"] == cal.default_objective


def test_forward_dtype_device_shape_and_argmax(fitted, data):
    z, _ = data
    z = torch.from_numpy(z)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        zz = z.to(dtype)
        out = fitted(zz)
        assert out.dtype == dtype and out.shape == zz.shape and out.device == zz.device
        assert torch.isfinite(out).all()
        if fitted.preserves_argmax:
            assert torch.equal(out.argmax(1), zz.argmax(1))
    proba = fitted.predict_proba(z)
    assert proba.dtype == torch.float32
    torch.testing.assert_close(proba.sum(1), torch.ones(len(z)), rtol=0, atol=1e-5)
    if isinstance(
        fitted, TemperatureCalibrator
    ):  # calibrated logits are z / T with the reported per-sample temperatures
        temps = fitted.temperature(z.double())
        assert temps.shape == (len(z),) and (temps > 0).all()
        torch.testing.assert_close(fitted(z.double()), z.double() / temps[:, None], rtol=1e-12, atol=0)
    # numpy input works too
    assert torch.equal(fitted(z.numpy()), fitted(z))


def test_accuracy_identical_on_random_logits(fitted):
    if not fitted.preserves_argmax:
        pytest.skip(f"{fitted.kind} may change the argmax by design")
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2000, 10, generator=g) * 4
    assert torch.equal(fitted(z).argmax(1), z.argmax(1))


def test_forward_before_fit_is_a_clear_error():
    for name in list_calibrators():
        cal = create_calibrator(name)
        with pytest.raises(NotFittedError, match="not fitted"):
            cal(torch.randn(3, 4))
        with pytest.raises(ValueError, match="not fitted"):  # a ValueError, as scikit-learn's NotFittedError
            cal.predict_proba(torch.randn(3, 4))
        if isinstance(cal, TemperatureCalibrator):
            with pytest.raises(NotFittedError):
                cal.temperature(torch.randn(3, 4))
        with pytest.raises(NotFittedError):
            cal.save_pretrained("unused")
        with pytest.raises(NotFittedError):
            cal.attach(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_bad_inputs_raise(name, data):
    z, y = data
    cal = make(name)
    bad = z.copy()
    bad[5, 2] = np.nan
    with pytest.raises(ValueError, match="row 5"):
        cal.fit(bad, y)
    bad[5, 2] = np.inf
    with pytest.raises(ValueError, match="finite"):
        cal.fit(bad, y)
    with pytest.raises(ValueError, match="K >= 2"):
        cal.fit(z[:, :1], y * 0)
    wrong = y.copy()
    wrong[3] = 10
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        cal.fit(z, wrong)
    with pytest.raises(ValueError, match="same number of samples"):
        cal.fit(z, y[:-1])
    with pytest.raises(ValueError, match=r"`labels` to hold class indices.*found \d\.5"):  # never truncated
        cal.fit(z, y.astype(np.float32) + 0.5)
    with pytest.raises(ValueError, match="labels"):
        cal.fit(z)
    with pytest.raises(ValueError, match="objective"):
        cal.fit(z, y, objective="ece")
    with pytest.raises(ValueError, match=f"at least {cal.min_samples}"):
        cal.fit(z[: cal.min_samples - 1], y[: cal.min_samples - 1])
    cal.fit(z[: cal.min_samples], y[: cal.min_samples], progress_bar=False)  # the floor itself is fine
    bad = torch.zeros(2, z.shape[1])
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        cal(bad)
    with pytest.raises(ValueError, match="K >= 2"):
        cal(torch.zeros(3, 1))
    with pytest.raises(ValueError, match="rank 2"):
        cal(torch.zeros(3))
    with pytest.raises(TypeError, match="floating"):
        cal(torch.zeros(3, 2, dtype=torch.long))


def test_minimum_samples_documented():
    assert SMARTCalibrator.min_samples == 50 and "50" in SMARTCalibrator.__doc__
    assert TemperatureScaling.min_samples == 10 and "10" in TemperatureScaling.__doc__


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_ignore_index_rows_are_dropped(name, data):
    z, y = data
    y2 = y.copy()
    y2[::7] = -100
    a = make(name).fit(z, y2, progress_bar=False)
    keep = y2 != -100
    b = make(name).fit(z[keep], y[keep], progress_bar=False)
    torch.testing.assert_close(a(torch.from_numpy(z)), b(torch.from_numpy(z)), rtol=0, atol=0)


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_prediction_output_and_eval_prediction(name, data):
    z, y = data
    ref = make(name).fit(torch.from_numpy(z), torch.from_numpy(y), progress_bar=False)(torch.from_numpy(z))
    for wrapped in (
        PredictionOutput(predictions=z, label_ids=y, metrics={}),
        EvalPrediction(predictions=(z, np.zeros((600, 3), np.float32)), label_ids=y),
    ):
        out = make(name).fit(wrapped, progress_bar=False)(torch.from_numpy(z))
        assert torch.equal(out, ref)


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_all_samples_correct(name, caplog):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 200)
    z = (rng.normal(size=(200, 5)) + 6 * np.eye(5)[y]).astype(np.float32)
    assert (z.argmax(1) == y).all()
    with caplog.at_level(logging.WARNING):
        cal = make(name).fit(z, y, progress_bar=False)
    out = cal(torch.from_numpy(z))
    assert torch.isfinite(out).all()
    assert torch.equal(out.argmax(1), torch.from_numpy(z).argmax(1)) or not cal.preserves_argmax
    # nothing is ever wrong, so the calibrated model should be (at least) as confident as before
    assert (
        cal.predict_proba(z).max(1).values.mean() >= torch.softmax(torch.from_numpy(z), 1).max(1).values.mean() - 1e-6
    )
    if name == "temperature_scaling":  # NLL keeps sharpening: T stops at its documented lower bound
        assert cal.fitted_temperature == pytest.approx(0.05)
        assert "bound" in caplog.text


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_tied_top_two_logits(name, data):
    z, y = data
    z = z.copy()
    z[:100, 1] = z[:100].max(1)  # margin exactly 0 on 100 rows
    cal = make(name).fit(z, y, progress_bar=False)
    zt = torch.from_numpy(z)
    out = cal(zt)
    assert torch.isfinite(out).all()
    assert torch.equal(out.argmax(1), zt.argmax(1)) or not cal.preserves_argmax
    if isinstance(cal, TemperatureCalibrator):
        assert (cal.temperature(zt) > 0).all()


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_huge_logits(name, data):
    z, y = data
    z = (z * 1e4 / np.abs(z).max()).astype(np.float32)  # |z| up to 1e4
    cal = make(name).fit(z, y, progress_bar=False)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        zt = torch.from_numpy(z).to(dtype)
        out = cal(zt)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert not torch.isnan(cal.predict_proba(zt)).any()
        assert torch.equal(out.argmax(1), zt.argmax(1)) or not cal.preserves_argmax


def test_fp16_overflow_is_shifted_not_inf():
    z, y = overconfident(200, 4, seed=3)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(np.log(0.05))  # T = 0.05: 6e4 / 0.05 overflows fp16
    zt = torch.tensor([[60000.0, 59000.0, 0.0, -60000.0]], dtype=torch.float16)
    out = ts(zt)
    assert torch.isfinite(out).all() and out.argmax(1).item() == 0
    # the shift keeps the softmax: the top two differ by (60000 - 59008) / 0.05 in fp16 terms -> p_top ~ 1
    assert ts.predict_proba(zt)[0, 0] == pytest.approx(1.0)


def test_argmax_guard_when_rounding_merges_the_top_two():
    z, y = overconfident(200, 4, seed=3)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(np.log(2.5))
    # two fp16 logits one ulp apart that divide by 2.5 into the same fp16 value; the winner second
    a = next(v for v in range(1400, 2000) if torch.tensor(v / 2.5).half() == torch.tensor((v + 1) / 2.5).half())
    zt = torch.tensor([[a, a + 1, 0.0]], dtype=torch.float16)
    naive = (zt.float() / 2.5).half()
    assert naive[0, 0] == naive[0, 1] and naive.argmax(1).item() == 0  # plain division moves the argmax
    assert ts(zt).argmax(1).item() == 1


def test_smart_is_deterministic_given_seed(data):
    z, y = data
    a = SMARTCalibrator(seed=7, max_steps=200).fit(z, y, progress_bar=False)
    b = SMARTCalibrator(seed=7, max_steps=200).fit(z, y, progress_bar=False)
    c = SMARTCalibrator(seed=8, max_steps=200).fit(z, y, progress_bar=False)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.hidden.weight, c.hidden.weight)


def test_smart_margin_buffers_are_the_fit_statistics(data):
    z, y = data
    smart = SMARTCalibrator(max_steps=5).fit(z, y, progress_bar=False)
    top2 = np.sort(z, axis=1)[:, -2:].astype(np.float64)
    margin = top2[:, 1] - top2[:, 0]
    assert smart.margin_mean.item() == pytest.approx(margin.mean(), rel=1e-12)
    assert smart.margin_std.item() == pytest.approx(margin.std(ddof=0), rel=1e-12)


def test_early_stopping_restores_the_best_not_the_last(data):
    from hf_calibration.calibrators.objectives import charbonnier_soft_ece

    z, y = data
    # too large a step: the objective oscillates, so the last weights are not the best ones
    smart = SMARTCalibrator(lr=1.0, max_steps=60, patience=1000, seed=1).fit(z, y, progress_bar=False)
    history = np.array(smart.history_)
    assert len(history) == 61  # 60 updates and the final weights evaluated
    best = history.min()
    assert history[-1] > best * 1.05, "the scenario must end away from its best step"
    assert smart.fit_info_["best_step"] == int(history.argmin()) < 60
    # the restored weights score the best objective (exact softmax, independent of the fit's table)
    zt = torch.from_numpy(z).double()
    restored = charbonnier_soft_ece(zt / smart.temperature(zt)[:, None], torch.from_numpy(y)).item()
    assert restored == pytest.approx(best, rel=1e-3)


def test_early_stopping_stops_on_a_plateau(data):
    z, y = data
    smart = SMARTCalibrator(patience=5, max_steps=2000).fit(z, y, objective="nll", progress_bar=False)
    info = smart.fit_info_
    assert info["steps"] < 2000 and info["steps"] - info["best_step"] == 5


@pytest.mark.parametrize(
    "kwargs, match",
    [({"hidden_size": 0}, "hidden_size"), ({"lr": -1.0}, "lr"), ({"eps": 0.0}, "eps"), ({"seed": 1.5}, "seed")],
)
def test_smart_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SMARTCalibrator(**kwargs)


@pytest.mark.parametrize(
    "kind, argument",
    [("histogram_binning", "per_class"), ("platt", "smooth_targets"), ("sigmoid_temperature_scaling", "per_label")],
)
@pytest.mark.parametrize("value", [1, "yes", None])
def test_flags_refuse_what_is_not_a_bool(kind, argument, value):
    """A truthy 1 or "yes" is not taken for True: the flag names itself in a TypeError."""
    with pytest.raises(TypeError, match=f"Expected argument `{argument}` to be a bool, but got {value!r}"):
        create_calibrator(kind, **{argument: value})


def test_auto_calibrator_race_refuses_what_is_not_a_bool():
    from hf_calibration.calibrators import AutoCalibrator

    with pytest.raises(TypeError, match="Expected argument `race` to be a bool, but got 1"):
        AutoCalibrator(race=1)


def test_fit_argument_types(data):
    z, y = data
    with pytest.raises(TypeError, match="progress_bar"):
        TemperatureScaling().fit(z, y, progress_bar="yes")
    with pytest.raises(TypeError, match="Unexpected"):
        TemperatureScaling().fit(z, y, bins=3)


@pytest.mark.parametrize("threads", [1, 2])
def test_fit_leaves_torch_thread_count_alone(threads):
    # numba's parallel OpenMP kernels reset the process-wide thread count; a fit must restore it
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rng = np.random.default_rng(0)
        y = rng.integers(0, 10, 300)
        z = (3 * (rng.normal(size=(300, 10)) + 2 * np.eye(10)[y])).astype(np.float32)
        SMARTCalibrator(max_steps=5).fit(z, y, progress_bar=False)
        TemperatureScaling().fit(z, y, progress_bar=False)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(old)


def test_smart_on_saturated_logits_falls_back_to_temperature_scaling(caplog):
    """Logits x 1e4 saturate the softmax: SMART's objective is flat, Adam never moves. It used to return the untrained
    MLP (best_step 0, T < 1: sharper still); now it warns and uses the NLL temperature, as TS would."""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    from hf_calibration.calibrators.temperature import T_MAX, T_MIN

    z, y = overconfident(1000, 10, seed=1)
    z = z * np.float32(1e4)
    with caplog.at_level(logging.WARNING):
        smart = SMARTCalibrator().fit(z, y, progress_bar=False)
    assert "flat" in caplog.text and "temperature scaling" in caplog.text
    assert smart.fit_info_["fallback"] == "temperature_scaling" and smart.fit_info_["best_step"] == 0
    # classes whose every fit confidence is 1 in float32, before and still at T = 100: they are named, and why
    before = torch.softmax(torch.from_numpy(z).double(), 1).max(1).values.numpy()
    after = smart.predict_proba(torch.from_numpy(z)).double().max(1).values.numpy()
    top = z.argmax(1)
    saturated = [
        int(k)
        for k in np.unique(top)
        if (np.abs(after - before)[top == k] < 1e-5).all() and (before[top == k] > 1 - 1e-5).all()
    ]
    assert saturated and smart.fit_info_["uncalibrated"]["classes"] == saturated
    assert "saturated softmax" in smart.fit_info_["uncalibrated"]["reason"]
    # independent: the NLL-optimal constant temperature (scipy, float64), in TS's range [0.05, 100]
    z64 = z.astype(np.float64)
    nll = lambda log_t: -log_softmax(z64 / np.exp(log_t), axis=1)[np.arange(len(y)), y].mean()  # noqa: E731
    t_ref = float(
        np.exp(minimize_scalar(nll, bounds=(np.log(T_MIN), np.log(T_MAX)), method="bounded", options={"xatol": 1e-9}).x)
    )
    temps = smart.temperature(z)
    assert torch.equal(temps, temps[:1].expand_as(temps))  # one temperature for every margin
    assert float(temps[0]) == pytest.approx(t_ref, rel=1e-4) and float(temps[0]) > 1
    assert smart.fit_info_["temperature"] == pytest.approx(float(temps[0]), rel=1e-12)


@pytest.mark.parametrize("seed, scale", [(0, 1e3), (0, 1e4), (3, 1e3), (3, 1e4)])
def test_smart_that_barely_moves_on_saturated_logits_falls_back_too(seed, scale, caplog):
    """Adam's normalised steps move the MLP even on a flat objective, and a few rows near a tie lowered it by
    0.01-0.05 %: best_step > 0, so the fallback was skipped and the near-untrained MLP (NLL 30-60x temperature
    scaling's) came back without a warning."""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    from hf_calibration.calibrators.temperature import T_MAX, T_MIN

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, 1000)
    z = (rng.normal(size=(1000, 10)) + 2 * np.eye(10)[y]) * scale
    with caplog.at_level(logging.WARNING):
        smart = SMARTCalibrator().fit(z, y, progress_bar=False)
    history = np.array(smart.history_)
    assert 0 < history[0] - history.min() < 1e-3 * history[0]  # it did move, by a hair
    assert "flat" in caplog.text and smart.fit_info_["fallback"] == "temperature_scaling"
    nll = lambda log_t: -log_softmax(z / np.exp(log_t), axis=1)[np.arange(len(y)), y].mean()  # noqa: E731
    t_ref = float(
        np.exp(minimize_scalar(nll, bounds=(np.log(T_MIN), np.log(T_MAX)), method="bounded", options={"xatol": 1e-9}).x)
    )
    temps = smart.temperature(z)
    assert torch.equal(temps, temps[:1].expand_as(temps))
    assert float(temps[0]) == pytest.approx(t_ref, rel=1e-4)


def test_smart_on_separable_logits_falls_back_without_crashing(caplog):
    """Issue 29 item 7: logits with the true class 50 above the rest make the objective exactly 0 from the start, and
    the fallback's own warning divided by it (ZeroDivisionError at smart.py:232), which compare_calibrators and
    AutoCalibrator showed as fold failures."""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    from hf_calibration.calibrators import compare_calibrators
    from hf_calibration.calibrators.temperature import T_MAX, T_MIN

    z, y = overconfident(300, 5, seed=2)
    z = z.astype(np.float64)
    z[np.arange(300), y] += 50
    with caplog.at_level(logging.WARNING):
        smart = SMARTCalibrator().fit(z, y, progress_bar=False)
    assert smart.history_[0] == 0.0 and smart.fit_info_["fallback"] == "temperature_scaling"
    assert "by nothing: it is 0 from the start" in caplog.text
    nll = lambda log_t: -log_softmax(z / np.exp(log_t), axis=1)[np.arange(len(y)), y].mean()  # noqa: E731
    t_ref = float(
        np.exp(minimize_scalar(nll, bounds=(np.log(T_MIN), np.log(T_MAX)), method="bounded", options={"xatol": 1e-9}).x)
    )
    # the objective is flat: any T <= 1 is optimal to rounding (NLL ~ e^-50); the fallback's is as good as scipy's
    assert (
        nll(np.log(smart.fit_info_["temperature"])) == pytest.approx(nll(np.log(t_ref)), abs=1e-12)
        and nll(np.log(t_ref)) < 1e-12
    )
    table = compare_calibrators(z, y, ["smart"], race=False, progress_bar=False)
    assert table["smart"].errors == [] and len(table["smart"].fold_ids) == 5


def test_smart_on_learnable_logits_does_not_fall_back(data, caplog):
    z, y = data
    with caplog.at_level(logging.WARNING):
        smart = SMARTCalibrator(max_steps=300).fit(z, y, progress_bar=False)
    assert "fallback" not in smart.fit_info_ and smart.fit_info_["best_step"] > 0 and "flat" not in caplog.text


@pytest.mark.parametrize(
    "name",
    [n for n in list_calibrators("multiclass") if "seed" in inspect.signature(get_calibrator_class(n)).parameters],
)
def test_seeds_are_one_range_for_every_seeded_calibrator(name):
    # issue 23 item 12: SMART took seed=-1 (torch maps it to 2**64 - 1) where PTS refused it
    cls = get_calibrator_class(name)
    for seed in (0, 2**64 - 1):
        assert cls(seed=seed).seed == seed
    for seed in (-1, -(2**63)):
        with pytest.raises(ValueError, match=r"argument `seed` to be an integer >= 0"):
            cls(seed=seed)
    for seed in (2**64, 2**70):
        with pytest.raises(ValueError, match=r"argument `seed` to be an integer in \[0, 2\*\*64 - 1\]"):
            cls(seed=seed)


@pytest.mark.parametrize(
    "name", [n for n in list_calibrators("multiclass") if "soft_ece" in get_calibrator_class(n).objectives]
)
@pytest.mark.parametrize("sigma", [1e-300, 1e-160, 1e200, 0.0, -1.0])
def test_soft_bin_width_out_of_range_is_a_clear_error(name, data, sigma):
    z, y = data
    with pytest.raises(ValueError, match="argument `sigma`"):
        make(name).fit(z, y, objective="soft_ece", sigma=sigma, progress_bar=False)


def test_zero_margin_std_is_a_clear_error(data):
    z, y = data
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    with torch.no_grad():
        smart.margin_std.fill_(0.0)  # division by zero in the compiled kernel: a SystemError from numba's dispatcher
    for call in (smart, smart.temperature, smart.predict_proba):
        with pytest.raises(ValueError, match="margin_std"):
            call(torch.from_numpy(z))


def test_a_different_class_count_warns_once(data, caplog):
    z, y = data
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    other = torch.from_numpy(np.concatenate([z, z[:, :2]], axis=1))  # K = 12
    with caplog.at_level(logging.WARNING):
        ts(other)
        ts.temperature(other)
        ts.predict_proba(other)
    assert caplog.text.count("fitted on K = 10") == 1
    # the map itself is still z / T
    torch.testing.assert_close(ts(other.double()), other.double() / ts.fitted_temperature, rtol=1e-12, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_forward_refuses_non_finite_rows_whatever_the_map(fitted, data, bad, dtype):
    # every map, not only those that carry a NaN to their output: a binning of the confidence put a NaN row in a bin
    z = torch.from_numpy(data[0][:50].copy()).to(dtype)
    z[7, 2] = bad
    with pytest.raises(ValueError, match=r"`logits` to be finite, but row 7"):
        fitted(z)


def _uniform_logits(n: int = 200, k: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits equal within every row (a per-row offset only): every prediction is the uniform distribution."""
    rng = np.random.default_rng(seed)
    return np.repeat(rng.normal(size=(n, 1)), k, axis=1).astype(np.float32), rng.integers(0, k, n)


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_a_fit_that_ends_as_the_identity_warns_and_says_why(name):
    """On uniform predictions the temperature family can only return them unchanged: each says so, once, with the
    reason in ``fit_info_``; every other calibrator changes them and stays silent. Whether they changed is measured
    here, on float64 probabilities."""
    import warnings

    from hf_calibration.calibrators import UncalibratedWarning

    z, y = _uniform_logits()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cal = create_calibrator(name).fit(z, y, progress_bar=False)
    raised = [w for w in caught if issubclass(w.category, UncalibratedWarning)]
    moved = np.abs(cal.predict_proba(torch.from_numpy(z).double()).numpy() - 1 / 5).max()
    if moved < 1e-12:
        assert len(raised) == 1 and type(cal).__name__ in str(raised[0].message), [str(w.message) for w in raised]
        assert "every prediction uncalibrated" in str(raised[0].message)
        assert cal.fit_info_["uncalibrated"]["classes"] == "all" and cal.fit_info_["uncalibrated"]["reason"]
    else:
        assert not raised and "uncalibrated" not in cal.fit_info_
    expected_identity = {"temperature_scaling", "ets", "pts", "cts", "smart"}
    assert (moved < 1e-12) == (name in expected_identity), moved


@pytest.mark.parametrize("name", list_calibrators("multiclass"))
def test_no_identity_warning_on_a_model_that_needs_calibrating(name, data):
    import warnings

    from hf_calibration.calibrators import UncalibratedWarning

    z, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncalibratedWarning)
        cal = make(name).fit(z, y, progress_bar=False)
    assert "uncalibrated" not in cal.fit_info_


def test_identity_on_some_classes_names_them():
    """A map that recalibrates the predictions of class 0 only: the warning names the other classes."""
    import warnings

    from hf_calibration.calibrators import UncalibratedWarning
    from hf_calibration.calibrators._machinery.toplabel import TopLabelCalibrator

    class OnlyClassZero(TopLabelCalibrator):
        kind = "only_class_zero_test"
        default_objective = "halve_class_zero"

        def _fit_confidence(self, confidence, correct, top, num_classes):
            return {}

        def _map_confidence(self, confidence, top):
            return np.where(top == 0, confidence / 2, confidence)

    z, y = overconfident(300, 5, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cal = OnlyClassZero().fit(z, y, progress_bar=False)
    raised = [str(w.message) for w in caught if issubclass(w.category, UncalibratedWarning)]
    assert raised == [
        "OnlyClassZero leaves the predictions of 4 of the 5 predicted classes (1, 2, 3, 4) uncalibrated (as the "
        "model gave them): " + cal.fit_info_["uncalibrated"]["reason"] + "."
    ]
    assert cal.fit_info_["uncalibrated"]["classes"] == [1, 2, 3, 4]
