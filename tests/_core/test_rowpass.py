"""The compiled top-label pass (``metrics._rowpass``) and the one bin rule (``binning.uniform_bin``): against numpy's
softmax, against ``searchsorted`` at the bin edges, the same on one thread and several, and the row checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_calibration._core import parallel as _parallel
from hf_calibration._core import rowpass as _rowpass
from hf_calibration.metrics import ece, ece_split, mce
from hf_calibration.metrics._format import prepare, top_label
from hf_calibration.metrics.binning import _uniform_bin_index, uniform_edges

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)


@pytest.mark.parametrize("k", [2, 3, 8, 17, 128, 129, 300, 1000])
def test_float64_confidences_against_math_exp_and_fsum(k):
    """Float64 confidences are libm's exp summed in numpy's pairwise order: within a few ulp of the exactly rounded
    ``1 / fsum(exp(z - max))``. (Not compared bit for bit with numpy's softmax: numpy's own float64 ``exp`` dispatches
    to SIMD code on AVX-512 CPUs that differs from libm by 1 ulp.)"""
    rng = np.random.default_rng(k)
    z = 3 * rng.normal(size=(200, k))
    conf = top_label(prepare(z, rng.integers(0, k, 200))).confidence
    reference = np.array([1.0 / math.fsum(math.exp(v - row.max()) for v in row) for row in z])
    np.testing.assert_allclose(conf, reference, rtol=1e-13, atol=0)


@pytest.mark.parametrize("k", [5, 100, 21_843])
def test_float32_confidences_are_within_float32_rounding(k):
    rng = np.random.default_rng(k)
    z = (4 * rng.normal(size=(40, k))).astype(np.float32)
    top = top_label(prepare(z, rng.integers(0, k, 40)))
    z64 = z.astype(np.float64)
    reference = 1.0 / np.exp(z64 - z64.max(axis=1, keepdims=True)).sum(axis=1)
    np.testing.assert_allclose(top.confidence, reference, rtol=2e-7)
    np.testing.assert_array_equal(top.prediction, z.argmax(axis=1))


def test_argmax_ties_go_to_the_first_index():
    z = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, -0.0, -1.0, -1.0]])
    np.testing.assert_array_equal(top_label(prepare(z, np.zeros(3, int))).prediction, z.argmax(axis=1))


@pytest.mark.parametrize("n_bins", [10, 15])
def test_the_bin_rule_is_searchsorted_at_the_edges(n_bins):
    """``lo < p <= hi``: values at, just below and just above every edge, 0 and 1, float16 softmax outputs."""
    edges = uniform_edges(n_bins)
    values = np.concatenate([edges, np.nextafter(edges, 2), np.nextafter(edges, -1), [0.2, 0.8, 0.5, 1.0, 0.0]])
    values = np.clip(values, 0.0, 1.0)
    half = (
        torch.softmax(torch.randn(500, 4, generator=torch.Generator().manual_seed(0)).half(), 1)
        .double()
        .numpy()
        .ravel()
    )
    values = np.concatenate([values, half])
    reference = np.searchsorted(edges[1:-1], values, side="left")
    np.testing.assert_array_equal(_uniform_bin_index(values, n_bins), reference)


def test_ece_from_the_fused_bin_sums_equals_the_per_row_path():
    """ece / mce / ece_split add each row to its bin inside the pass: the same bins as the per-row arrays give, on
    rows whose confidences sit exactly on edges ([0.5, 0.5] rows, 0.2 / 0.8 with 10 bins)."""
    from hf_calibration.metrics.ece import _ece_compute, _ece_split_compute, _mce_compute

    probs = np.array([[0.5, 0.5], [0.8, 0.2], [0.2, 0.8], [0.9, 0.1], [0.6, 0.4], [0.55, 0.45]] * 5)
    y = np.array([0, 1, 1, 0, 1, 0] * 5)
    top = top_label(prepare(probs, y))
    for n_bins in (10, 15):
        assert ece(probs, y, n_bins) == pytest.approx(_ece_compute(top.confidence, top.correct, n_bins), abs=1e-15)
        assert mce(probs, y, n_bins) == pytest.approx(_mce_compute(top.confidence, top.correct, n_bins), abs=1e-15)
        assert tuple(ece_split(probs, y, n_bins)) == pytest.approx(
            tuple(_ece_split_compute(top.confidence, top.correct, n_bins)), abs=1e-15
        )


def test_the_same_numbers_on_one_thread_and_several(monkeypatch):
    rng = np.random.default_rng(3)
    z = (3 * rng.normal(size=(3000, 500))).astype(np.float32)
    y = rng.integers(0, 500, 3000)
    one = (top_label(prepare(z, y)).confidence, ece(z, y))
    monkeypatch.setattr(_rowpass, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(_parallel.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine: every thread
    several = (top_label(prepare(z, y)).confidence, ece(z, y))
    np.testing.assert_array_equal(one[0], several[0])
    assert one[1] == several[1]


@pytest.mark.parametrize("k", [1, 3, 10, 13, 127, 129])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_short_rows_grouped_into_one_exp_call_give_the_row_by_row_numbers(k, dtype, monkeypatch):
    """Short rows go through ``exp`` a group at a time (``group_rows``): the same confidences, predictions and bins,
    bit for bit, as one row a call, and a bad row inside a group is still the first one named."""
    rng = np.random.default_rng(k)
    z = (3 * rng.normal(size=(1001, k))).astype(dtype)
    y = rng.integers(0, k, 1001)
    grouped = _rowpass.top_label_pass(z, y, True, n_bins=15)
    assert _rowpass.group_rows(k) == max(1, 128 // k)
    monkeypatch.setattr(_rowpass, "group_rows", lambda k: 1)
    single = _rowpass.top_label_pass(z, y, True, n_bins=15)
    for a, b in zip(grouped[:3], single[:3]):
        np.testing.assert_array_equal(a, b)
    monkeypatch.undo()
    bad = z.copy()
    bad[[500, 503], 0] = [np.inf, np.nan]  # rows 500 and 503 share a group at every K below 64
    assert _rowpass.top_label_pass(bad, y, True, n_bins=15)[3] == (500, _rowpass.NOT_FINITE)
    bad[500, 0] = 0.0
    assert _rowpass.top_label_pass(bad, y, True, n_bins=15)[3] == (503, _rowpass.NOT_FINITE)


def test_threads_follow_the_load_of_other_processes(monkeypatch):
    """Threads: the cores the load average leaves, less this process's own share of it (a fit keeping both cores busy
    read a load of 2 and dropped to one thread)."""
    monkeypatch.setattr(_parallel, "_cores", lambda: 2)
    monkeypatch.setattr(_parallel.numba, "get_num_threads", lambda: 2)

    def machine(load: float, own: float) -> None:
        monkeypatch.setattr(_parallel.os, "getloadavg", lambda: (load, 0.0, 0.0))
        monkeypatch.setattr(_parallel, "_own_load", lambda: own)

    machine(0.3, 0.0)  # an idle machine
    assert _parallel.pass_threads(1 << 22) == 2 and _parallel.pass_threads(100) == 1
    machine(1.1, 1.0)  # this process alone on one core for the last minute
    assert _parallel.pass_threads(1 << 22) == 2
    machine(2.1, 2.0)  # this process alone on both cores (the old rule, round(2 - 2.1 + 1), gave 1)
    assert _parallel.pass_threads(1 << 22) == 2
    machine(1.8, 0.9)  # another process on the other core
    assert _parallel.pass_threads(1 << 22) == 1
    machine(1.4, 0.0)  # this process just started: it counts as one running (no share of the average yet)
    assert _parallel.pass_threads(1 << 22) == 2
    machine(3.5, 1.0)  # a busy machine: one thread
    assert _parallel.pass_threads(1 << 22) == 1


def test_own_load_is_this_process_cpu_rate_averaged_over_a_minute(monkeypatch):
    clock = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(_parallel.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(_parallel.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(_parallel, "_OWN", {"time": 100.0, "cpu": 10.0, "load": 0.0})
    for _ in range(60):  # two busy threads for ten minutes, seen every 10 s
        clock["wall"] += 10.0
        clock["cpu"] += 20.0
        own = _parallel._own_load()
    assert own == pytest.approx(2.0, rel=1e-4)
    clock["wall"] += 60.0  # then a minute idle: 1/e of it is left, as in the kernel's average
    assert _parallel._own_load() == pytest.approx(2.0 * np.exp(-1.0), rel=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ">f4"])
def test_bad_rows_are_named(dtype):
    z = np.random.default_rng(0).normal(size=(50, 6)).astype(dtype)
    y = np.zeros(50, int)
    for value, row in ((np.nan, 17), (np.inf, 3), (-np.inf, 41)):
        bad = z.copy()
        bad[row, 2] = value
        with pytest.raises(ValueError, match=f"row {row} contains NaN or inf"):
            ece(bad, y)
    probs = np.full((50, 6), 1 / 6)
    probs[9] = [0.5, 0.5, 0.5, 0, 0, 0]
    with pytest.raises(ValueError, match="row 9 sums to 1.5"):
        ece(probs, y, from_logits=False)
    probs[9] = [1.2, -0.2, 0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\].*row 9"):
        ece(probs, y, from_logits=False)


def test_a_short_block_of_long_rows_is_split_across_threads(monkeypatch):
    """A fit's report passes blocks of ~190 rows at K = 21,843: one 256-row task left one thread doing the work."""
    seen = []
    run = _rowpass.run_pass
    monkeypatch.setattr(
        _rowpass, "run_pass", lambda kernel, size, *args: seen.append(args[-1]) or run(kernel, size, *args)
    )
    from hf_calibration._core import parallel

    monkeypatch.setattr(parallel, "pass_threads", lambda size: 2)
    z = np.random.default_rng(0).normal(size=(190, 21_843)).astype(np.float32)
    conf = _rowpass.top_label_pass(z, None, True)[0]
    assert seen and -(-190 // seen[0]) >= 32  # tasks: many per thread
    z64 = z.astype(np.float64)
    np.testing.assert_allclose(conf, 1.0 / np.exp(z64 - z64.max(1, keepdims=True)).sum(1), rtol=2e-7)
    assert _rowpass.task_rows(10) == _rowpass.BLOCK  # short rows: unchanged


def test_the_top_label_pass_does_not_depend_on_the_thread_count(monkeypatch):
    """From PARALLEL_MIN_ELEMENTS values the pass runs in tasks whatever the threads (one thread: the serial twin of the
    task kernel). It once ran a plain serial loop on one thread, whose confidence sums rounded otherwise: ECE
    0.4303693600274182 on one thread, ...181 on two, the thread count set by the machine's load."""
    from hf_calibration._core import parallel
    from hf_calibration.metrics import ece

    rng = np.random.default_rng(0)
    z = (3 * rng.normal(size=(20000, 100))).astype(np.float32)
    y = rng.integers(0, 100, 20000)
    monkeypatch.setattr(parallel, "pass_threads", lambda size: 1)
    one = ece(z, y)
    monkeypatch.setattr(parallel, "pass_threads", lambda size: 2)
    monkeypatch.setattr(parallel, "PARALLEL_COMPILE_SECONDS", 0.0)  # the parallel kernel itself
    two = ece(z, y)
    assert one == two
