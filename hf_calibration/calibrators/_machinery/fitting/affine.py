"""The model vector, matrix and Dirichlet scaling share: ``softmax(W f + b)`` of fixed features ``f``, fitted by NLL.

Parameters travel as one flat float64 vector: ``[W.flatten() (K * K, row-major), b (K)]`` for a full matrix, or
``[w (K), b (K)]`` for vector scaling's diagonal ``W = diag(w)``.

The NLL is badly scaled from the identity start: each class's slope and bias move together (the features have
a large common offset), and curvatures differ by orders of magnitude between classes (LBFGS took ~500
iterations on a CIFAR-100 DenseNet's logits). ``affine_preconditioner`` rescales the problem with the
Gauss-Newton curvature at the current point, ``v_ij = p_ij (1 - p_ij)``: an exact 2 x 2 block for each class's
(diagonal weight, bias) pair and the exact diagonal for the off-diagonal weights, penalty curvature included
(3-4x fewer iterations).

For a full matrix an evaluation is two N x K x K products around one compiled pass over the rows (the softmax,
the NLL and ``P - Y``, in float64). ``AffineNLL(..., products=torch.float32)`` runs the two products in float32,
twice as fast; the NLL and every sum stay float64, so the objective moves by float32 rounding of the scores
(~1e-7 relative), and a fit that needs more than that finishes on the float64 objective.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
import torch

from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, run_pass, serial_twin
from hf_calibration._core.threads import ThreadCountChooser, numba_threads, torch_single_threaded
from hf_calibration._core.vmath import exp_into, exp_into_f32_fused, max_of, sum_of
from hf_calibration.calibrators._machinery.fitting.lbfgs import LBFGSResult, Preconditioner, QuadraticPenalty, minimize

CHUNK = 256  # rows per parallel task of the vector-scaling kernel: fixed, so its sums do not depend on the threads
DIAGONAL_TASK_VALUES = 1 << 19  # values per parallel task of the block kernel (a block holds 2**22): depends on K only
# values from which a block pass takes seconds: its threads follow the load (``_parallel.run_pass``); the timed choice
# ran its first one or two passes on one thread to compare
LONG_PASS_VALUES = 1 << 28


@numba.njit(cache=True, fastmath={"contract"})
def _row_softmax(row, w, b, s, e, bits):  # pragma: no cover - compiled
    """``s = w * row + b - max``, ``e = exp(s)`` (in the given buffers); returns ``sum(e)``: softmax = e / sum."""
    for j in range(row.shape[0]):
        s[j] = w[j] * np.float64(row[j]) + b[j]
    top = max_of(s)
    for j in range(row.shape[0]):
        s[j] -= top
    exp_into(s, e, bits)
    return sum_of(e)


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _diagonal_nll_grad(z, labels, w, b, with_grad):  # pragma: no cover - compiled
    """Mean NLL of ``softmax(w * z_i + b)`` and its gradient ``[d/dw (K), d/db (K)]`` in one pass over the rows.

    Fixed chunks of rows in parallel, partial sums added in chunk order: the result does not depend on the
    number of threads. ``exp`` is ``_vmath``'s vectorised one.
    """
    n, k = z.shape
    n_chunks = (n + CHUNK - 1) // CHUNK
    part_loss = np.zeros(n_chunks)
    part_grad = np.zeros((n_chunks, 2 * k))
    for c in numba.prange(n_chunks):
        s = np.empty(k)
        e = np.empty(k)
        bits = np.empty(k)
        grad = part_grad[c]
        loss = 0.0
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            row = z[i]
            total = _row_softmax(row, w, b, s, e, bits)
            y = labels[i]
            loss += math.log(total) - s[y]
            if with_grad:
                inv = 1.0 / total
                for j in range(k):
                    g = e[j] * inv
                    grad[j] += g * np.float64(row[j])
                    grad[k + j] += g
                grad[y] -= np.float64(row[y])
                grad[k + y] -= 1.0
        part_loss[c] = loss
    return part_loss.sum() / n, _sum_chunks(part_grad) / n


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _diagonal_curvature(z, w, b):  # pragma: no cover - compiled
    """Per class j, for ``p = softmax(w * z_i + b)`` and ``v = p (1 - p)``: ``(sum_i v_ij z_ij^2, sum_i v_ij z_ij,
    sum_i v_ij)``, shape (3, K); fixed chunks summed in order (thread-count independent)."""
    n, k = z.shape
    n_chunks = (n + CHUNK - 1) // CHUNK
    part = np.zeros((n_chunks, 3, k))
    for c in numba.prange(n_chunks):
        s = np.empty(k)
        e = np.empty(k)
        bits = np.empty(k)
        acc = part[c]
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            row = z[i]
            total = _row_softmax(row, w, b, s, e, bits)
            inv = 1.0 / total
            for j in range(k):
                p = e[j] * inv
                v = p * (1.0 - p)
                f = np.float64(row[j])
                acc[0, j] += v * f * f
                acc[1, j] += v * f
                acc[2, j] += v
    return _sum_chunks(part.reshape(n_chunks, 3 * k)).reshape(3, k)


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _softmax_residual(s, labels, with_grad):  # pragma: no cover - compiled
    """Mean NLL of ``softmax(s_i)`` for the scores ``s`` (N, K; float32 or float64, the softmax in float64) and,
    with ``with_grad``, ``s`` overwritten in place by ``P - Y``, with its column sums ``sum_i (p_i - y_i)`` returned.

    One pass over the rows (torch's logsumexp, exp and gather took four); fixed chunks summed in order, so the
    result does not depend on the number of threads.
    """
    n, k = s.shape
    n_chunks = (n + CHUNK - 1) // CHUNK
    part_loss = np.zeros(n_chunks)
    part_sum = np.zeros((n_chunks, k))
    ones, zeros = np.ones(k), np.zeros(k)
    for c in numba.prange(n_chunks):
        shifted, e, bits = np.empty(k), np.empty(k), np.empty(k)
        acc = part_sum[c]
        loss = 0.0
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            row = s[i]
            total = _row_softmax(row, ones, zeros, shifted, e, bits)
            y = labels[i]
            loss += math.log(total) - shifted[y]
            if with_grad:
                inv = 1.0 / total
                for j in range(k):
                    p = e[j] * inv
                    row[j] = p
                    acc[j] += p
                row[y] -= 1.0
                acc[y] -= 1.0
        part_loss[c] = loss
    return part_loss.sum() / n, _sum_chunks(part_sum)


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _softmax_residual_f32(s, labels, with_grad):  # pragma: no cover - compiled
    """``_softmax_residual`` with the softmax in float32 (``s`` float32): the row max, ``exp`` and the row sum in float32,
    eight lanes to a vector (2x faster), each row's NLL and the column sums of ``P - Y`` added in float64. The NLL
    moves by float32 rounding (~1e-7 relative), as the float32 products already make it; fixed chunks summed in
    order, so the result does not depend on the number of threads."""
    n, k = s.shape
    n_chunks = (n + CHUNK - 1) // CHUNK
    part_loss = np.zeros(n_chunks)
    part_sum = np.zeros((n_chunks, k))
    for c in numba.prange(n_chunks):
        shifted, e, bits = np.empty(k, np.float32), np.empty(k, np.float32), np.empty(k, np.float32)
        acc = part_sum[c]
        loss = 0.0
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            row = s[i]
            top = max_of(row)
            for j in range(k):
                shifted[j] = row[j] - top
            exp_into_f32_fused(shifted, e, bits)
            total = sum_of(e)
            y = labels[i]
            loss += math.log(total) - np.float64(shifted[y])
            if with_grad:
                inv = np.float32(1.0 / total)
                for j in range(k):
                    p = e[j] * inv
                    row[j] = p
                    acc[j] += p
                row[y] -= np.float32(1.0)
                acc[y] -= 1.0
        part_loss[c] = loss
    return part_loss.sum() / n, _sum_chunks(part_sum)


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _softmax_curvature(s, f):  # pragma: no cover - compiled
    """For the scores ``s`` (N, K) and features ``f`` (N, K): ``s`` overwritten in place by ``v = p (1 - p)``,
    ``p = softmax(s_i)``, and ``(sum_i v_ij f_ij, sum_i v_ij)`` returned, shape (2, K), fixed chunks in order."""
    n, k = s.shape
    n_chunks = (n + CHUNK - 1) // CHUNK
    part = np.zeros((n_chunks, 2 * k))
    ones, zeros = np.ones(k), np.zeros(k)
    for c in numba.prange(n_chunks):
        shifted, e, bits = np.empty(k), np.empty(k), np.empty(k)
        acc = part[c]
        for i in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            row = s[i]
            inv = 1.0 / _row_softmax(row, ones, zeros, shifted, e, bits)
            for j in range(k):
                p = e[j] * inv
                v = p * (1.0 - p)
                row[j] = v
                acc[j] += v * np.float64(f[i, j])
                acc[k + j] += v
    return _sum_chunks(part).reshape(2, k)


@numba.njit(cache=True)
def _sum_chunks(part):  # pragma: no cover - compiled
    """``part.sum(0)`` in chunk order (numba's reduction order is its own)."""
    out = np.zeros(part.shape[1])
    for c in range(part.shape[0]):
        for j in range(part.shape[1]):
            out[j] += part[c, j]
    return out


@numba.njit(cache=True, fastmath={"contract"})
def _shifted_row_softmax(row, m, w, b, s, e, bits):  # pragma: no cover - compiled
    """``_row_softmax`` of ``row - m`` (subtracted in the row's dtype, as numpy subtracts a row's max)."""
    for j in range(row.shape[0]):
        s[j] = w[j] * np.float64(row[j] - m) + b[j]
    top = max_of(s)
    for j in range(row.shape[0]):
        s[j] -= top
    exp_into(s, e, bits)
    return sum_of(e)


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _diagonal_block(z, labels, w, b, with_grad, with_curvature, rows_per_chunk, shift):  # pragma: no cover - compiled
    """For one block of rows: the NLL sum of ``softmax(w * f_i + b)``, with ``with_grad`` its gradient sums
    ``[d/dw (K), d/db (K)]``, with ``with_curvature`` the Gauss-Newton sums of ``_diagonal_curvature`` (3, K). Chunks of
    ``rows_per_chunk`` rows in parallel, added in chunk order (the same sums for any number of threads). ``f_i = z_i``,
    or with ``shift`` ``z_i - max z_i`` (in ``z``'s dtype: the same features a block shifted beforehand holds)."""
    n, k = z.shape
    n_chunks = (n + rows_per_chunk - 1) // rows_per_chunk
    part_loss = np.zeros(n_chunks)
    part_grad = np.zeros((n_chunks, 2 * k if with_grad else 0))
    part_curv = np.zeros((n_chunks, 3, k if with_curvature else 0))
    for c in numba.prange(n_chunks):
        s = np.empty(k)
        e = np.empty(k)
        bits = np.empty(k)
        grad = part_grad[c]
        curv = part_curv[c]
        loss = 0.0
        for i in range(c * rows_per_chunk, min(n, (c + 1) * rows_per_chunk)):
            row = z[i]
            m = max_of(row) if shift else row[0] - row[0]  # finite rows: 0 in the row's dtype
            total = _shifted_row_softmax(row, m, w, b, s, e, bits)
            y = labels[i]
            loss += math.log(total) - s[y]
            inv = 1.0 / total
            if with_grad:
                for j in range(k):
                    g = e[j] * inv
                    grad[j] += g * np.float64(row[j] - m)
                    grad[k + j] += g
                grad[y] -= np.float64(row[y] - m)
                grad[k + y] -= 1.0
            if with_curvature:
                for j in range(k):
                    p = e[j] * inv
                    v = p * (1.0 - p)
                    f = np.float64(row[j] - m)
                    curv[0, j] += v * f * f
                    curv[1, j] += v * f
                    curv[2, j] += v
        part_loss[c] = loss
    loss = 0.0
    grad_out = np.zeros(2 * k if with_grad else 0)
    curv_out = np.zeros((3, k if with_curvature else 0))
    for c in range(n_chunks):
        loss += part_loss[c]
        for j in range(grad_out.shape[0]):
            grad_out[j] += part_grad[c, j]
        for r in range(3):
            for j in range(curv_out.shape[1]):
                curv_out[r, j] += part_curv[c, r, j]
    return loss, grad_out, curv_out


@parallel_kernel(cache=True)  # no fastmath: no fused multiply-add, so rounded as the forward's tensor ops
def diagonal_map(z, w, b, centre, out):  # pragma: no cover - compiled
    """``out = f * w + b`` row by row in ``z``'s dtype, ``f = z - max z`` with ``centre`` (vector scaling) else ``z`` (SVS's
    features): the forward's arithmetic, bit for bit, in one pass into one buffer (the fit-set reports use it)."""
    for i in numba.prange(z.shape[0]):
        m = max_of(z[i]) if centre else z[i, 0] - z[i, 0]
        for j in range(z.shape[1]):
            out[i, j] = (z[i, j] - m) * w[j] + b[j]


# ---------------------------------------------------------------------------------------------- the numpy twins
# What a fit runs before its kernels' compile has paid for itself (``_core.numpy_twin``). These kernels fuse
# multiply-adds (``contract``: 27 % faster at 20,000 x 1,000, which the 50,000 x 21,843 fits need), which numpy cannot
# reproduce, so a twin agrees with its kernel to rounding (~1e-15 relative in the objective), not bit for bit; a fit
# therefore decides once, when it starts, and runs every pass on one side (``FIT_PASSES`` passes estimated).
FIT_PASSES = 40  # objective evaluations of a typical vector scaling / SVS / SMS fit, for the twin's estimate


def _twin_diagonal_block(z, labels, w, b, with_grad, with_curvature, shift):
    """``_diagonal_block`` in numpy (to rounding)."""
    n, k = z.shape
    f = (z - z.max(axis=1, keepdims=True) if shift else z).astype(np.float64)  # shifted in z's dtype, as the kernel
    s = w * f + b
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    total = e.sum(axis=1)
    rows = np.arange(n)
    loss = float((np.log(total) - s[rows, labels]).sum())
    p = e / total[:, None]
    grad = np.zeros(2 * k if with_grad else 0)
    if with_grad:
        grad[:k] = (p * f).sum(axis=0) - np.bincount(labels, weights=f[rows, labels], minlength=k)
        grad[k:] = p.sum(axis=0) - np.bincount(labels, minlength=k)
    curv = np.zeros((3, k if with_curvature else 0))
    if with_curvature:
        v = p * (1.0 - p)
        curv[0], curv[1], curv[2] = (v * f * f).sum(axis=0), (v * f).sum(axis=0), v.sum(axis=0)
    return loss, grad, curv


def _twin_softmax(s: np.ndarray, labels: np.ndarray):
    """``(p, summed NLL)`` of ``softmax(s_i)`` in float64."""
    x = s.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    e = np.exp(x)
    total = e.sum(axis=1)
    return e / total[:, None], float((np.log(total) - x[np.arange(s.shape[0]), labels]).sum())


def _twin_softmax_residual(s, labels, with_grad):
    """``_softmax_residual`` (and its float32 form) in numpy, float64 (to rounding): ``s`` becomes ``P - Y``."""
    n, k = s.shape
    p, loss = _twin_softmax(s, labels)
    if not with_grad:
        return loss / n, np.zeros(k)
    p[np.arange(n), labels] -= 1.0
    s[...] = p
    return loss / n, p.sum(axis=0)


def _twin_softmax_curvature(s, f):
    """``_softmax_curvature`` in numpy (to rounding): ``s`` becomes ``v = p (1 - p)``."""
    p, _ = _twin_softmax(s, np.zeros(s.shape[0], np.int64))
    v = p * (1.0 - p)
    s[...] = v
    return np.stack([(v * f).sum(axis=0), v.sum(axis=0)])


def _twin_blocks_solve(factor, vec, reverse):
    """``_blocks_solve`` by torch's batched triangular solve, float64 (to rounding)."""
    k = factor.shape[0]
    t = np.concatenate([vec[: k * k].reshape(k, k), vec[k * k :].reshape(k, 1)], axis=1)  # [W_j., b_j] per class
    if reverse:
        t = t[:, ::-1]
    lower = torch.from_numpy(np.ascontiguousarray(factor, dtype=np.float64)).transpose(1, 2)
    h = torch.linalg.solve_triangular(lower, torch.from_numpy(np.ascontiguousarray(t))[:, :, None], upper=False)
    h = h[:, :, 0].numpy()
    if reverse:
        h = h[:, ::-1]
    return np.concatenate([h[:, :k].reshape(-1), h[:, k]])


_BLOCK_TWIN = NumpyTwin(_diagonal_block, compile_seconds=3.5, seconds_per_value=5e-8)
_MATRIX_TWIN = NumpyTwin(
    _softmax_residual, _softmax_residual_f32, _softmax_curvature, compile_seconds=4.5, seconds_per_value=3e-8
)


_MAP_TWIN = NumpyTwin(diagonal_map, serial_twin(diagonal_map), compile_seconds=0.2, seconds_per_value=1e-8)


def _twin_diagonal_map(z, w, b, centre, out):
    """``diagonal_map`` in numpy: the same operations in ``z``'s dtype (no fused multiply-add there), so the same bits."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the caller's to see, as from the kernel
        out[...] = ((z - z.max(axis=1, keepdims=True)) if centre else z) * w + b


def map_diagonal(z: np.ndarray, w: np.ndarray, b: np.ndarray, centre: bool, out: np.ndarray) -> None:
    """``out = f * w + b`` (``diagonal_map``; ``w``, ``b`` in ``z``'s dtype): the kernel on the threads the load
    leaves, or its numpy twin."""
    if _MAP_TWIN.use(z.size):
        _MAP_TWIN.run(_twin_diagonal_map, z, w, b, centre, out)
    else:
        run_pass(diagonal_map, z.size, z, w, b, centre, out)


class BlockDiagonalNLL:
    """``AffineNLL(diagonal=True)`` over rows read in blocks (``_rows.FitRows`` or any object with ``shape`` and
    ``blocks()``): the mean NLL of ``softmax(w * f_i + b)``, its gradient and its Gauss-Newton curvature, each one pass
    over the blocks, summed in block order (so a fit from disk equals the fit in memory). Vector scaling and SVS fit
    through it: no (N, K) copy of their features beyond what the rows hold. ``shift``: the features are each row less
    its maximum, subtracted in the pass (vector scaling on rows read as stored: no shifted copy of them).

    A block's partial sums are (tasks, 3K) float64: tasks of ``DIAGONAL_TASK_VALUES`` values, about 8 a block (64 tasks
    of 3 rows held 33 MB at K = 21,843: the fit's whole overhead above its features)."""

    diagonal = True

    def __init__(self, rows, labels: np.ndarray, *, shift: bool = False):
        self.rows, self._y = rows, np.ascontiguousarray(labels, dtype=np.int64)
        self.n, self.k = rows.shape
        self._chunk = max(1, DIAGONAL_TASK_VALUES // self.k)
        self._shift = shift
        self._chooser = ThreadCountChooser(self._pass, backend="numba")
        self._twin = _BLOCK_TWIN.use(self.n * self.k * FIT_PASSES)  # the whole fit on one side (see FIT_PASSES)

    def _step(self, *args):
        """One pass: on the threads the load average leaves when it takes seconds (as any long pass), else on the count
        ``ThreadCountChooser`` times (milliseconds a pass, many of them); or the numpy twin's."""
        if self._twin:
            return _BLOCK_TWIN.run(self._pass, *args, twin=True)
        if self.n * self.k >= LONG_PASS_VALUES:
            return run_pass(self._pass, self.n * self.k, *args)
        return self._chooser(*args)

    def _pass(self, w: np.ndarray, b: np.ndarray, with_grad: bool, with_curvature: bool, twin: bool = False):
        loss, grad, curv = 0.0, np.zeros(2 * self.k if with_grad else 0), np.zeros((3, self.k if with_curvature else 0))
        for start, block in self.rows.blocks():
            labels = self._y[start : start + block.shape[0]]
            if twin:
                part = _twin_diagonal_block(block, labels, w, b, with_grad, with_curvature, self._shift)
            else:
                part = _diagonal_block(block, labels, w, b, with_grad, with_curvature, self._chunk, self._shift)
            loss += part[0]
            grad += part[1]
            curv += part[2]
        return loss / self.n, grad / self.n, curv / self.n

    def value_and_grad(self, x: torch.Tensor, with_grad: bool = True) -> tuple[float, torch.Tensor | None]:
        k = self.k
        value, grad, _ = self._step(x[:k].numpy(), x[k:].numpy(), with_grad, False)
        return float(value), (torch.from_numpy(grad) if with_grad else None)

    def curvature(self, x: torch.Tensor) -> AffineCurvature:
        k = self.k
        _, _, sums = self._step(x[:k].detach().numpy(), x[k:].detach().numpy(), False, True)
        sums = torch.from_numpy(sums)
        return AffineCurvature(sums[0], sums[1], sums[2], None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _NLLWithGradient.apply(x, self)
        return torch.tensor(self.value_and_grad(x.detach(), with_grad=False)[0], dtype=torch.float64)


class _NLLWithGradient(torch.autograd.Function):
    """Autograd node for an objective that computes its own gradient (no graph over the (N, K) intermediates)."""

    @staticmethod
    def forward(ctx, x, model):
        value, grad = model.value_and_grad(x.detach())
        ctx.save_for_backward(grad)
        return torch.tensor(value, dtype=torch.float64)

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None


class AffineNLL:
    """``x -> mean NLL of softmax(W f_i + b)`` over fixed features ``F`` (N, K) and labels (N,), with its gradient.

    The gradient is written out (``(P - Y)^T F / N`` and ``sum_i (p_i - y_i) / N``) rather than traced by
    autograd: one GEMM each way for a full matrix (in ``products``' dtype), one fused compiled pass for vector scaling.
    """

    def __init__(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        diagonal: bool = False,
        products: torch.dtype = torch.float64,
        softmax: torch.dtype = torch.float64,
    ):
        self.features, self.labels, self.k, self.diagonal = features, labels.long(), features.shape[1], diagonal
        self._z, self._y = features.numpy(), self.labels.numpy()
        if products not in (torch.float32, torch.float64):
            raise ValueError(
                f"Expected argument `products` to be torch.float32 or torch.float64, but got {products!r}."
            )
        if softmax not in (torch.float32, torch.float64) or (softmax == torch.float32 and products != torch.float32):
            raise ValueError(
                f"Expected argument `softmax` to be torch.float64, or torch.float32 with float32 `products`, but got {softmax!r}."
            )
        self.products = products  # the dtype of the full matrix's two products
        self._residual = _softmax_residual_f32 if softmax == torch.float32 else _softmax_residual  # its softmax pass
        self.twin = not diagonal and _MATRIX_TWIN.use(features.numel() * FIT_PASSES)  # the whole fit on one side
        # the full matrix's product operand (vector scaling's kernel reads float32 or float64 features as they are)
        self._f = features if diagonal or products == features.dtype else features.to(products)
        self._f_squared: torch.Tensor | None = None
        # the thread count of the heavy step is chosen by timing (_threads.py): a busy machine must not stall it
        self._step = ThreadCountChooser(self._value_and_grad, backend="numba" if diagonal else "torch")

    @staticmethod
    def _on_torch_threads(kernel, *args):
        """Run a compiled kernel on (at most) the threads torch has now: inside the step, the count chosen for it."""
        before = numba_threads()
        numba.set_num_threads(min(torch.get_num_threads(), before))
        try:
            return kernel(*args)
        finally:
            numba.set_num_threads(before)

    def features_squared(self) -> torch.Tensor:
        """``F * F`` (for the preconditioner), computed once."""
        if self._f_squared is None:
            self._f_squared = self.features * self.features
        return self._f_squared

    def logits(self, x: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        f = self.features if features is None else features
        k = self.k
        if self.diagonal:
            return f * x[:k] + x[k:]
        return torch.addmm(x[k * k :], f, x[: k * k].view(k, k).t())

    def value_and_grad(self, x: torch.Tensor, with_grad: bool = True) -> tuple[float, torch.Tensor | None]:
        """The NLL at ``x`` and (``with_grad``) its gradient."""
        return self._step(x, with_grad)

    def _value_and_grad(self, x: torch.Tensor, with_grad: bool) -> tuple[float, torch.Tensor | None]:
        k, n = self.k, self.features.shape[0]
        if self.diagonal:
            value, grad = _diagonal_nll_grad(self._z, self._y, x[:k].numpy(), x[k:].numpy(), with_grad)
            return float(value), (torch.from_numpy(grad) if with_grad else None)
        w, b = x[: k * k].view(k, k), x[k * k :]
        s = torch.addmm(b.to(self.products), self._f, w.t().to(self.products))
        if self.twin:
            value, column_sums = _MATRIX_TWIN.run(_twin_softmax_residual, s.numpy(), self._y, with_grad)
        else:  # s becomes P - Y
            value, column_sums = self._on_torch_threads(self._residual, s.numpy(), self._y, with_grad)
        if not with_grad:
            return float(value), None
        grad_w = (s.t() @ self._f).to(torch.float64).reshape(-1)
        return float(value), torch.cat([grad_w, torch.from_numpy(column_sums)]) / n

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return _NLLWithGradient.apply(x, self)
        return torch.tensor(self.value_and_grad(x.detach(), with_grad=False)[0], dtype=torch.float64)


def identity_parameters(k: int, diagonal: bool = False) -> torch.Tensor:
    """The parameters of the map that leaves its input unchanged: ``W = I``, ``b = 0``."""
    w = torch.ones(k, dtype=torch.float64) if diagonal else torch.eye(k, dtype=torch.float64).reshape(-1)
    return torch.cat([w, torch.zeros(k, dtype=torch.float64)])


def _floor(h: torch.Tensor) -> torch.Tensor:
    """Keep curvatures positive: at least 1e-6 of the median (a class no sample weighs on is still scaled sanely)."""
    return h.clamp_min(max(float(h.median()) * 1e-6, 1e-300))


BLOCKS_MAX_K = 256  # per-class curvature blocks up to this K: K (K + 1)^2 float64 (0.5 GB at 256), ~K^3 N to build


class AffineCurvature(NamedTuple):
    """The NLL's Gauss-Newton curvature at a point, ``v_ij = p_ij (1 - p_ij)``, summed over the rows and divided by N.

    Diagonal form: per class j, its own weight's ``sum_i v_ij f_ij^2`` (``own``), its cross term with its bias
    ``sum_i v_ij f_ij`` (``cross``) and its bias's ``sum_i v_ij`` (``bias``); for a full matrix, every weight's
    ``sum_i v_ij f_im^2`` (``weights``, (K, K), None for vector scaling). Block form (a full matrix, ``blocks``): per
    class j, the whole (K + 1) x (K + 1) block ``sum_i v_ij g_i g_i^T`` of its row of weights and its bias,
    ``g_i = [f_i, 1]`` (the diagonal form's fields are then None). The penalty's curvature is added when the change of
    variables is built, so one curvature serves every penalty strength."""

    own: torch.Tensor | None
    cross: torch.Tensor | None
    bias: torch.Tensor | None
    weights: torch.Tensor | None
    blocks: torch.Tensor | None = None


def _class_blocks(features: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``M_j = sum_i v_ij g_i g_i^T / N`` for every class j, ``g_i = [f_i, 1]``: (K, K + 1, K + 1), float64. A class's
    block sums only the rows where its ``v`` is above 1e-4 of the largest (the others add < 1e-4 each; half the rows
    at K = 100), in float32 (a preconditioner need not be exact)."""
    n, k = features.shape
    g = torch.cat([features, torch.ones(n, 1, dtype=features.dtype)], 1).float()
    blocks = torch.empty(k, k + 1, k + 1, dtype=torch.float32)
    keep = v > 1e-4 * float(v.max())
    weights = v.float()
    for j in range(k):
        rows = keep[:, j].nonzero().squeeze(1)
        gj = g[rows]
        torch.mm((gj * weights[rows, j : j + 1]).t(), gj, out=blocks[j])
    return blocks.double() / n


def affine_curvature(nll: AffineNLL, x: torch.Tensor, blocks: bool = False) -> AffineCurvature:
    """The data part of the preconditioner at ``x``: one compiled pass for vector scaling; for a full matrix one
    product for the scores, one compiled pass for ``v``, then one product for the weights' curvature, or with
    ``blocks`` (K <= ``BLOCKS_MAX_K``) the per-class blocks, which also see how the inputs correlate (3-6x fewer LBFGS
    evaluations for a weakly regularised fit). In float64 whatever the objective's products: in float32 the ``v`` of
    a sample fitted to 1e-40 underflow to 0."""
    if hasattr(nll, "curvature"):  # rows read in blocks: its own pass
        return nll.curvature(x)
    k, n = nll.k, nll.features.shape[0]
    with torch.no_grad():
        if nll.diagonal:  # one compiled pass (the torch version, five (N, K) passes, took half of a K = 1,000 fit)
            sums = torch.from_numpy(ThreadCountChooser(_diagonal_curvature)(nll._z, x[:k].numpy(), x[k:].numpy())) / n
            return AffineCurvature(sums[0], sums[1], sums[2], None)
        v = nll.logits(x)
        if nll.twin:
            sums = torch.from_numpy(_MATRIX_TWIN.run(_twin_softmax_curvature, v.numpy(), nll._z)) / n
        else:
            sums = torch.from_numpy(nll._on_torch_threads(_softmax_curvature, v.numpy(), nll._z)) / n
        if blocks and k <= BLOCKS_MAX_K:
            return AffineCurvature(None, None, None, None, _class_blocks(nll.features, v))
        weights = (v.t() @ nll.features_squared()) / n  # (class j, input m): sum_i v_ij f_im^2 / N
        return AffineCurvature(torch.diagonal(weights).clone(), sums[0], sums[1], weights)


@numba.njit(cache=True, fastmath={"contract"})
def _blocks_solve(factor, vec, reverse):  # pragma: no cover - compiled
    """For each class j, its parameters ``t = [W_j. (K), b_j]`` of the flat ``vec = [W (K * K), b (K)]``, solved by
    the upper-triangular ``factor[j]`` ((K, K + 1, K + 1)) transposed: ``F^T h = t``, first unknown first, each step an
    axpy with the rest of a row of ``F`` (so it vectorises); ``reverse`` reads and writes ``t`` last coordinate first.
    With ``F = U`` that is ``U^-T t``; with ``F`` = the lower factor ``L = U^T`` flipped on both axes and ``reverse``, it
    is ``U^-1 t`` (a back substitution written as a forward one: run backwards, the same loop was 2x slower). The sums
    are float64 whatever the factor's dtype."""
    k = factor.shape[0]
    out = np.empty(vec.shape[0])
    for j in range(k):
        t = np.empty(k + 1)
        for m in range(k):
            t[k - m if reverse else m] = vec[j * k + m]
        t[0 if reverse else k] = vec[k * k + j]
        for c in range(k + 1):
            row = factor[j, c, c + 1 :]
            h = t[c] / np.float64(factor[j, c, c])
            t[c] = h
            tail = t[c + 1 :]
            for r in range(tail.shape[0]):
                tail[r] -= np.float64(row[r]) * h
        for m in range(k):
            out[j * k + m] = t[k - m if reverse else m]
        out[k * k + j] = t[0 if reverse else k]
    return out


_SOLVE_TWIN = NumpyTwin(_blocks_solve, compile_seconds=0.6, seconds_per_value=5e-9)


def _blocks_apply(blocks: np.ndarray, vec: torch.Tensor) -> torch.Tensor:
    """``[W, b] -> [A_j [W_j., b_j] for each class j]`` for the flat parameters ``[W (K * K), b (K)]``."""
    k = blocks.shape[0]
    rows = np.concatenate([vec[: k * k].numpy().reshape(k, k), vec[k * k :].numpy().reshape(k, 1)], 1)
    out = np.matmul(blocks, rows[:, :, None].astype(blocks.dtype, copy=False))[:, :, 0]
    return torch.from_numpy(np.concatenate([out[:, :k].reshape(-1), out[:, k]]).astype(np.float64, copy=False))


class _BlockSolve(torch.autograd.Function):
    """Autograd node for ``x = U^-1 u``, class by class (``U^-T`` on the way back)."""

    @staticmethod
    def forward(ctx, u, upper, flipped, solve):
        ctx.upper, ctx.solve = upper, solve
        return torch.from_numpy(solve(flipped, u.detach().numpy(), True))

    @staticmethod
    def backward(ctx, grad_output):
        return torch.from_numpy(ctx.solve(ctx.upper, grad_output.contiguous().numpy(), False)), None, None, None


def _block_preconditioner(
    k: int, blocks: torch.Tensor, pen: QuadraticPenalty, dtype: torch.dtype = torch.float64
) -> Preconditioner:
    """``u_j = L_j^T theta_j`` for each class's ``theta_j = [W_j., b_j]``, ``L_j L_j^T`` = its block plus the penalty's
    curvature (Cholesky; a relative 1e-9 jitter keeps it positive definite); ``x = L^-T u`` by substitution, never an
    explicit inverse (which cost more than the factorisation). ``dtype`` is that of the factors: float32 halves the
    memory the K triangular solves of each evaluation read (twice: forward and backward) and the time to factor, for
    fits that stop at a float32 tolerance. ``newton(g)`` is the model's inverse applied, ``(L L^T)^-1 g``."""
    with torch.no_grad():
        add = torch.full((k, k + 1), 2 * pen.off_diagonal, dtype=torch.float64)
        add[torch.arange(k), torch.arange(k)] = pen.diagonal_curvature()
        add[:, k] = 2 * pen.bias
        diagonal = torch.diagonal(blocks, dim1=1, dim2=2) + add
        diagonal += _floor(diagonal.reshape(-1)).view(k, k + 1) * (1e-9 if dtype == torch.float64 else 1e-6)  # jitter
        m = blocks.to(dtype)  # a copy (float32), or the blocks themselves, restored below (float64)
        saved = torch.diagonal(m, dim1=1, dim2=2).clone()
        torch.diagonal(m, dim1=1, dim2=2).copy_(diagonal)
        try:
            lower = torch.linalg.cholesky(m)
        finally:
            torch.diagonal(m, dim1=1, dim2=2).copy_(saved)
        upper = lower.transpose(1, 2).contiguous().numpy()  # L^T
        flipped = lower.flip(1, 2).contiguous().numpy()  # L with rows and columns reversed: upper triangular

    solve = _blocks_solve
    if _SOLVE_TWIN.use(upper.size * FIT_PASSES):  # one side a fit

        def solve(factor, vec, reverse):
            return _SOLVE_TWIN.run(_twin_blocks_solve, factor, vec, reverse)

    def to_x(u: torch.Tensor) -> torch.Tensor:
        if u.requires_grad:
            return _BlockSolve.apply(u, upper, flipped, solve)
        return torch.from_numpy(solve(flipped, u.contiguous().numpy(), True))

    def newton(g: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(solve(flipped, solve(upper, g.detach().contiguous().numpy(), False), True))

    return Preconditioner(to_x, lambda xx: _blocks_apply(upper, xx.detach()), newton)


def affine_preconditioner(
    nll: AffineNLL,
    x: torch.Tensor,
    penalty: QuadraticPenalty | None = None,
    curvature: AffineCurvature | None = None,
    dtype: torch.dtype = torch.float64,
) -> Preconditioner:
    """The change of variables that whitens the Gauss-Newton curvature of ``nll`` plus ``penalty``'s at ``x`` (or of a
    ``curvature`` already computed, at a nearby point): with blocks, each class's (K + 1) x (K + 1) block exactly;
    otherwise an exact 2 x 2 block for each class's (own weight, bias) pair and the diagonal for the off-diagonal
    weights (``dtype``: that of the block factors)."""
    k = nll.k
    c = affine_curvature(nll, x) if curvature is None else curvature
    pen = penalty if penalty is not None else QuadraticPenalty(k)
    if c.blocks is not None:
        return _block_preconditioner(k, c.blocks, pen, dtype)
    with torch.no_grad():
        h11 = _floor(c.own + pen.diagonal_curvature())  # class j's own weight multiplies its own feature f_ij
        h12, h22 = c.cross, _floor(c.bias + 2 * pen.bias)
        if not nll.diagonal:
            scale = _floor(c.weights + 2 * pen.off_diagonal).rsqrt()
            eye = torch.eye(k, dtype=torch.bool)
        l11 = h11.sqrt()
        l21 = h12 / l11
        l22 = _floor(h22 - l21 * l21).sqrt()

    def split(vec: torch.Tensor):
        if nll.diagonal:
            return vec[:k], vec[k:]
        return vec[: k * k].view(k, k), vec[k * k :]

    def to_x(u: torch.Tensor) -> torch.Tensor:
        w, b = split(u)
        xb = b / l22
        if nll.diagonal:
            return torch.cat([(w - l21 * xb) / l11, xb])
        xw = torch.where(eye, torch.diag_embed((torch.diagonal(w) - l21 * xb) / l11), w * scale)
        return torch.cat([xw.reshape(-1), xb])

    def to_u(xx: torch.Tensor) -> torch.Tensor:
        w, b = split(xx)
        ub = l22 * b
        if nll.diagonal:
            return torch.cat([l11 * w + l21 * b, ub])
        uw = torch.where(eye, torch.diag_embed(l11 * torch.diagonal(w) + l21 * b), w / scale)
        return torch.cat([uw.reshape(-1), ub])

    return Preconditioner(to_x, to_u)


def fit_affine(
    nll: AffineNLL,
    x0: torch.Tensor,
    *,
    penalty: QuadraticPenalty | None = None,
    max_iter: int = 500,
    tol: float = 1e-10,
    rounds: int = 3,
    precondition: Preconditioner | None = None,
    blocks: bool = False,
    progress_bar: bool = False,
    desc: str = "fit",
) -> LBFGSResult:
    """Minimise ``nll + penalty`` from ``x0``: preconditioned LBFGS, re-preconditioned at the solution of each round
    (the curvature moves as the fit moves; per-class blocks with ``blocks``), until a round gains less than ``tol``.
    ``precondition`` (built near ``x0``, for this penalty) serves the first round instead of a fresh one."""
    if penalty is not None and not penalty.active:
        penalty = None
    with torch_single_threaded():
        return _fit_rounds(nll, x0, penalty, max_iter, tol, rounds, precondition, blocks, progress_bar, desc)


def _fit_rounds(nll, x0, penalty, max_iter, tol, rounds, precondition, blocks, progress_bar, desc) -> LBFGSResult:
    x, iterations, evaluations, previous = x0, 0, 0, None
    for r in range(rounds):
        if r > 0 or precondition is None:
            precondition = affine_preconditioner(nll, x, penalty, affine_curvature(nll, x, blocks=blocks))
        result = minimize(
            nll,
            x,
            penalty=penalty,
            precondition=precondition,
            max_iter=max(max_iter - iterations, 1),
            tol=tol,
            progress_bar=progress_bar,
            desc=desc,
        )
        x, iterations, evaluations = result.x, iterations + result.iterations, evaluations + result.evaluations
        if iterations >= max_iter or (
            previous is not None and previous - result.objective <= tol * max(abs(previous), 1.0)
        ):
            break
        previous = result.objective
    return LBFGSResult(x, result.objective, iterations, evaluations)
