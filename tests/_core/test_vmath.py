"""The vectorisable exp/log against numpy's (libm's) correctly rounded-to-an-ulp values; the four-lane row reductions."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration._core.vmath import exp_into, log_into, max_of, sum_of

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)


def _exp(x):
    out, bits = np.empty_like(x), np.empty_like(x)
    exp_into(x, out, bits)
    return out


def _log(x):
    out, bits = np.empty_like(x), np.empty_like(x)
    log_into(x, out, bits)
    return out


def test_exp_matches_numpy_over_its_range():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-708, 709, 20_000), rng.uniform(-1, 1, 20_000), np.arange(-700.0, 700.0, 0.5)])
    x = np.concatenate([x, [0.0, -0.0, 1e-300, -1e-300, np.log(2) / 2, -np.log(2) / 2, -708.0, 709.0]])
    np.testing.assert_allclose(_exp(x), np.exp(x), rtol=4e-16, atol=0)
    assert _exp(np.array([0.0]))[0] == 1.0


def test_exp_clamps_instead_of_returning_subnormals_or_inf_and_keeps_nan():
    out = _exp(np.array([-1000.0, -np.inf, 710.0, np.inf, np.nan]))
    np.testing.assert_allclose(out[:4], np.exp([-708.0, -708.0, 709.0, 709.0]), rtol=4e-16)
    assert np.isnan(out[4])


def test_log_matches_numpy_over_positive_normals():
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [10.0 ** rng.uniform(-307, 308, 20_000), rng.uniform(0.5, 2.0, 20_000), 1 + rng.normal(scale=1e-9, size=1000)]
    )
    x = np.concatenate(
        [x, [1.0, 2.0, 0.5, np.sqrt(0.5), np.sqrt(2.0), 2.2250738585072014e-308, 1.7976931348623157e308]]
    )
    expected = np.log(x)
    np.testing.assert_allclose(_log(x), expected, rtol=4e-16, atol=3e-16)
    assert _log(np.array([1.0]))[0] == 0.0


@pytest.mark.parametrize(
    "fn, ref, x", [(exp_into, np.exp, np.linspace(-30, 5, 777)), (log_into, np.log, np.linspace(0.01, 50, 777))]
)
def test_in_place_and_sliced_calls_agree_with_separate_buffers(fn, ref, x):
    separate = np.empty_like(x)
    fn(x, separate, np.empty_like(x))
    in_place = x.copy()
    fn(in_place, in_place, np.empty_like(x))  # allowed (only slower): the same values
    np.testing.assert_array_equal(in_place, separate)
    work = np.empty((3, 1000))
    work[0, 100:877] = x
    fn(work[0, 100:877], work[1, 100:877], work[2, 100:877])
    np.testing.assert_array_equal(work[1, 100:877], separate)
    np.testing.assert_allclose(separate, ref(x), rtol=4e-16, atol=3e-16)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 101])
def test_row_reductions_are_max_and_the_four_lane_sum(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n) * 10.0 ** rng.integers(-3, 4, n)  # mixed magnitudes, the max anywhere
    assert max_of(x) == x.max()
    lanes = [sum(x[j] for j in range(lane, n - n % 4, 4)) for lane in range(4)]  # the stated order, written out
    for j in range(n - n % 4, n):
        lanes[0] += x[j]
    assert sum_of(x) == (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
    assert sum_of(x) == pytest.approx(np.sum(x), rel=1e-14)


def test_float32_exp_matches_numpy_to_float32_rounding():
    from hf_calibration._core.vmath import exp_into_f32

    rng = np.random.default_rng(2)
    x = np.concatenate([rng.uniform(-87, 88, 20_000), rng.uniform(-1, 1, 20_000), [0.0, -87.0, 88.0]]).astype(
        np.float32
    )
    out, bits = np.empty_like(x), np.empty_like(x)
    exp_into_f32(x, out, bits)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)), rtol=3e-7, atol=0)
    out2 = np.empty(3, np.float32)
    exp_into_f32(np.array([-1000.0, 1000.0, np.nan], np.float32), out2, np.empty(3, np.float32))  # clamped, NaN kept
    np.testing.assert_allclose(out2[:2], np.exp([-87.0, 88.0]), rtol=3e-7)
    assert np.isnan(out2[2])
