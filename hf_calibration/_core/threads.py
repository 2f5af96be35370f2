"""How many threads a fit's inner step runs on: chosen by timing, so a busy machine does not stall it.

A parallel region ends when its slowest worker does. On cores shared with other processes a worker is often
descheduled and the region waits for it: on a busy machine two threads can take many times longer than one
(``benchmarks/RESULTS.md``); on an idle one they are faster. So the count is measured, not assumed:

* the first call runs on one thread (it also pays for loading compiled code); then one call on one thread and
  one on all of them (numba's or torch's default count) are compared, and the faster is kept (several threads
  must win by 20 %: a tie goes to one thread, which cannot stall). A first call of ``LONG_CALL`` seconds or more is
  itself the one-thread half (loading code is then a small part of it): a fit of a few passes over 50,000 x 21,843
  logits ran two of its seven passes on one thread;
* a call on several threads that takes more than twice their best time falls back to one thread at once
  (contention began mid-fit);
* calls shorter than ``min_seconds`` on one thread stay there (the many-thread half is not tried: on a busy
  machine it can cost 100x, and there is little to gain);
* the comparison is repeated after ``period`` calls, and only once the work done since the last comparison is
  20x what its multi-threaded call cost, so that a busy machine, where that call is slow, pays little for probes.

The result of ``fn`` must not depend on the thread count (the compiled kernels sum fixed chunks in order).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
import weakref
from collections.abc import Callable, Iterator

import numba
import torch

_OUTER_TORCH_THREADS: list[int] = []  # torch's thread counts outside the enclosing torch_single_threaded blocks


def numba_threads() -> int:
    """``numba.get_num_threads()``, torch's thread count kept: the first call launches numba's threading layer, whose
    OpenMP runtime resets the process-wide count that torch reads (a user's ``torch.set_num_threads(1)`` became 2 at
    the first fit, and a model trained after it got other weights)."""
    torch_threads = torch.get_num_threads()
    try:
        return numba.get_num_threads()
    finally:
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


def _available(backend: str) -> int:
    """All the threads a backend may use here (for torch: its count outside any ``torch_single_threaded`` block)."""
    if backend == "numba":
        return numba_threads()
    return _OUTER_TORCH_THREADS[0] if _OUTER_TORCH_THREADS else torch.get_num_threads()


# (get, set) of the thread count each backend's parallel regions use
_BACKENDS = {
    "numba": (numba_threads, numba.set_num_threads),
    "torch": (torch.get_num_threads, torch.set_num_threads),
}
AMORTISE = 20.0  # probe again once the work since the last probe is this many times the multi-threaded probe's cost
LONG_CALL = 0.25  # seconds: a first call this long is a fair one-thread timing (loading compiled code takes ~10 ms)


class ThreadCountChooser:
    """Calls ``fn`` on the thread count that was fastest lately (``backend``: ``"numba"`` or ``"torch"``).

    The caller's thread count is restored after every call, and so is torch's (a numba parallel region resets the
    process-wide OpenMP count that torch reads). ``history`` records the count of every call.
    """

    def __init__(self, fn: Callable, period: int = 50, backend: str = "numba", min_seconds: float = 2e-4):
        if backend not in _BACKENDS:
            raise ValueError(f"Expected argument `backend` to be one of {sorted(_BACKENDS)}, but got {backend!r}.")
        # a bound method is held weakly: an objective that keeps its chooser (``self._step = ThreadCountChooser(self._pass)``)
        # would otherwise be a reference cycle, and its (N, K) arrays outlive the fit until the garbage collector runs
        # (SVS's 4.1 GB of features at 50,000 x 21,843 were still held during the fit's report)
        self._fn = weakref.WeakMethod(fn) if inspect.ismethod(fn) else (lambda: fn)
        self.period, self.min_seconds = period, min_seconds
        self._get, self._set = _BACKENDS[backend]
        self.many = _available(backend)
        self.best = 1
        self.history: list[int] = []
        self.probes = 0  # one-vs-many comparisons made
        self._phase = "warm-up"  # "warm-up" (first call, one thread), "one" / "many" (a probe's halves), "run"
        self._one = math.inf  # the probe's one-thread time
        self._many_best = math.inf  # fastest multi-threaded call since the last probe
        self._probe_cost = 0.0  # what the last multi-threaded probe call took
        self._work = 0.0  # seconds spent in calls since the last probe
        self._since_probe = 0  # calls since the last probe

    @property
    def fn(self) -> Callable:
        return self._fn()

    def _run(self, threads: int, args) -> tuple[object, float]:
        before = self._get()
        torch_before = torch.get_num_threads()
        switch = threads != before  # setting the count costs ~10 us: only when it changes
        if switch:
            self._set(threads)
        try:
            start = time.perf_counter()
            out = self.fn(*args)
            elapsed = time.perf_counter() - start
        finally:
            if switch:
                self._set(before)
            if torch.get_num_threads() != torch_before:  # numba's OpenMP layer resets the count torch reads
                torch.set_num_threads(torch_before)
        self.history.append(threads)
        self._work += elapsed
        return out, elapsed

    def __call__(self, *args):
        if self.many <= 1:
            return self._run(1, args)[0]
        if self._phase == "one":  # probe, first half: one thread
            self.probes += 1
            out, self._one = self._run(1, args)
            if self._one < self.min_seconds:  # too short to gain from threads: stay on one until the next probe
                self._start_run(1, 0.0)
            else:
                self._phase = "many"
            return out
        if self._phase == "many":  # probe, second half: all threads; keep the faster
            out, elapsed = self._run(self.many, args)
            self._start_run(self.many if elapsed < 0.8 * self._one else 1, elapsed)
            return out
        out, elapsed = self._run(self.best, args)
        if self._phase == "warm-up":  # the first call also loads compiled code: a fair timing only when it is long
            if elapsed >= LONG_CALL:
                self.probes += 1
                self._one, self._phase = elapsed, "many"
            else:
                self._phase = "one"
            return out
        if self.best > 1:
            if elapsed > 2 * self._many_best:  # contention began: one thread until the next probe
                self.best = 1
            self._many_best = min(self._many_best, elapsed)
        self._since_probe += 1
        if self._since_probe >= self.period and self._work >= AMORTISE * self._probe_cost:
            self._phase = "one"
        return out

    def _start_run(self, best: int, probe_cost: float) -> None:
        self.best, self._phase = best, "run"
        self._many_best, self._probe_cost, self._work, self._since_probe = probe_cost or math.inf, probe_cost, 0.0, 0


@contextlib.contextmanager
def torch_single_threaded() -> Iterator[None]:
    """Run torch on one thread inside the block (restored after): a fit's O(N K) elementwise passes are
    memory-bound, and on a busy machine each of their parallel regions can stall (see above). Steps that do
    gain from threads (large matrix products) go through a ``ThreadCountChooser(backend="torch")``."""
    threads = torch.get_num_threads()
    _OUTER_TORCH_THREADS.append(threads)
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        _OUTER_TORCH_THREADS.pop()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
