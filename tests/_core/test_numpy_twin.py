"""``_core.numpy_twin``: the rent-or-buy rule between a compiled kernel and its numpy twin, and the core twins (the
float32 / float64 ``exp``, the top-label pass, the row counts, finiteness, the bin rule) against their kernels, bit for
bit. A fresh process with an empty kernel cache computes ECE, a TS fit and a conformal fit without compiling, to the
same bits as the kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from hf_calibration._core import bins, finite, numpy_twin, row_kinds, rowpass, vmath
from hf_calibration._core.parallel import serial_twin

pytestmark = pytest.mark.kernels

RNG = np.random.default_rng(20261129)


def _logits(n, k, dtype, scale=3.0):
    return (scale * RNG.normal(size=(n, k))).astype(dtype)


def _softmax(z):
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


@pytest.fixture(autouse=True)
def _budgets(monkeypatch):
    """Twins built here get their budgets (the test session runs the kernels from the first call: conftest.py)."""
    monkeypatch.setattr(numpy_twin, "BUDGET_SCALE", 1.0)


# ------------------------------------------------------------------------------------------------ the rule
@numba.njit
def _uncached(x):  # pragma: no cover - compiled
    return x + 1


def test_twin_until_its_calls_have_cost_the_compile():
    twin = numpy_twin.NumpyTwin(_uncached, compile_seconds=1.0, seconds_per_value=1e-3)
    assert twin.use(100)  # 0.1 s estimated, nothing spent
    assert not twin.use(2000)  # 2 s estimated: more than the compile, which happens now
    assert not twin.use(1)  # and from then on the kernel


def test_spent_time_counts():
    twin = numpy_twin.NumpyTwin(_uncached, compile_seconds=0.05, seconds_per_value=0.0)
    assert twin.use(1)
    assert twin.run(lambda: __import__("time").sleep(0.06) or 7) == 7
    assert twin.spent >= 0.06
    assert not twin.use(1)


def test_a_compiled_kernel_is_used():
    @numba.njit
    def compiled(x):  # pragma: no cover - compiled
        return x * 2

    compiled(1.0)
    assert numpy_twin.cached_for_this_machine(compiled)
    assert not numpy_twin.NumpyTwin(compiled, compile_seconds=10.0, seconds_per_value=0.0).use(1)


def test_zero_budget_is_the_kernel_at_once(monkeypatch):
    monkeypatch.setattr(numpy_twin, "BUDGET_SCALE", 0.0)
    assert not numpy_twin.NumpyTwin(_uncached, compile_seconds=10.0, seconds_per_value=0.0).use(0)


def test_the_on_disk_cache_is_read(tmp_path):
    """A kernel compiled by an earlier process (numba's cache on disk) is loaded, not replaced by its twin."""
    module = tmp_path / "twin_probe.py"
    module.write_text("import numba\n@numba.njit(cache=True)\ndef probe(x):\n    return x + 1\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from twin_probe import probe\n"
        "from hf_calibration._core.numpy_twin import cached_for_this_machine\n"
        "before = cached_for_this_machine(probe); probe(1.0); print(before, cached_for_this_machine(probe))\n"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["False", "True"]
    assert second.stdout.split() == ["True", "True"]


# ------------------------------------------------------------------------------------------------ exp
def test_float32_exp_twin_is_the_kernel_bit_for_bit():
    x = np.concatenate(
        [(40 * RNG.normal(size=200_000)).astype(np.float32), np.float32([-1e4, -87.5, -87, -0.0, 0, 88, 88.5, 1e4])]
    )
    out, bits = np.empty_like(x), np.empty_like(x)
    vmath.exp_into_f32(x, out, bits)
    assert np.array_equal(out.view(np.int32), vmath.exp_f32_numpy(x).view(np.int32))
    nan = np.float32([np.nan])
    vmath.exp_into_f32(nan, out[:1], bits[:1])
    assert np.isnan(out[0]) and np.isnan(vmath.exp_f32_numpy(nan)[0])


def test_float64_exp_twin_is_the_kernel_bit_for_bit():
    x = np.concatenate([300 * RNG.normal(size=200_000), [-1e5, -708.5, -708, -0.0, 0, 709, 709.5, 1e5]])
    out, bits = np.empty_like(x), np.empty_like(x)
    vmath.exp_into_exact(x, out, bits)
    assert np.array_equal(out.view(np.int64), vmath.exp_numpy(x).view(np.int64))
    inside = np.abs(x) < 700
    np.testing.assert_allclose(out[inside], np.exp(x[inside]), rtol=4e-16)  # and it is exp: a few ulp at most


# ------------------------------------------------------------------------------------------------ top-label pass
def _both_passes(x, target, from_logits, n_bins=15, offset=0, sums=None, parallel=None):
    n = x.shape[0]
    parallel = x.size >= rowpass.PARALLEL_MIN_ELEMENTS if parallel is None else parallel
    results = []
    for one_pass in (rowpass._pass, rowpass._twin_pass):
        conf, pred = np.zeros(offset + n), np.zeros(offset + n, np.int64)
        s = np.zeros((3, n_bins)) if sums is None else sums.copy()
        bad = one_pass(x, offset, target, from_logits, bins.uniform_edges(n_bins), conf, pred, s, parallel)
        results.append((tuple(map(int, bad)), conf, pred, s))
    return results


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (500, 37), (4000, 100), (700, 1000), (60_000, 10)])
@pytest.mark.parametrize("from_logits", [True, False])
def test_top_label_twin_is_the_kernel_bit_for_bit(dtype, shape, from_logits):
    n, k = shape
    z = _logits(n, k, dtype)
    z[0, : min(k, 3)] = z[0].max()  # a tie for the argmax
    x = z if from_logits else _softmax(z.astype(np.float64)).astype(dtype)
    target = RNG.integers(0, k, n)
    kernel, twin = _both_passes(np.ascontiguousarray(x), target, from_logits)
    assert kernel[0] == twin[0] == (-1, rowpass.OK)
    for a, b in zip(kernel[1:], twin[1:]):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("parallel", [False, True])
def test_top_label_twin_continues_the_sums_as_the_kernel(parallel):
    """A block after the first (an input converted a block at a time) adds to the sums so far, in the same order."""
    x = _logits(3000, 50, np.float32)
    target = RNG.integers(0, 50, 1234 + 3000)  # the whole input's labels: this block is rows 1234 on
    sums = RNG.random((3, 15)) * 100
    kernel, twin = _both_passes(x, target, True, offset=1234, sums=sums, parallel=parallel)
    assert all(np.array_equal(a, b) for a, b in zip(kernel[1:], twin[1:]))


def test_top_label_twin_reports_the_same_first_bad_row():
    z = _logits(300, 10, np.float32)
    z[40, 3], z[120, 0] = np.nan, np.inf
    assert _both_passes(z, np.zeros(300, np.int64), True)[0][0] == _both_passes(z, np.zeros(300, np.int64), True)[1][0]
    assert _both_passes(z, np.zeros(300, np.int64), True)[1][0] == (40, rowpass.NOT_FINITE)
    p = np.full((300, 10), 0.1)
    p[7, 0], p[9, 1], p[5, :] = 0.5, -0.1, 0.2  # bad sum at 7 and 5, out of range at 9: row 5 first
    p[200, 2] = np.nan
    kernel, twin = _both_passes(p, np.zeros(300, np.int64), False)
    assert kernel[0] == twin[0] == (5, rowpass.BAD_SUM)
    p[5, :] = 0.1
    p[9, 1] = 1e308  # finite, but the row's sum is not: reported as not finite by both
    p[9, 2] = 1e308
    kernel, twin = _both_passes(p, np.zeros(300, np.int64), False)
    assert kernel[0] == twin[0] == (7, rowpass.BAD_SUM)
    p[7, 0] = 0.1
    kernel, twin = _both_passes(p, np.zeros(300, np.int64), False)
    assert kernel[0] == twin[0] == (9, rowpass.NOT_FINITE)


def test_top_label_pass_runs_the_twin_through_its_entry(monkeypatch):
    """``top_label_pass`` with a twin still in budget (float16 and non-contiguous input: converted a block at a time)
    returns the kernel's bits."""
    z = _logits(20_000, 30, np.float16)[:, ::-1]
    target = RNG.integers(0, 30, 20_000)
    monkeypatch.setattr(rowpass, "_CONVERT_ELEMENTS", 1 << 16)
    expected = rowpass.top_label_pass(z, target, True, n_bins=15)
    twin = numpy_twin.NumpyTwin(rowpass._serial, compile_seconds=100.0, seconds_per_value=0.0)
    twin._kernel_ready = False
    monkeypatch.setattr(twin, "kernels", ())  # as in a process where nothing is compiled yet
    monkeypatch.setattr(rowpass, "_TWIN", twin)
    got = rowpass.top_label_pass(z, target, True, n_bins=15)
    assert twin.spent > 0
    for a, b in zip(expected[:3], got[:3]):
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------------------ row kinds, finite, bins
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stop_at_other", [False, True])
def test_row_counts_twin_is_the_kernel(dtype, stop_at_other):
    p = _softmax(_logits(400, 6, np.float64)).astype(dtype)
    p[10] = [1, 0, 0, 0, 0, 0]  # coarse
    p[11] = [0.25, 0.25, 0.5, 0, 0, 0]  # coarse
    p[50] = 0.1  # inside [0, 1], sums to 0.6: boxed other
    p[90, 0] = np.nan
    p[120] = _logits(1, 6, dtype)  # a logit row
    for x in (p, _logits(300, 6, dtype), p[:9]):
        expected, got = np.array([0, 0, 0, -1, -1]), np.array([0, 0, 0, -1, -1])
        stopped = row_kinds._count_rows(x, 1e-2, stop_at_other, 5, expected)
        assert row_kinds._twin_count_rows(x, 1e-2, stop_at_other, 5, got) == stopped
        assert np.array_equal(expected, got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_non_finite_twin_is_the_kernel(dtype, monkeypatch):
    x = _logits(2000, 20, dtype)
    assert finite.first_non_finite(x) == -1
    for row, value in ((1500, np.nan), (700, -np.inf)):
        x[row, 3] = value
        expected = int(serial_twin(finite._first_non_finite_parallel)(x))
        monkeypatch.setattr(finite, "_TWIN", numpy_twin.NumpyTwin(compile_seconds=100.0, seconds_per_value=0.0))
        assert finite.first_non_finite(x) == expected == row
        monkeypatch.undo()


def test_bin_index_twin_is_the_kernel(monkeypatch):
    for n_bins in (1, 10, 15, 100):
        edges = bins.uniform_edges(n_bins)
        values = np.concatenate([RNG.random(10_000), edges, np.nextafter(edges, 2), np.nextafter(edges, -1), [-1, 2]])
        expected = bins.uniform_bin_index(values, n_bins)
        monkeypatch.setattr(bins, "_TWIN", numpy_twin.NumpyTwin(compile_seconds=100.0, seconds_per_value=0.0))
        assert np.array_equal(bins.uniform_bin_index(values, n_bins), expected)
        monkeypatch.undo()


# ------------------------------------------------------------------------------------------------ a new user's process
FRESH = textwrap.dedent(
    """
    import json, numpy as np
    from numba.core import event
    compiled = []
    class Listener(event.Listener):
        def on_start(self, ev): compiled.append(ev.data["dispatcher"].py_func.__qualname__)
        def on_end(self, ev): pass
    event.register("numba:compile", Listener())
    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.conformal import ConformalPredictor
    from hf_calibration.metrics import ece
    rng = np.random.default_rng(0)
    z = (3 * rng.normal(size=(5000, 100))).astype(np.float32)
    y = rng.integers(0, 100, 5000)
    out = {"ece": ece(z, y, n_bins=15), "t": TemperatureScaling().fit(z, y, progress_bar=False).fitted_temperature}
    cp = ConformalPredictor("aps").fit(z, y, alpha=0.1)
    out["q_hat"] = float(cp.q_hat)
    out["sizes"] = cp.predict_sets(z[:500]).sum(axis=1).tolist()
    out["compiled"] = compiled
    print(json.dumps(out))
    """
)


def test_a_fresh_process_compiles_nothing_and_gets_the_kernels_bits(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), HF_CALIBRATION_COMPILE_SECONDS="1")
    run = subprocess.run([sys.executable, "-c", FRESH], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    fresh = json.loads(run.stdout.strip().splitlines()[-1])
    assert fresh["compiled"] == []
    env["HF_CALIBRATION_COMPILE_SECONDS"] = "0"  # the kernels from the first call (this cache: compiled now)
    run = subprocess.run([sys.executable, "-c", FRESH], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    kernels = json.loads(run.stdout.strip().splitlines()[-1])
    assert kernels["compiled"]
    for name in ("ece", "t", "q_hat", "sizes"):
        assert fresh[name] == kernels[name], name


@pytest.mark.parametrize("raw, expected", [(None, 1.0), ("", 1.0), ("  ", 1.0), ("0", 0.0), ("2.5", 2.5)])
def test_compile_budget_variable_unset_or_empty_is_the_default(monkeypatch, raw, expected):
    from hf_calibration._core.numpy_twin import env_seconds

    if raw is None:
        monkeypatch.delenv("HF_CALIBRATION_COMPILE_SECONDS", raising=False)
    else:
        monkeypatch.setenv("HF_CALIBRATION_COMPILE_SECONDS", raw)
    assert env_seconds("HF_CALIBRATION_COMPILE_SECONDS") == expected


@pytest.mark.parametrize("raw", ["abc", "nan", "-1", "inf"])
def test_compile_budget_variable_that_is_no_duration_names_the_variable(monkeypatch, raw):
    from hf_calibration._core.numpy_twin import env_seconds

    monkeypatch.setenv("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS", raw)
    with pytest.raises(ValueError, match="HF_CALIBRATION_PARALLEL_COMPILE_SECONDS"):
        env_seconds("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS")
