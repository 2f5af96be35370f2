"""The fused CPU apply kernels (``calibrators._apply``) against the torch path and plain formulas."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from _calibrator_data import overconfident

from hf_calibration.calibrators import SMARTCalibrator, TemperatureScaling
from hf_calibration.calibrators._machinery.forward import apply as _apply
from hf_calibration.calibrators.smart import logit_margin

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)


@pytest.fixture(scope="module")
def fitted():
    z, y = overconfident(800, 10, seed=1)
    return {
        "ts": TemperatureScaling().fit(z, y, progress_bar=False),
        "smart": SMARTCalibrator(max_steps=200).fit(z, y, progress_bar=False),
    }


def _torch_path(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setattr(_apply, "supports", lambda z: False)
        return fn(*args)


def _reference(cal, z: torch.Tensor) -> torch.Tensor:
    """``z / T`` with T from the plain torch formulas (topk margin, the MLP as nn.Linear layers)."""
    if isinstance(cal, TemperatureScaling):
        return z / torch.tensor(cal.fitted_temperature, dtype=torch.float64).to(z.dtype)
    m_hat = ((logit_margin(z) - cal.margin_mean) / cal.margin_std)[:, None]
    with torch.no_grad():
        t = torch.nn.functional.softplus(cal.output(torch.relu(cal.hidden(m_hat)))) + cal.eps
    return z / t.to(z.dtype)


@pytest.mark.parametrize("name", ["ts", "smart"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_path_matches_torch_path_and_plain_formula(fitted, monkeypatch, name, dtype):
    cal = fitted[name]
    z = torch.from_numpy(overconfident(3000, 10, seed=2)[0]).to(dtype)
    z[:50, 3] = z[:50].amax(1)  # tied top-two logits: margin 0
    fast = cal(z)
    slow = _torch_path(monkeypatch, cal, z)
    assert fast.dtype == dtype and torch.equal(fast.argmax(1), z.argmax(1))
    rtol = 1e-12 if dtype == torch.float64 else 2e-7
    torch.testing.assert_close(fast, slow, rtol=rtol, atol=0)
    torch.testing.assert_close(fast, _reference(cal, z), rtol=rtol, atol=0)
    if name == "ts":  # one temperature: the same correctly rounded divisions
        assert torch.equal(fast, slow)
    torch.testing.assert_close(cal.temperature(z), _torch_path(monkeypatch, cal.temperature, z), rtol=rtol, atol=0)


@pytest.mark.parametrize("name", ["ts", "smart"])
def test_forward_is_z_over_its_own_temperature_and_batch_independent(fitted, name):
    cal = fitted[name]
    z = torch.from_numpy(overconfident(1000, 7, seed=3)[0])
    out = cal(z)
    assert torch.equal(out, z / cal.temperature(z)[:, None])  # no rounding tie in these logits: no guard bump
    parts = torch.cat([cal(z[i : i + 97]) for i in range(0, 1000, 97)])
    assert torch.equal(out, parts)  # a row's output does not depend on the rows it comes with


@pytest.mark.parametrize("name", ["ts", "smart"])
def test_non_contiguous_input(fitted, name):
    cal = fitted[name]
    z = torch.from_numpy(overconfident(300, 10, seed=4)[0])
    zt = z.T.contiguous().T
    assert not zt.is_contiguous()
    assert torch.equal(cal(zt), cal(z))


def test_argmax_guard_in_float32():
    z, y = overconfident(200, 4, seed=3)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(np.log(2.5))
    t = torch.tensor(2.5, dtype=torch.float32)
    a = torch.tensor(1000.0, dtype=torch.float32)
    while torch.nextafter(a, torch.tensor(np.inf)) / t != a / t:  # two adjacent floats that divide to one
        a = torch.nextafter(a, torch.tensor(np.inf))
    b = torch.nextafter(a, torch.tensor(np.inf))
    zt = torch.stack([a, b, torch.tensor(0.0)])[None].repeat(5, 1)
    assert (zt / t).argmax(1).eq(0).all()  # the plain division moves the argmax
    out = ts(zt)
    assert out.argmax(1).eq(1).all()
    assert torch.equal(out[:, 1], torch.nextafter(out[:, 0], torch.tensor(np.inf)))  # raised by exactly one ulp


def test_signed_zeros_follow_torch_argmax():
    z, y = overconfident(200, 4, seed=3)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(np.log(2.0))
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    # row 0: -0.0 and +0.0 tie for the maximum (torch.argmax: the first); row 1: tiny/2 rounds both to zeros of
    # opposite signs, so the division would move the argmax from 1 to 0
    zt = torch.tensor([[-0.0, 0.0, -1.0], [-tiny, tiny, -5.0]], dtype=torch.float32)
    out = ts(zt)
    assert torch.equal(out.argmax(1), zt.argmax(1)) and zt.argmax(1).tolist() == [0, 1]
    assert out[1, 1].item() == tiny and out[1, 0].item() == 0.0


def test_overflow_rows_are_rescaled_not_inf():
    z, y = overconfident(200, 4, seed=3)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(np.log(0.05))  # 3e38 / 0.05 overflows float32
    zt = torch.tensor([[3e38, 2.9e38, 0.0, -3e38], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float32)
    out = ts(zt)
    assert torch.isfinite(out).all()
    assert torch.equal(out.argmax(1), zt.argmax(1))
    assert torch.equal(out[1], zt[1] / ts.temperature(zt)[1])  # the other rows are divided as usual


def test_non_finite_rows_raise_with_their_index(fitted):
    z = torch.from_numpy(overconfident(100, 10, seed=5)[0])
    for value in (float("nan"), float("inf"), -float("inf")):
        bad = z.clone()
        bad[37, 4] = value
        for cal in fitted.values():
            with pytest.raises(ValueError, match="row 37"):
                cal(bad)


def test_finite_values_whose_sum_overflows_are_accepted(fitted):
    z = torch.full((3, 4), 3e38, dtype=torch.float32)  # row sums overflow float32; every value is finite
    z[:, 0] = 3.2e38
    out = fitted["ts"](z)
    assert torch.isfinite(out).all() and out.argmax(1).eq(0).all()


def test_inputs_needing_grad_take_the_autograd_path(fitted):
    z = torch.from_numpy(overconfident(50, 10, seed=6)[0]).requires_grad_()
    out = fitted["smart"](z)
    assert out.requires_grad
    out.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_threads_do_not_change_results_or_torch_settings(fitted):
    z, y = overconfident(700, 10, seed=7)
    torch_threads = torch.get_num_threads()
    default = numba.get_num_threads()
    outs, fits = [], []
    try:
        for threads in sorted({1, default}):
            numba.set_num_threads(threads)
            fits.append(SMARTCalibrator(max_steps=100).fit(z, y, progress_bar=False).state_dict())
            outs.append(fitted["smart"](torch.from_numpy(z)))
    finally:
        numba.set_num_threads(default)
    assert torch.get_num_threads() == torch_threads
    assert all(torch.equal(outs[0], o) for o in outs)
    assert all(torch.equal(fits[0][k], f[k]) for f in fits for k in f)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

_LOGITS = st.integers(1, 6).flatmap(
    lambda n: st.integers(2, 9).flatmap(
        lambda k: st.sampled_from([np.float32, np.float64]).flatmap(
            lambda dt: arrays(dt, (n, k), elements=st.floats(allow_nan=False, allow_infinity=False, width=32))
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(z=_LOGITS, log_t=st.floats(np.log(0.05), np.log(50.0)))
def test_fast_path_keeps_argmax_finite_and_agrees_with_torch(z, log_t):
    ts = TemperatureScaling()
    ts.fit(*overconfident(60, 3, seed=0), progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(log_t)
    zt = torch.from_numpy(z)
    out = ts(zt)
    assert torch.isfinite(out).all()
    assert torch.equal(out.argmax(1), zt.argmax(1))
    orig = _apply.supports
    _apply.supports = lambda t: False
    try:
        slow = ts(zt)
    finally:
        _apply.supports = orig
    assert torch.equal(out, slow)  # one temperature: the same divisions, guard and rescaling as the torch path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scale_twin_is_the_kernel_bit_for_bit(dtype):
    """``_core.numpy_twin``: a fixed temperature's rows divided in torch until the kernel's compile pays, to the same
    bits: the correctly rounded division and the argmax guard (ties merged by rounding, signed zeros), and None for the
    rows the kernel sends back (non-finite input, overflow)."""
    rng = np.random.default_rng(3)
    tiny = 1e-39 if dtype == torch.float32 else 1e-300
    for n, k in ((2000, 100), (50, 6)):
        z = torch.from_numpy(3 * rng.normal(size=(n, k))).to(dtype)
        z[0, :3] = z[0].max()
        z[1, :] = -1.0
        z[1, 2], z[1, 5] = tiny, tiny * 1.5  # both round to the same value (or 0) divided by a large T
        z[2, :] = 0.0
        z[2, 4] = -0.0
        for t in (1.7, 0.3, 3.0000001, 1e30, 1e-30):
            kernel = _apply.scale_rows(z, temperature=t)
            twin = _apply._twin_scale(z, t, None)
            assert (kernel is None) == (twin is None)
            if kernel is not None:
                assert torch.equal(kernel.view(torch.uint8), twin.view(torch.uint8))
    z[3, 1] = float("nan")
    assert _apply._twin_scale(z, 2.0, None) is None and _apply.scale_rows(z, temperature=2.0) is None


def test_smart_forward_twin_is_the_kernel_for_float32(fitted):
    """SMART's float32 forward before the kernel's compile pays: its temperatures (float64, then float32) and the
    division give the kernel's bits (a float64 ulp apart on the two sides can round apart: one row in ~1e9)."""
    smart = fitted["smart"]
    rng = np.random.default_rng(11)
    z = torch.from_numpy(4 * rng.normal(size=(20_000, 10))).float()
    z[0, :3] = z[0].max()
    kernel = _apply.scale_rows(z, smart_mlp=smart._mlp_arrays())
    twin = smart._forward_twin(z, None)
    assert torch.equal(kernel.view(torch.int32), twin.view(torch.int32))
    z[5, 2] = float("inf")
    assert smart._forward_twin(z, None) is None and _apply.scale_rows(z, smart_mlp=smart._mlp_arrays()) is None
