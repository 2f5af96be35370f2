"""Finiteness of a row, exact on every CPU: the one compiled check that every kernel asking "NaN or inf?" calls.

No ``fastmath`` here, and no float reduction: ``v - v`` is 0 for a finite ``v`` and NaN for NaN or ±inf, and the
``!= 0`` tests are OR-ed as integers, which LLVM vectorises without reassociating any float arithmetic. (A float sum
compiled with ``reassoc`` and ``nsz``, as this check was before, lost a NaN in float32 rows on AVX-512 CPUs: the
compiler may fold ``x - x`` and regroup the sum. A sum also overflows for finite values near the dtype's maximum.)
"""

from __future__ import annotations

import numba

__all__ = ["row_finite"]


@numba.njit(cache=True, nogil=True)
def row_finite(row):  # pragma: no cover - compiled
    """Whether every value of the 1-D float ``row`` is finite."""
    bad = False
    for j in range(row.shape[0]):
        v = row[j]
        bad |= (v - v) != 0.0
    return not bad
