"""``_core.parallel``: a ``parallel_kernel``'s serial twin computes what the parallel kernel computes, bit for bit, so that
``run_pass`` may run either (the rent-or-buy rule of the module docstring) without changing a result; and the rule
itself: the twin on one thread, then on more until its passes have taken ``PARALLEL_COMPILE_SECONDS``."""

from __future__ import annotations

import copy
import warnings

import numba
import numpy as np
import pytest
import torch

from hf_calibration._core import finite, parallel, rowpass
from hf_calibration.calibrators import create_calibrator
from hf_calibration.calibrators._machinery.fitting import smart_step
from hf_calibration.calibrators._machinery.forward import apply
from hf_calibration.conformal import ConformalPredictor
from hf_calibration.metrics import ece

pytestmark = pytest.mark.kernels


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return a == b


def _recorded_passes(monkeypatch) -> list:
    """Run the public calls that reach every twin; return each pass's (kernel, arguments before the call)."""
    calls = []
    real = parallel.run_threads

    def record(kernel, threads, size, *args):
        if parallel.serial_twin(kernel) is not None:
            calls.append((kernel, copy.deepcopy(args)))
        return real(kernel, threads, size, *args)

    monkeypatch.setattr(parallel, "run_threads", record)
    monkeypatch.setattr(apply, "run_threads", record)
    monkeypatch.setattr(smart_step, "run_threads", record)
    monkeypatch.setattr(finite, "pass_threads", lambda size: 2)  # the finiteness scan through run_pass
    monkeypatch.setattr(rowpass, "PARALLEL_MIN_ELEMENTS", 0)  # the top-label pass of a small array in tasks too
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in (np.float32, np.float64):
            y = rng.integers(0, 50, 600)
            z = (3 * rng.normal(size=(600, 50)) + 3 * np.eye(50)[y]).astype(dtype)
            for method in ("temperature_scaling", "vector_scaling", "svs", "smart"):
                options = {"max_steps": 3} if method == "smart" else {}  # each step's arguments are recorded
                fitted = create_calibrator(method, **options).fit(z, y, progress_bar=False)
                fitted(torch.from_numpy(z))
            predictor = ConformalPredictor("aps").fit(z[:300], y[:300], alpha=0.1)
            predictor.predict_sets(z[300:])
            ece(z, y)
            bad = z.copy()
            bad[431, 7] = np.nan
            assert finite.first_non_finite(bad) == 431
    return calls


def test_every_serial_twin_equals_its_parallel_kernel_bit_for_bit(monkeypatch):
    calls = _recorded_passes(monkeypatch)
    covered = {id(kernel) for kernel, _ in calls}
    names = {parallel.serial_twin(kernel).py_func.__qualname__ for kernel, _ in calls}
    assert covered == set(parallel._TWINS), f"twins not reached by the calls: {sorted(names)}"
    threads = numba.get_num_threads()
    for kernel, args in calls:
        serial_args, parallel_args = copy.deepcopy(args), copy.deepcopy(args)
        got = parallel.serial_twin(kernel)(*serial_args)
        numba.set_num_threads(threads)  # the parallel kernel on every thread numba has
        want = kernel(*parallel_args)
        name = kernel.py_func.__qualname__
        assert _same(got, want), f"{name}: the twin returned {got!r}, the parallel kernel {want!r}"
        for i, (a, b) in enumerate(zip(serial_args, parallel_args)):  # the outputs written in place
            assert _same(a, b), f"{name}: argument {i} differs after the pass"


def test_the_twin_runs_until_its_passes_have_paid_for_the_parallel_compile(monkeypatch):
    """One thread: always the twin. More: the twin until its passes (its own compile not counted) reach
    PARALLEL_COMPILE_SECONDS, then the parallel kernel; a pass of PARALLEL_AT_ONCE_ELEMENTS or more, or a parallel
    kernel already compiled, runs the parallel kernel at once."""
    from hf_calibration.calibrators._machinery.fitting.partition import _nll_derivatives_parallel as kernel

    twin = parallel._TWINS[id(kernel)]
    ran = []
    monkeypatch.setattr(twin, "kernel", _Fake(ran, "twin", compiled=True))
    monkeypatch.setattr(twin, "seconds", 0.0)
    monkeypatch.setattr(parallel, "PARALLEL_COMPILE_SECONDS", 0.05)
    fake_parallel = _Fake(ran, "parallel", compiled=False, seconds=0.0)
    parallel._TWINS[id(fake_parallel)] = twin
    try:
        parallel.run_threads(fake_parallel, 1, 100)
        parallel.run_threads(fake_parallel, 2, 100)
        assert ran == ["twin", "twin"]
        parallel.run_threads(fake_parallel, 1, parallel.PARALLEL_AT_ONCE_ELEMENTS)  # one thread: the twin, any size
        parallel.run_threads(fake_parallel, 2, parallel.PARALLEL_AT_ONCE_ELEMENTS)  # a long pass: parallel at once
        assert ran == ["twin", "twin", "twin", "parallel"]
        twin.kernel.seconds = 0.06  # a pass as long as the compile: the next one buys the parallel kernel
        parallel.run_threads(fake_parallel, 2, 100)
        parallel.run_threads(fake_parallel, 2, 100)
        assert ran[-2:] == ["twin", "parallel"]
        fake_parallel.overloads = {"compiled": True}
        parallel.run_threads(fake_parallel, 1, 100)  # compiled now: no need of the twin, even on one thread
        assert ran[-1] == "parallel"
    finally:
        del parallel._TWINS[id(fake_parallel)]


class _Fake:
    def __init__(self, ran, name, compiled, seconds=0.0):
        self.ran, self.name, self.seconds = ran, name, seconds
        self.overloads = {"compiled": True} if compiled else {}

    def __call__(self, *args):
        import time

        self.ran.append(self.name)
        time.sleep(self.seconds)


def test_the_environment_sets_when_the_parallel_kernels_take_over():
    import os
    import subprocess
    import sys

    code = "from hf_calibration._core import parallel; print(parallel.PARALLEL_COMPILE_SECONDS)"
    env = dict(os.environ, HF_CALIBRATION_PARALLEL_COMPILE_SECONDS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout) == 0.0
    env.pop("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout) == 1.0
