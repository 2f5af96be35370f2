"""The timing-based thread choice of the fits' inner steps (``_threads.py``), on functions whose speed per thread
count we control."""

from __future__ import annotations

import time

import numba
import pytest
import torch

from hf_calibration._core.threads import AMORTISE, ThreadCountChooser, torch_single_threaded

pytestmark = pytest.mark.skipif(numba.get_num_threads() < 2, reason="one numba thread: nothing to choose")


def timed_fn(slow_on_many: float, fast: float = 0.002, log=None):
    """Sleeps ``fast`` s on one thread, ``slow_on_many`` s on several; records the thread count of each call."""

    def fn(x):
        threads = numba.get_num_threads()
        if log is not None:
            log.append(threads)
        time.sleep(slow_on_many if threads > 1 else fast)
        return 2 * x

    return fn


def test_keeps_one_thread_when_many_stall_and_restores_the_callers_count():
    many = numba.get_num_threads()
    chooser = ThreadCountChooser(timed_fn(0.03), period=5)
    assert [chooser(i) for i in range(12)] == [2 * i for i in range(12)]
    # warm-up on one thread, the probe (one, then many), then one thread: many lost by 10x
    assert chooser.history[:3] == [1, 1, many] and set(chooser.history[3:]) == {1}
    assert numba.get_num_threads() == many


def test_a_busy_machine_pays_for_few_probes():
    chooser = ThreadCountChooser(timed_fn(0.03), period=5)
    for i in range(40):
        chooser(i)
    # the next probe waits until the work since the last one is AMORTISE x the slow probe (20 x 30 ms = 0.6 s,
    # i.e. 300 calls of 2 ms), not just `period` calls
    assert chooser.history.count(numba.get_num_threads()) == 1
    assert AMORTISE * 0.03 > 40 * 0.002


def test_keeps_many_threads_when_they_win_and_probes_again():
    many = numba.get_num_threads()
    log = []
    chooser = ThreadCountChooser(timed_fn(0.01, fast=0.04, log=log), period=5)
    for i in range(40):
        chooser(i)
    assert log[:4] == [1, 1, many, many]  # warm-up, the probe, then the winner
    assert log.count(many) > len(log) / 2
    # probed again once both `period` calls and AMORTISE x the probe's 10 ms of work had passed (~20 calls later)
    assert chooser.probes >= 2


def test_falls_back_to_one_thread_when_contention_starts():
    many = numba.get_num_threads()
    state = {"busy": False}

    def fn():
        time.sleep(
            0.2 if numba.get_num_threads() > 1 and state["busy"] else (0.01 if numba.get_num_threads() > 1 else 0.04)
        )

    chooser = ThreadCountChooser(fn, period=1000)
    for _ in range(5):
        chooser()
    assert chooser.best == many
    state["busy"] = True
    chooser()  # 20x its best time: one thread from the next call on
    chooser()
    assert chooser.history[-1] == 1 and chooser.best == 1


def test_short_calls_never_try_many_threads():
    log = []
    chooser = ThreadCountChooser(timed_fn(0.0, fast=0.0, log=log), period=3, min_seconds=0.01)
    for i in range(20):
        chooser(i)
    assert set(log) == {1}


def test_torch_backend_sees_the_count_outside_the_single_threaded_block():
    default = torch.get_num_threads()
    if default < 2:
        pytest.skip("one torch thread")
    log = []

    def fn():
        log.append(torch.get_num_threads())
        time.sleep(0.004 if torch.get_num_threads() == 1 else 0.001)

    with torch_single_threaded():
        assert torch.get_num_threads() == 1
        chooser = ThreadCountChooser(fn, backend="torch")
        for _ in range(4):
            chooser()
        assert torch.get_num_threads() == 1  # restored after every call
    assert log == [1, 1, default, default]
    assert torch.get_num_threads() == default


def test_bad_backend():
    with pytest.raises(ValueError, match="backend"):
        ThreadCountChooser(lambda: None, backend="openmp")


def test_a_long_first_call_is_the_one_thread_half_of_the_first_probe():
    """A first call of LONG_CALL seconds or more is a fair one-thread timing: the next call already tries every thread
    (a short first call still pays for loading code, so the probe starts after it)."""
    from hf_calibration._core.threads import LONG_CALL

    many = numba.get_num_threads()
    log = []
    chooser = ThreadCountChooser(timed_fn(LONG_CALL / 4, fast=LONG_CALL * 1.2, log=log), period=1000)
    for i in range(4):
        chooser(i)
    assert log == [1, many, many, many] and chooser.probes == 1


FIRST_FIT = """
import numpy as np, torch
torch.set_num_threads(1)
assert torch.get_num_threads() == 1
from hf_calibration.calibrators import TemperatureScaling
rng = np.random.default_rng(0)
TemperatureScaling().fit((3 * rng.normal(size=(300, 10))).astype(np.float32), rng.integers(0, 10, 300), progress_bar=False)
print(torch.get_num_threads())
"""


def test_the_first_fit_of_a_process_keeps_torchs_thread_count():
    """Issue 53 item 11: a process's first fit launched numba's threading layer (its first ``numba.get_num_threads``),
    whose OpenMP runtime reset the count torch reads: ``torch.set_num_threads(1)`` became 2, so a model trained after
    a fit got other weights than one trained before it (the ONNX export test's logits, and its Dirichlet fit, depended
    on which tests had run). In a fresh process, where numba's threads are not launched yet."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_NUM_THREADS="2", HF_CALIBRATION_COMPILE_SECONDS="0")
    run = subprocess.run([sys.executable, "-c", FIRST_FIT], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == "1"
