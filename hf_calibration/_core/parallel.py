"""One-shot compiled passes (a metric, a fit's few passes over the logits): on how many threads they run.

A numba parallel region ends when its slowest thread does, and on cores other processes also use a thread is often
descheduled: on a busy machine two threads can make a pass slower than one, on an idle one faster
(``benchmarks/RESULTS.md``). A fit of thousands of steps
learns the better count by timing its own calls (``calibrators._threads.ThreadCountChooser``); a pass that runs a few
times cannot, so it reads the machine's 1-minute load average instead: all of numba's threads while the load leaves
a core for each of them, fewer as it rises, one thread on a busy machine. This process's own share of that average (its
CPU seconds per second, averaged the same way) is not counted: a fit whose passes kept both cores busy read a load of
2 and dropped to one thread for the rest of its passes (it counts as one at least, as the load average's rule
counted it before). Below ``PARALLEL_MIN_ELEMENTS`` values a pass
runs on one thread (waking the others costs more than it saves). Every kernel adds its chunks in order, so the thread
count never changes a result. (The loops are split statically: numba's dynamic scheduling, ``parallel_chunksize``, made these kernels slower,
even on one thread.)

A ``prange`` kernel costs about a second more to compile than the same loop compiled serially (numba's parfor
lowering), which a first call pays in full (see
``benchmarks/cold_start.py``). A kernel declared with :func:`parallel_kernel` is compiled both ways, each when first
used. ``run_pass`` runs the serial twin whenever the pass gets one thread, and also on more threads until the twin's
passes have taken what the parallel compile adds (``PARALLEL_COMPILE_SECONDS`` times the kernel's measured extra;
its own compile not counted) or a pass is ``PARALLEL_AT_ONCE_ELEMENTS``
long: the rent-or-buy rule, which costs at most about twice what knowing in advance whether the parallel compile pays
would. Once the parallel kernel is compiled it is used. The twin is the same code with ``prange`` read as ``range``,
its chunks and their order unchanged, so the result is the same bit for bit (tested for every such kernel).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numba
import torch

from hf_calibration._core.numpy_twin import env_seconds, renamed_copy
from hf_calibration._core.threads import numba_threads

__all__ = [
    "PARALLEL_AT_ONCE_ELEMENTS",
    "PARALLEL_COMPILE_SECONDS",
    "PARALLEL_MIN_ELEMENTS",
    "parallel_kernel",
    "pass_threads",
    "run_pass",
    "run_threads",
    "serial_twin",
]

PARALLEL_MIN_ELEMENTS = 1 << 18
# about what compiling a kernel with parallel=True adds to compiling it serially; the environment variable sets it
# (0: the parallel kernels from the first pass on, as the speed benchmarks measure the steady state)
PARALLEL_COMPILE_SECONDS = env_seconds("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS")
PARALLEL_AT_ONCE_ELEMENTS = 1 << 26  # from this pass size the parallel kernel is compiled at once (see run_threads)


class _Twin:
    """A parallel kernel's serial twin, the seconds its passes took where the parallel kernel could have run, and the
    seconds after which the parallel kernel is compiled instead."""

    def __init__(self, kernel, extra_compile_seconds: float):
        self.kernel = kernel
        self.seconds = 0.0
        self.extra_compile_seconds = extra_compile_seconds

    @property
    def budget(self) -> float:
        # PARALLEL_COMPILE_SECONDS (1 s unless the environment says) scales every kernel's measured extra compile
        return PARALLEL_COMPILE_SECONDS * self.extra_compile_seconds


_TWINS: dict[int, _Twin] = {}  # id(parallel dispatcher) -> its twin


def parallel_kernel(extra_compile_seconds: float = 1.0, **options: Any):
    """``numba.njit(parallel=True, **options)``, plus a serial twin that ``run_pass`` may run instead (module docstring).

    The twin is a copy of the function under another qualified name (``<name>_serial``), so that numba caches the two
    compilations apart. ``extra_compile_seconds``: what the parallel compile adds to the serial one, as measured here
    (about a second for most kernels; SMART's step, 10.8 s against 4.6 s): the twin's passes run that long first."""

    def compile_both(function):
        parallel = numba.njit(parallel=True, **options)(function)
        twin = numba.njit(**options)(renamed_copy(function, "_serial"))
        _TWINS[id(parallel)] = _Twin(twin, extra_compile_seconds)
        return parallel

    return compile_both


def serial_twin(kernel):
    """The serial twin of a :func:`parallel_kernel` (None for another kernel)."""
    twin = _TWINS.get(id(kernel))
    return None if twin is None else twin.kernel


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


LOAD_WINDOW = 60.0  # seconds: the span of the 1-minute load average
_OWN = {"time": time.monotonic(), "cpu": time.process_time(), "load": 0.0}


def _own_load() -> float:
    """This process's share of the 1-minute load average: its CPU seconds per second since the last call, folded into
    an average that forgets at the load average's rate (``exp(-dt / 60 s)``)."""
    now, cpu = time.monotonic(), time.process_time()
    dt = now - _OWN["time"]
    if dt > 0:
        keep = math.exp(-dt / LOAD_WINDOW)
        _OWN["load"] = keep * _OWN["load"] + (1.0 - keep) * (cpu - _OWN["cpu"]) / dt
        _OWN["time"], _OWN["cpu"] = now, cpu
    return _OWN["load"]


def pass_threads(size: int) -> int:
    """Threads for a pass over ``size`` values: 1 below ``PARALLEL_MIN_ELEMENTS``; else numba's count, less one for each
    core that other processes take (the load average less this process's own share, which counts as at least one: it
    is running now, though a process that has just started has no share in the average yet), rounded."""
    threads = numba_threads()
    if size < PARALLEL_MIN_ELEMENTS or threads <= 1:
        return 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return threads
    others = max(0.0, load - max(_own_load(), 1.0))
    return max(1, min(threads, round(_cores() - others)))


def run_pass(kernel, size: int, *args):
    """``kernel(*args)`` (a ``prange`` kernel) on ``pass_threads(size)`` threads, or its serial twin (module docstring);
    torch's thread count is restored (numba's OpenMP layer resets the count torch reads)."""
    return run_threads(kernel, pass_threads(size), size, *args)


def run_threads(kernel, threads: int, size: int, *args):
    """``kernel(*args)`` on ``threads`` numba threads, or its serial twin where the module docstring's rule says; a
    pass over ``size`` values of ``PARALLEL_AT_ONCE_ELEMENTS`` or more on several threads runs the parallel kernel at
    once (a serial pass that long already costs about what the parallel compile does)."""
    twin = _TWINS.get(id(kernel))
    if twin is not None and not kernel.overloads:  # the parallel kernel is not compiled (in this process) yet
        if threads == 1:
            return twin.kernel(*args)
        if twin.seconds < twin.budget and size < PARALLEL_AT_ONCE_ELEMENTS:
            compiled, start = bool(twin.kernel.overloads), time.perf_counter()
            try:
                return twin.kernel(*args)
            finally:
                if compiled:  # the passes' time, not the twin's own compile
                    twin.seconds += time.perf_counter() - start
    torch_threads = torch.get_num_threads()
    before = numba_threads()
    try:
        if threads != before:
            numba.set_num_threads(threads)
        return kernel(*args)
    finally:
        if threads != before:
            numba.set_num_threads(before)
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
