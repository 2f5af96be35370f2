"""``exp`` and ``log`` over float64 arrays (and ``exp`` over float32 ones), written so numba vectorises the loops (SIMD,
no libm calls), and the row reductions ``max_of`` / ``sum_of`` beside them.

numba calls libm's scalar ``exp``/``log`` once per element (~5 ns each here) and will not vectorise a loop that
contains them. These do the same in pure arithmetic and integer bit operations, about 4x faster, to within a
few ulp. They are for the fused SMART step's row loops, whose inputs are finite and bounded.

Two numba habits decide the layout: the loops run ``range(len(x))`` over whole (sliced) arrays, since an
index that could be negative keeps a wrap-around check that blocks vectorisation; and ``x``, ``out`` and the
scratch ``bits`` should be three different arrays: LLVM vectorises behind a runtime overlap check, so an
in-place call is still correct, only scalar. ``fastmath`` is limited to FMA contraction: reassociation would
fold the rounding trick ``(y + SHIFTER) - SHIFTER`` back to ``y``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hf_calibration._core.numpy_twin import renamed_copy

LOG2E = 1.4426950408889634
LN2_HI = 0.6931471803691238  # ln 2 in two parts: k * LN2_HI is exact for |k| < 2**11
LN2_LO = 1.9082149292705877e-10
SHIFTER = 6755399441055744.0  # 1.5 * 2**52: y + SHIFTER rounds y to an integer, held in the low mantissa bits
SHIFTER_BITS = 0x4338000000000000  # the bits of SHIFTER
SQRT_HALF_BITS = 0x3FE6A09E667F3BCD  # the bits of sqrt(1/2)
MANTISSA = 0x000FFFFFFFFFFFFF
# float32 versions (numba keeps float32 arithmetic float32 only when every constant is float32)
F32 = np.float32
LOG2E_F32 = F32(LOG2E)
LN2_HI_F32 = F32(0.693359375)  # ln 2 in two parts: k * LN2_HI_F32 is exact for |k| < 2**8
LN2_LO_F32 = F32(LN2_HI + LN2_LO - 0.693359375)
SHIFTER_F32 = F32(12582912.0)  # 1.5 * 2**23
SHIFTER_BITS_F32 = 0x4B400000
EXP_MIN_F32, EXP_MAX_F32 = F32(-87.0), F32(88.0)  # 2**k stays a normal float32
ONE_F32, HALF_F32 = F32(1.0), F32(0.5)
TAYLOR_F32 = (F32(1 / 5040), F32(1 / 720), F32(1 / 120), F32(1 / 24), F32(1 / 6))


@numba.njit(cache=True, inline="always")
def exp_taylor(q, r):  # pragma: no cover - compiled
    """The Taylor polynomial of ``exp(r)`` by Horner's rule from ``q``, its value at the ``r**13`` step (``1/13!``, or
    ``1/14! r + 1/13!`` for degree 14): ``(((q r + 1/12!) r + ...) r + 1) r + 1``. Inlined, so each caller's own
    ``fastmath`` decides whether the steps contract to FMAs."""
    q = q * r + 1.0 / 479001600.0
    q = q * r + 1.0 / 39916800.0
    q = q * r + 1.0 / 3628800.0
    q = q * r + 1.0 / 362880.0
    q = q * r + 1.0 / 40320.0
    q = q * r + 1.0 / 5040.0
    q = q * r + 1.0 / 720.0
    q = q * r + 1.0 / 120.0
    q = q * r + 1.0 / 24.0
    q = q * r + 1.0 / 6.0
    q = q * r + 0.5
    q = q * r + 1.0
    return q * r + 1.0


@numba.njit(cache=True, fastmath={"contract"})
def exp_into(x, out, bits):  # pragma: no cover - compiled
    """``out[:] = exp(x)`` for ``x`` clamped to [-708, 709] (never a subnormal or inf; NaN stays NaN).

    ``exp(x) = 2**k exp(r)``: ``k = round(x / ln 2)``, ``|r| <= ln(2) / 2``, ``exp(r)`` by its Taylor
    polynomial of degree 14 (truncation < 2e-17), ``2**k`` assembled in the exponent bits of ``bits``.
    """
    kb = bits.view(np.int64)
    for i in range(x.shape[0]):
        xi = x[i]
        xi = -708.0 if xi < -708.0 else xi
        xi = 709.0 if xi > 709.0 else xi
        kf = xi * LOG2E + SHIFTER
        bits[i] = kf
        k = kf - SHIFTER
        r = (xi - k * LN2_HI) - k * LN2_LO
        q = 1.0 / 87178291200.0
        out[i] = exp_taylor(q * r + 1.0 / 6227020800.0, r)
    for i in range(x.shape[0]):
        kb[i] = (kb[i] - SHIFTER_BITS + 1023) << 52  # 2**k
    for i in range(x.shape[0]):
        out[i] *= bits[i]


# ``exp_into`` without FMA contraction: each step one IEEE float64 operation, so ``exp_numpy`` computes the same bits
# on every CPU (for kernels with a numpy twin: ``_core.numpy_twin``)
exp_into_exact = numba.njit(cache=True, fastmath=False)(renamed_copy(exp_into.py_func, "_exact"))


def exp_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`exp_into_exact` in numpy (float64), the same operations in the same order: the same bits."""
    xi = np.where(x < -708.0, -708.0, x)
    xi = np.where(xi > 709.0, 709.0, xi)
    kf = xi * LOG2E + SHIFTER
    k = kf - SHIFTER
    r = (xi - k * LN2_HI) - k * LN2_LO
    q = np.full_like(r, 1.0 / 87178291200.0)
    for c in _TAYLOR_F64:
        q = q * r + c
    return q * ((kf.view(np.int64) - SHIFTER_BITS + 1023) << 52).view(np.float64)


_TAYLOR_F64 = tuple(1.0 / math.factorial(n) for n in range(13, 0, -1)) + (1.0,)


@numba.njit(cache=True, fastmath=False)  # explicit: a helper without it inherits its first caller's fastmath
def exp_into_f32(x, out, bits):  # pragma: no cover - compiled
    """``exp_into`` for float32 arrays (``out`` and ``bits`` float32): ``x`` clamped to [-87, 88], ``exp(r)`` by its
    Taylor polynomial of degree 7 (truncation < 6e-9, below float32's rounding), eight lanes to a 256-bit vector.
    No FMA contraction: each step is one IEEE float32 operation, so :func:`exp_f32_numpy` computes the same bits on
    every CPU (the top-label pass's numpy twin)."""
    kb = bits.view(np.int32)
    c7, c6, c5, c4, c3 = TAYLOR_F32
    for i in range(x.shape[0]):
        xi = x[i]
        xi = EXP_MIN_F32 if xi < EXP_MIN_F32 else xi
        xi = EXP_MAX_F32 if xi > EXP_MAX_F32 else xi
        kf = xi * LOG2E_F32 + SHIFTER_F32
        bits[i] = kf
        k = kf - SHIFTER_F32
        r = (xi - k * LN2_HI_F32) - k * LN2_LO_F32
        q = c7 * r + c6
        q = q * r + c5
        q = q * r + c4
        q = q * r + c3
        q = q * r + HALF_F32
        q = q * r + ONE_F32
        out[i] = q * r + ONE_F32
    for i in range(x.shape[0]):
        kb[i] = (kb[i] - SHIFTER_BITS_F32 + 127) << 23  # 2**k
    for i in range(x.shape[0]):
        out[i] *= bits[i]


# ``exp_into_f32`` with FMA contraction, for kernels that fuse their own arithmetic (vector / matrix scaling's float32
# softmax). numba compiles a helper that sets no ``fastmath`` of its own with the flags of the kernel that first calls
# it (``inherit_if_not_set``), and caches it so: the exact helpers say ``fastmath=False``, and the fused use has a copy
exp_into_f32_fused = numba.njit(cache=True, fastmath={"contract"})(renamed_copy(exp_into_f32.py_func, "_fused"))


def exp_f32_numpy(x: np.ndarray) -> np.ndarray:
    """:func:`exp_into_f32` in numpy, the same float32 operations in the same order: the same bits."""
    xi = np.where(x < EXP_MIN_F32, EXP_MIN_F32, x)
    xi = np.where(xi > EXP_MAX_F32, EXP_MAX_F32, xi)
    kf = xi * LOG2E_F32 + SHIFTER_F32
    k = kf - SHIFTER_F32
    r = (xi - k * LN2_HI_F32) - k * LN2_LO_F32
    c7, c6, c5, c4, c3 = TAYLOR_F32
    q = c7 * r + c6
    for c in (c5, c4, c3, HALF_F32, ONE_F32, ONE_F32):
        q = q * r + c
    # 2**k: k + 127 is in [40, 215] for clamped input, so the int32 shift cannot overflow (NaN: any bits, q is NaN)
    scale = ((kf.view(np.int32) - np.int32(SHIFTER_BITS_F32 - 127)) << np.int32(23)).view(np.float32)
    return q * scale


@numba.njit(cache=True, fastmath={"contract"})
def log_into(x, out, bits):  # pragma: no cover - compiled
    """``out[:] = log(x)`` for positive normal ``x`` (error ~1 ulp of the result plus 2e-16 absolute).

    ``x = 2**k m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` read off the bits; ``log m = 2 atanh(s)`` with
    ``s = (m - 1) / (m + 1)``, ``|s| <= 0.172``, by its odd series up to ``s**21`` (truncation < 1e-17).
    """
    xb = x.view(np.int64)
    mb = bits.view(np.int64)
    for i in range(x.shape[0]):
        ix = xb[i] - SQRT_HALF_BITS
        mb[i] = (ix & MANTISSA) + SQRT_HALF_BITS  # m
        out[i] = np.float64(ix >> 52)  # k
    for i in range(x.shape[0]):
        f = bits[i] - 1.0
        s = f / (2.0 + f)
        z = s * s
        q = 1.0 / 21.0
        q = q * z + 1.0 / 19.0
        q = q * z + 1.0 / 17.0
        q = q * z + 1.0 / 15.0
        q = q * z + 1.0 / 13.0
        q = q * z + 1.0 / 11.0
        q = q * z + 1.0 / 9.0
        q = q * z + 1.0 / 7.0
        q = q * z + 1.0 / 5.0
        q = q * z + 1.0 / 3.0
        k = out[i]
        out[i] = k * LN2_HI + (2.0 * s + (2.0 * s * z * q + k * LN2_LO))


@numba.njit(cache=True, fastmath=False)
def max_of(x):  # pragma: no cover - compiled
    """``max(x)`` of a non-empty finite array, in four interleaved lanes: a one-accumulator loop waits on each
    comparison in turn (a max is exact in any order, so the result is the same)."""
    n = x.shape[0]
    m0 = m1 = m2 = m3 = x[0]
    j = 0
    while j + 4 <= n:
        m0 = max(m0, x[j])
        m1 = max(m1, x[j + 1])
        m2 = max(m2, x[j + 2])
        m3 = max(m3, x[j + 3])
        j += 4
    while j < n:
        m0 = max(m0, x[j])
        j += 1
    return max(max(m0, m1), max(m2, m3))


_LIBM_EXP = np.frompyfunc(math.exp, 1, 1)
_LIBM_LOG = np.frompyfunc(math.log, 1, 1)


def libm_exp(x: np.ndarray) -> np.ndarray:
    """libm's ``exp`` of every value, float64: what a kernel's ``math.exp`` computes (numpy's own ``exp`` may be SIMD
    code an ulp away). A Python call a value: for the numpy twins of small inputs."""
    return _LIBM_EXP(x).astype(np.float64)


def libm_log(x: np.ndarray) -> np.ndarray:
    """libm's ``log`` of every value, float64 (as ``libm_exp``)."""
    return _LIBM_LOG(x).astype(np.float64)


def sum_of_rows_numpy(values: np.ndarray) -> np.ndarray:
    """:func:`sum_of` of every row of the (N, K) float64 ``values`` in numpy: the same four lanes, each added in order
    (a reduction over a middle axis runs in order), the tail in the first, then ``(s0 + s1) + (s2 + s3)``: the same
    bits."""
    n, k = values.shape
    lanes = np.add.reduce(values[:, : k - k % 4].reshape(n, k // 4, 4), axis=1, initial=0.0)
    for j in range(k - k % 4, k):
        lanes[:, 0] += values[:, j]
    return (lanes[:, 0] + lanes[:, 1]) + (lanes[:, 2] + lanes[:, 3])


@numba.njit(cache=True, fastmath=False)
def sum_of(x):  # pragma: no cover - compiled
    """``sum(x)`` in four interleaved partial sums, added in a fixed order (so the result does not depend on the
    machine's vector width, as a reassociated sum would): about 1.2x faster per row than one running sum."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    j = 0
    while j + 4 <= n:
        s0 += x[j]
        s1 += x[j + 1]
        s2 += x[j + 2]
        s3 += x[j + 3]
        j += 4
    while j < n:
        s0 += x[j]
        j += 1
    return (s0 + s1) + (s2 + s3)
