"""Finiteness of a row, exact on every CPU: the one compiled check that every kernel asking "NaN or inf?" calls.

No ``fastmath`` here, and no float reduction: ``v - v`` is 0 for a finite ``v`` and NaN for NaN or ±inf, and the
``!= 0`` tests are OR-ed as integers, which LLVM vectorises without reassociating any float arithmetic. (A float sum
compiled with ``reassoc`` and ``nsz``, as this check was before, lost a NaN in float32 rows on AVX-512 CPUs: the
compiler may fold ``x - x`` and regroup the sum. A sum also overflows for finite values near the dtype's maximum.)
"""

from __future__ import annotations

import numba
import numpy as np

from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, pass_threads, run_pass, serial_twin

__all__ = ["first_non_finite", "row_finite"]


@numba.njit(cache=True, nogil=True, fastmath=False)  # explicit, or it would inherit its first caller's fastmath
def row_finite(row):  # pragma: no cover - compiled
    """Whether every value of the 1-D float ``row`` is finite."""
    bad = False
    for j in range(row.shape[0]):
        v = row[j]
        bad |= (v - v) != 0.0
    return not bad


@parallel_kernel(cache=True, nogil=True)
def _first_non_finite_parallel(x):  # pragma: no cover - compiled
    n = x.shape[0]
    chunks = (n + 255) // 256
    first = np.full(chunks, -1, np.int64)
    for c in numba.prange(chunks):
        for i in range(c * 256, min(n, (c + 1) * 256)):
            if not row_finite(x[i]):
                first[c] = i
                break
    for c in range(chunks):
        if first[c] >= 0:
            return first[c]
    return -1


@numba.njit(cache=True, nogil=True)
def _first_non_finite_serial(x):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        if not row_finite(x[i]):
            return i
    return -1


_TWIN = NumpyTwin(
    _first_non_finite_serial, _first_non_finite_parallel, serial_twin(_first_non_finite_parallel),
    compile_seconds=0.3, seconds_per_value=2e-9,
)  # fmt: skip


def first_non_finite(x: np.ndarray) -> int:
    """The first row of the (n, K) float32 / float64 C-ordered ``x`` holding NaN or inf, or -1."""
    if _TWIN.use(x.size):
        bad = _TWIN.run(lambda: ~np.isfinite(x).all(axis=1))
        return int(np.argmax(bad)) if bad.any() else -1
    if pass_threads(x.size) > 1:
        return int(run_pass(_first_non_finite_parallel, x.size, x))
    return int(_first_non_finite_serial(x))
