"""Numpy twins of compiled kernels: what a process runs before a kernel's compile has paid for itself.

A numba kernel compiles on its first call in a process whose kernel cache does not hold it (after ``pip install``;
``benchmarks/cold_start.py`` measures it), and a small metric call can spend nearly all of its time there. A kernel
registered here has a numpy twin: the same computation in numpy, the same result bit for bit (tested for each). :meth:`NumpyTwin.use` says which to run:

- the kernel, when it is compiled in this process or numba's on-disk cache holds it for this machine;
- else the twin, while the twin's calls (this one's estimate included) have taken less than the kernel's compile
  time; then the kernel, compiled once. The rent-or-buy rule: a process that stops early paid no compile, and one
  that goes on pays at most about twice what knowing its future would have cost.

``HF_CALIBRATION_COMPILE_SECONDS`` scales every kernel's budget: 0 compiles at once (the speed benchmarks that
compare warm calls with other libraries set it, so they measure the kernels).
"""

from __future__ import annotations

import os
import time
import types
from typing import Any

__all__ = ["NumpyTwin", "cached_for_this_machine", "compile_from_now", "env_seconds", "renamed_copy"]


def env_seconds(name: str) -> float:
    """A non-negative number of seconds from the environment variable ``name``; unset or empty (as CI and Docker
    templates leave variables) means 1.0. Anything else is a ``ValueError`` naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"Expected the environment variable `{name}` to be a number of seconds >= 0, but got {raw!r}.")
    return value


BUDGET_SCALE = env_seconds("HF_CALIBRATION_COMPILE_SECONDS")
_ALL: list[NumpyTwin] = []  # every twin of the package, for compile_from_now


def cached_for_this_machine(kernel) -> bool:
    """Whether the numba dispatcher ``kernel`` is compiled in this process, or its on-disk cache holds a compilation
    of its current source for this machine (numba's own index: the source stamp and the CPU's magic tuple)."""
    if kernel.overloads:
        return True
    try:
        index = kernel._cache._cache_file._load_index()
        magic = kernel.targetctx.codegen().magic_tuple()
    except Exception:  # pragma: no cover - numba internals moved, or no cache: assume a compile
        return False
    return any(key[1] == magic for key in index)


def renamed_copy(function, suffix: str):
    """A copy of the plain function ``function`` named ``<name><suffix>``: compiled with other options, numba caches
    it apart from the original (its cache files are named by the qualified name)."""
    copy = types.FunctionType(
        function.__code__, function.__globals__, function.__name__ + suffix, function.__defaults__, function.__closure__
    )
    copy.__qualname__, copy.__module__, copy.__doc__ = (
        function.__qualname__ + suffix,
        function.__module__,
        function.__doc__,
    )
    return copy


class NumpyTwin:
    """The choice between the numba ``kernels`` (one computation: its serial and parallel forms) and their numpy twin.

    ``compile_seconds``: what compiling the kernel costs on a fresh cache (measured by ``cold_start.py``); the twin's
    budget. ``seconds_per_value``: the twin's time per input value, for the estimate of a call."""

    def __init__(self, *kernels, compile_seconds: float, seconds_per_value: float):
        self.kernels = kernels
        self.budget = compile_seconds * BUDGET_SCALE
        self.seconds_per_value = seconds_per_value
        self.spent = 0.0
        self._kernel_ready = False
        self._disk_checked = False
        _ALL.append(self)

    def use(self, values: int) -> bool:
        """Whether a call over ``values`` input values runs the twin (module docstring)."""
        if self._kernel_ready:
            return False
        if self._disk_checked:  # later: only a compile in this process (numba's index read once a twin)
            ready = any(kernel.overloads for kernel in self.kernels)
        else:
            ready, self._disk_checked = any(cached_for_this_machine(kernel) for kernel in self.kernels), True
        if ready:
            self._kernel_ready = True
            return False
        if self.budget <= 0 or self.spent + values * self.seconds_per_value > self.budget:
            self._kernel_ready = True  # the kernel compiles now: no twin from here on
            return False
        return True

    def run(self, function, *args: Any, **kwargs: Any):
        """``function(*args, **kwargs)`` (the twin), its time added to what the twin has spent."""
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - start


def compile_from_now() -> None:
    """Every kernel from its next call on, compiled then if it is not (what ``HF_CALIBRATION_COMPILE_SECONDS=0`` does
    from the start): for a process that knows it will run long, and for measuring the kernels' warm calls."""
    for twin in _ALL:
        twin._kernel_ready = True
