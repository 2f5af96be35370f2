"""Fused CPU kernels for applying a calibrator: one pass over the (N, K) logits instead of five.

``Calibrator.forward`` must divide each row by its temperature, refuse non-finite logits, never
overflow, and keep the argmax. In torch that is a top-2 (SMART's margin), a division, a finiteness
reduction and two argmax passes over (N, K) memory. :func:`scale_rows` reads each row from memory
once and does the rest while the row is in cache:

* finiteness (``_finite.row_finite``, exact on every CPU), the top logit and its first
  index (``torch.argmax``'s tie rule), SMART's margin top-1 minus top-2 in float64;
* SMART's temperature ``T(m)`` from the margin, in float64 scalar code: a row's temperature does not
  depend on the batch it comes in (torch's vectorised ``exp``/``log1p`` round their tails differently);
  it agrees with ``SMARTCalibrator.temperature_of_margin`` to ~1e-15 relative;
* ``out = z / T`` correctly rounded (as ``torch.div``), then the argmax guard: division by ``T > 0`` is
  monotone, so the argmax can only move when rounding merges the winner with an earlier entry; then
  the winner is raised by one ulp, as the torch path does.

A non-finite row or one whose ``|z| / T`` overflows the dtype sends the call back to the torch path,
which raises or rescales.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from hf_calibration._core.finite import row_finite
from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, run_threads, serial_twin
from hf_calibration._core.threads import numba_threads

OK, NOT_FINITE, OVERFLOW = 0, 1, 2


# Exact maxima of finite floats as integer maxima, which vectorise where float max reductions do not: the bit
# pattern b of a float, mapped to b ^ ((b >> (w - 1)) & (2**(w-1) - 1)), orders like the float (negative
# floats have their magnitude bits flipped). The map is its own inverse. Only -0.0 < +0.0 differs from the
# float order, handled in _first_max.


@numba.njit(cache=True)
def _key(b, shift, mask):  # pragma: no cover - compiled
    return np.bitwise_xor(b, np.bitwise_and(np.right_shift(b, shift), mask))


@numba.njit(cache=True)
def _max_key(bits, start, stop, init, shift, mask):  # pragma: no cover - compiled
    """Largest key of ``bits[start:stop]`` (``init`` if the range is empty)."""
    m = init
    view = bits[
        start:stop
    ]  # a loop from 0 over a view vectorises; over range(start, stop) it keeps a wrap-around check
    for j in range(view.shape[0]):
        m = np.maximum(m, _key(view[j], shift, mask))
    return m


@numba.njit(cache=True)
def _first_max(row, bits, shift, mask, lowest):  # pragma: no cover - compiled
    """Index of the first largest entry under float equality (torch.argmax's tie rule)."""
    target = _key(_max_key(bits, 0, bits.shape[0], lowest, shift, mask), shift, mask)  # the max's bit pattern
    k = bits.shape[0]
    first = 0
    for start in range(0, k, 64):  # find the 64-block holding it with vectorised counts, then scan that block
        block = bits[start : min(start + 64, k)]
        hits = 0
        for j in range(block.shape[0]):
            hits += block[j] == target
        if hits:
            first = start
            while bits[first] != target:
                first += 1
            break
    if row[first] == 0:  # -0.0 and +0.0 compare equal: an earlier zero of the other sign is the first maximum
        first = 0
        while row[first] != 0:
            first += 1
    return first


@numba.njit(cache=True)
def _margin(row, bits, first, shift, mask, lowest, scratch):  # pragma: no cover - compiled
    """top-1 minus top-2 logit in float64 (0 for tied top logits), as ``torch.topk``'s values give it.

    ``scratch`` is a one-element float array of the row's dtype whose integer view is ``scratch_bits``."""
    k = bits.shape[0]
    second = _max_key(bits, first + 1, k, _max_key(bits, 0, first, lowest, shift, mask), shift, mask)
    scratch[1][0] = _key(second, shift, mask)
    return np.float64(row[first]) - np.float64(scratch[0][0])


@numba.njit(cache=True)
def _smart_temperature(margin, mean, std, w1, b1, w2, b2, eps):  # pragma: no cover - compiled
    """SMART's ``T(m) = softplus(W2 . ReLU(W1 m_hat + b1) + b2) + eps`` for one margin, in float64."""
    if not math.isfinite(margin):
        return np.nan
    m_hat = (margin - mean) / std
    a = b2
    for j in range(w1.shape[0]):
        a += w2[j] * max(w1[j] * m_hat + b1[j], 0.0)
    return max(a, 0.0) + math.log1p(math.exp(-abs(a))) + eps


@parallel_kernel(cache=True)  # no fastmath: finiteness checks, signed zeros and exact division (see _finite)
def _scale_rows(
    z,
    zbits,
    shift,
    mask,
    lowest,
    scratch,
    t_fixed,
    smart,
    mean,
    std,
    w1,
    b1,
    w2,
    b2,
    eps,
    posinf,
    temps,
    out,
    outbits,
    status,
):  # pragma: no cover - compiled
    n, k = z.shape
    for i in numba.prange(n):
        row = z[i]
        if not row_finite(row):
            status[i] = NOT_FINITE
            temps[i] = np.nan  # as topk's NaN margin would give
            continue
        first = _first_max(row, zbits[i], shift, mask, lowest)
        if smart:
            cell = (scratch[0][i : i + 1], scratch[1][i : i + 1])
            temps[i] = _smart_temperature(
                _margin(row, zbits[i], first, shift, mask, lowest, cell), mean, std, w1, b1, w2, b2, eps
            )
        else:
            temps[i] = t_fixed  # cast to z's dtype
        t = temps[i]
        dst = out[i]
        for j in range(k):  # correctly rounded division, as torch's
            dst[j] = row[j] / t
        if not row_finite(dst):  # |z| / T beyond the dtype: the caller rescales
            status[i] = OVERFLOW
            continue
        status[i] = OK
        if first > 0:  # rounding merged the winner with an earlier entry: raise the winner by one ulp
            merged = _max_key(outbits[i], 0, first, lowest, shift, mask) >= _key(outbits[i][first], shift, mask)
            if not merged and dst[first] == 0:  # -0.0 == +0.0 although their keys differ
                for j in range(first):
                    merged = merged or dst[j] == 0
            if merged:
                dst[first] = np.nextafter(dst[first], posinf[0])


def supports(z: torch.Tensor) -> bool:
    """Whether the fused kernels can serve ``z``: a CPU float32/float64 tensor that needs no gradient."""
    return (
        z.device.type == "cpu"
        and z.dtype in (torch.float32, torch.float64)
        and not (z.requires_grad and torch.is_grad_enabled())
        and z.shape[0] > 0
    )


PARALLEL_MIN_SIZE = 1 << 18  # logits; below this a parallel region's start-up costs more than it saves


def _run_kernel(fn, zn, *args):
    """Run a kernel on ``zn``: one numba thread for small inputs (a pipeline's few rows), all for large ones (or the
    kernel's serial twin: ``_core.parallel.run_threads``)."""
    threads = 1 if zn.size < PARALLEL_MIN_SIZE else numba_threads()
    return run_threads(fn, threads, zn.size, zn, *args)


_NO_MLP = np.zeros(0)


def _mlp_args(smart_mlp):
    """(smart, mean, std, w1, b1, w2, b2, eps) for the kernels; ``smart_mlp`` is None for a fixed temperature."""
    if smart_mlp is None:
        return False, 0.0, 1.0, _NO_MLP, _NO_MLP, _NO_MLP, 0.0, 0.0
    mean, std, w1, b1, w2, b2, eps = smart_mlp
    return True, float(mean), float(std), w1, b1, w2, float(b2), float(eps)


def _bits(zn: np.ndarray):
    """(integer view, shift, mask, lowest key) for a float32 / float64 array."""
    itype = np.int32 if zn.dtype == np.float32 else np.int64
    width = 8 * zn.itemsize
    return zn.view(itype), itype(width - 1), itype(2 ** (width - 1) - 1), itype(-(2 ** (width - 1)))


def _scratch(n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    cells = np.empty(n, dtype=dtype)
    return cells, cells.view(np.int32 if cells.dtype == np.float32 else np.int64)


def _scale(
    z: torch.Tensor, temperature: float | None, smart_mlp, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z / T, T, status)`` as numpy, T in ``z``'s dtype; rows with status != 0 are not divided. ``out``: a contiguous
    array of ``z``'s shape and dtype to write ``z / T`` into (default: a new one)."""
    zn = z.detach().contiguous().numpy()
    n = zn.shape[0]
    temps = np.empty(n, dtype=zn.dtype)
    if out is None:
        out = np.empty_like(
            zn
        )  # numpy asks the kernel for huge pages on large arrays: fewer page faults than torch.empty
    status = np.empty(n, dtype=np.int8)
    t_fixed = 1.0 if temperature is None else float(temperature)
    scratch = _scratch(n if smart_mlp is not None else 1, zn.dtype)
    args = (
        *_bits(zn),
        scratch,
        t_fixed,
        *_mlp_args(smart_mlp),
        np.full(1, np.inf, dtype=zn.dtype),
        temps,
        out,
        _bits(out)[0],
    )
    _run_kernel(_scale_rows, zn, *args, status)
    return out, temps, status


def _twin_scale(z: torch.Tensor, temperature: float | None, out: torch.Tensor | None) -> torch.Tensor | None:
    """``scale_rows`` for one temperature in torch: the kernel's own operations, so the same bits; None where the
    kernel returns None."""
    if not bool(torch.isfinite(z).all()):
        return None
    return divide_rows(z, torch.tensor(1.0 if temperature is None else temperature, dtype=z.dtype), out)


def divide_rows(z: torch.Tensor, temperature: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor | None:
    """``z / T`` for finite ``z`` and ``T`` in ``z``'s dtype (a scalar, or (N, 1)), as the kernel divides: ``torch.div``
    rounds correctly, and a winner that rounding merged with an earlier entry goes one ulp up; None if a row
    overflows (the kernel's answer too)."""
    result = torch.div(z, temperature, out=out)
    if not bool(torch.isfinite(result).all()):
        return None
    top = z.argmax(dim=1)
    moved = (result.argmax(dim=1) != top).nonzero()[:, 0]
    if moved.numel():  # rounding merged the winner with an earlier entry (-0.0 == +0.0 included): one ulp up
        winners = result[moved, top[moved]]
        result[moved, top[moved]] = torch.nextafter(winners, torch.full_like(winners, float("inf")))
    return result


_TWIN = NumpyTwin(_scale_rows, serial_twin(_scale_rows), compile_seconds=0.9, seconds_per_value=1e-8)


def scale_rows(
    z: torch.Tensor, temperature: float | None = None, smart_mlp=None, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``z / T`` in one pass (T fixed, or SMART's ``T(m)`` when ``smart_mlp`` is given); None if a row is non-finite
    or would overflow, for the torch path to raise or rescale.

    ``smart_mlp`` = ``(margin_mean, margin_std, W1 (H,), b1 (H,), W2 (H,), b2, eps)``, float64 numpy. ``out``: a
    contiguous CPU tensor of ``z``'s shape and dtype, written and returned (a forward's block of its output).
    """
    if smart_mlp is None and _TWIN.use(z.numel()):
        return _TWIN.run(_twin_scale, z, temperature, out)
    result, _, status = _scale(z, temperature, smart_mlp, None if out is None else out.numpy())
    if status.any():
        return None
    return out if out is not None else torch.from_numpy(result)


def temperatures(z: torch.Tensor, smart_mlp) -> torch.Tensor:
    """SMART's per-row temperatures (N,) in ``z``'s dtype, as :func:`scale_rows` divides by them (NaN for
    non-finite rows). Computed by the same kernel, so the division is done and dropped: not a hot path."""
    return torch.from_numpy(_scale(z, None, smart_mlp)[1])
