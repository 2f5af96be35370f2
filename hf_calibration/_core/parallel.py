"""One-shot compiled passes (a metric, a fit's few passes over the logits): on how many threads they run.

A numba parallel region ends when its slowest thread does, and on cores other processes also use a thread is often
descheduled. Measured on this project's 2-core machine at load 8: two threads made the top-label pass and temperature
scaling's Newton pass 2-4x slower than one; on an idle machine they are 1.8x faster. A fit of thousands of steps
learns the better count by timing its own calls (``calibrators._threads.ThreadCountChooser``); a pass that runs a few
times cannot, so it reads the machine's 1-minute load average instead: all of numba's threads while the load leaves
a core for each of them, fewer as it rises, one thread on a busy machine. This process's own share of that average (its
CPU seconds per second, averaged the same way) is not counted: a fit whose passes kept both cores busy read a load of
2 and dropped to one thread for the rest of its passes (it counts as one at least, as the load average's rule
counted it before). Below ``PARALLEL_MIN_ELEMENTS`` values a pass
runs on one thread (waking the others costs more than it saves). Every kernel adds its chunks in order, so the thread
count never changes a result. (numba's dynamic scheduling, ``parallel_chunksize``, made these kernels 5x slower here,
even on one thread: the loops are split statically.)
"""

from __future__ import annotations

import math
import os
import time

import numba
import torch

__all__ = ["PARALLEL_MIN_ELEMENTS", "pass_threads", "run_pass"]

PARALLEL_MIN_ELEMENTS = 1 << 18


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
    threads = numba.get_num_threads()
    if size < PARALLEL_MIN_ELEMENTS or threads <= 1:
        return 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return threads
    others = max(0.0, load - max(_own_load(), 1.0))
    return max(1, min(threads, round(_cores() - others)))


def run_pass(kernel, size: int, *args):
    """``kernel(*args)`` (a ``prange`` kernel) on ``pass_threads(size)`` threads; torch's thread count is restored (numba's OpenMP layer resets the count torch reads)."""
    threads = pass_threads(size)
    before, torch_threads = numba.get_num_threads(), torch.get_num_threads()
    try:
        if threads != before:
            numba.set_num_threads(threads)
        return kernel(*args)
    finally:
        if threads != before:
            numba.set_num_threads(before)
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
