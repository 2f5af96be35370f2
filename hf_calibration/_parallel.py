"""One-shot compiled passes (a metric, a fit's few passes over the logits): on how many threads they run.

A numba parallel region ends when its slowest thread does, and on cores other processes also use a thread is often
descheduled. Measured on this project's 2-core machine at load 8: two threads made the top-label pass and temperature
scaling's Newton pass 2-4x slower than one; on an idle machine they are 1.8x faster. A fit of thousands of steps
learns the better count by timing its own calls (``calibrators._threads.ThreadCountChooser``); a pass that runs a few
times cannot, so it reads the machine's 1-minute load average instead: all of numba's threads while the load leaves
a core for each of them, fewer as it rises, one thread on a busy machine. Below ``PARALLEL_MIN_ELEMENTS`` values a pass
runs on one thread (waking the others costs more than it saves). Every kernel adds its chunks in order, so the thread
count never changes a result. (numba's dynamic scheduling, ``parallel_chunksize``, made these kernels 5x slower here,
even on one thread: the loops are split statically.)
"""

from __future__ import annotations

import os

import numba
import torch

__all__ = ["PARALLEL_MIN_ELEMENTS", "pass_threads", "run_pass"]

PARALLEL_MIN_ELEMENTS = 1 << 18


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pass_threads(size: int) -> int:
    """Threads for a pass over ``size`` values: 1 below ``PARALLEL_MIN_ELEMENTS``; else numba's count, less one for each
    core the load average says is taken, rounded (this process's own run counts as one: it is running)."""
    threads = numba.get_num_threads()
    if size < PARALLEL_MIN_ELEMENTS or threads <= 1:
        return 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return threads
    # rounded, not truncated: a process that has itself run for the last minute reads a load of ~1.0-1.2 on an otherwise
    # idle machine, and int(2 - 1.1 + 1) = 1 left a core idle (every pass at 50,000 x 21,843 ran on one thread)
    return max(1, min(threads, round(_cores() - load + 1)))


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
