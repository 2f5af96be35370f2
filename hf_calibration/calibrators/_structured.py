"""What structured matrix and vector scaling share (Berta, Holzmüller, Jordan & Bach, AISTATS 2026): temperature
scaling first, then an affine map of the temperature-scaled log-probabilities shrunk towards the identity.

    x_i = log((1 - eps) softmax(z_i / T) + eps / K),  eps = 1 / (N + 1)   T: temperature scaling's, fitted first by NLL
    softmax((I + diag(v) + offdiag(M)) x_i + b)                           SMS (``sms.py``); SVS (``svs.py``) has no M

fitted by NLL plus ridge penalties whose strengths grow with K and shrink with N (the paper's scaling),

    lambda_b K^rho / N^tau sum_j b_j^2 + lambda_d K^rho / N^tau sum_j v_j^2 + lambda_o (K (K - 1))^rho / N^tau sum_{i != j} M_ij^2,

with lambda_b = lambda_d = lambda_o = 1 and rho = tau = 1 by default. At the identity (``v = 0``, ``M = 0``, ``b = 0``)
the map is (smoothed) temperature scaling, so a calibration set too small to say more leaves it there. The mixture
with the uniform distribution (``eps``, the fit set's N, kept for prediction; "Laplace smoothing", the reference's
``ts-mix``) bounds the features below by ``log(eps / K)``: no log-probability of 1e-300 drives the fit. The reference is
``probmetrics`` 1.3 (the authors' package, ``get_calibrator("sms")`` / ``("svs")``), read for its defaults: the same
preprocessing (its temperature by bisection, ours by LBFGS on the same NLL), the same penalties. Where we depart: the
fit, preconditioned full-batch LBFGS (``_machinery/fitting/affine.py``), the matrix products in float32 down to a relative change of
``FLOAT32_TOL`` (the softmax, the NLL and the sums in float64; the reference fits in float32 throughout), then float64
throughout if a smaller ``tol`` is asked for.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_float, check_int
from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import parallel_kernel, run_pass, serial_twin
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration._core.vmath import exp_into, log_into, max_of, sum_of
from hf_calibration.calibrators._machinery.base import k_squared_memory, k_squared_reason
from hf_calibration.calibrators._machinery.fitting.affine import (
    AffineNLL,
    BlockDiagonalNLL,
    fit_affine,
    identity_parameters,
    map_diagonal,
)
from hf_calibration.calibrators._machinery.fitting.lbfgs import QuadraticPenalty
from hf_calibration.calibrators._machinery.fitting.partition import chunk_rows
from hf_calibration.calibrators._machinery.fitting.rows import MappedRows, as_rows
from hf_calibration.calibrators._machinery.per_class import PerClassCalibrator

FLOAT32_TOL = 1e-7  # below this relative change, float32 products stop being able to tell steps apart
FIT_MARGIN_BYTES = 64 << 20  # SVS keeps its features up to the input's size less this (or 1/64 of it, if smaller)


@parallel_kernel(cache=True, fastmath={"contract"})
def _features_block(z, inv_t, one_minus_eps, eps_k, out, rows_per_chunk):  # pragma: no cover - compiled
    """``out = log((1 - eps) softmax(z / T) + eps / K)`` row by row, in float64 (rounded to ``out``'s dtype), as
    ``log(c e_j + eps / K)`` with ``e_j = exp(z_j / T - max)`` and ``c = (1 - eps) / sum(e)``: one vectorised ``exp`` and
    one ``log`` per logit. The argument is at least ``eps / K`` (> 1e-300 for any N, K an array can hold), so a
    softmax value that underflows costs nothing: the mixture's floor is what the log sees."""
    n, k = z.shape
    n_chunks = (n + rows_per_chunk - 1) // rows_per_chunk
    for c in numba.prange(n_chunks):
        a, e, t, bits = np.empty(k), np.empty(k), np.empty(k), np.empty(k)
        for i in range(c * rows_per_chunk, min(n, (c + 1) * rows_per_chunk)):
            row = z[i]
            for j in range(k):
                a[j] = np.float64(row[j]) * inv_t
            top = max_of(a)
            for j in range(k):
                a[j] -= top
            exp_into(a, e, bits)
            scale = one_minus_eps / sum_of(e)
            for j in range(k):
                t[j] = scale * e[j] + eps_k
            log_into(t, a, bits)
            for j in range(k):
                out[i, j] = a[j]


def _twin_features_block(z, inv_t, one_minus_eps, eps_k, out):
    """``_features_block`` in numpy, float64 (to rounding: the kernel fuses multiply-adds and has its own exp / log)."""
    a = z.astype(np.float64) * inv_t
    a -= a.max(axis=1, keepdims=True)
    e = np.exp(a)
    out[...] = np.log((one_minus_eps / e.sum(axis=1, keepdims=True)) * e + eps_k)


_TWIN = NumpyTwin(_features_block, serial_twin(_features_block), compile_seconds=0.6, seconds_per_value=4e-8)


class StructuredScaling(PerClassCalibrator):
    """Temperature scaling, then ``softmax(W x + b)`` of the scaled log-probabilities ``x``, with ``W`` shrunk towards
    the identity. Subclasses set ``diagonal`` (SVS: ``W = diag(w)``); both start from the identity map."""

    diagonal = False
    shift_invariant = True  # log softmax(z / T) ignores a per-row constant
    min_samples = 10

    def __init__(
        self,
        num_classes: int | None = None,
        lambda_intercept: float = 1.0,
        lambda_diagonal: float = 1.0,
        lambda_off_diagonal: float = 1.0,
        rho: float = 1.0,
        tau: float = 1.0,
        max_iter: int = 500,
        tol: float = FLOAT32_TOL,
    ):
        super().__init__(num_classes)
        self.lambda_intercept = check_float(lambda_intercept, "lambda_intercept", minimum=0)
        self.lambda_diagonal = check_float(lambda_diagonal, "lambda_diagonal", minimum=0)
        self.lambda_off_diagonal = check_float(lambda_off_diagonal, "lambda_off_diagonal", minimum=0)
        self.rho = check_float(rho, "rho", minimum=0)
        self.tau = check_float(tau, "tau", minimum=0)
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.tol = check_float(tol, "tol", minimum=0)
        self.log_temperature = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.register_buffer("smoothing", torch.zeros((), dtype=torch.float64))  # eps = 1 / (N + 1) of the fit set

    def _allocate(self, k: int) -> None:
        self.weight = nn.Parameter(
            torch.ones(k, dtype=torch.float64) if self.diagonal else torch.eye(k, dtype=torch.float64)
        )
        self.bias = nn.Parameter(torch.zeros(k, dtype=torch.float64))

    # ------------------------------------------------------------------ the map
    @staticmethod
    def _features(z: torch.Tensor, temperature: float | torch.Tensor, smoothing: float | torch.Tensor) -> torch.Tensor:
        """``log((1 - eps) softmax(z / T) + eps / K)``, computed from the log-softmax (no underflow to log 0)."""
        k = z.shape[1]
        smoothing = torch.as_tensor(smoothing, dtype=z.dtype, device=z.device)
        return torch.logaddexp(
            torch.log_softmax(z / temperature, dim=1) + torch.log1p(-smoothing), torch.log(smoothing / k)
        )

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            x = self._features(z, self.log_temperature.exp().to(device=z.device, dtype=z.dtype), self.smoothing)
            b = self.bias.to(device=z.device, dtype=z.dtype)
            w = self.weight.to(device=z.device, dtype=z.dtype)
            return x * w + b if self.diagonal else torch.addmm(b, x.contiguous(), w.t())

    def _check_state(self, where: str) -> None:
        eps = float(self.smoothing)
        if not 0 < eps < 1:
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: the smoothing eps = {eps!r} is not in (0, 1)."
            )

    # ------------------------------------------------------------------ fitting
    def penalty(self, num_classes: int, num_samples: int) -> QuadraticPenalty:
        """The ridge penalty's weight per entry for K classes and N samples: ``lambda K^rho / N^tau`` for the biases
        and the diagonal, ``lambda_off_diagonal (K (K - 1))^rho / N^tau`` for the off-diagonal entries."""
        k, scale = num_classes, num_samples**self.tau
        return QuadraticPenalty(
            k,
            off_diagonal=0.0 if self.diagonal else self.lambda_off_diagonal * (k * (k - 1)) ** self.rho / scale,
            diagonal=self.lambda_diagonal * k**self.rho / scale,
            bias=self.lambda_intercept * k**self.rho / scale,
            centre=1.0,
            diagonal_only=self.diagonal,
        )

    @staticmethod
    def _features_of_block(block: np.ndarray, temperature: float, smoothing: float) -> np.ndarray:
        """``_features`` of one block of rows, in float64 rounded to the block's dtype (one compiled pass)."""
        k = block.shape[1]
        out = np.empty(block.shape, dtype=block.dtype)
        if _TWIN.use(block.size):
            _TWIN.run(_twin_features_block, block, 1.0 / temperature, 1.0 - smoothing, smoothing / k, out)
            return out
        run_pass(
            _features_block, block.size, block, 1.0 / temperature, 1.0 - smoothing, smoothing / k, out, chunk_rows(k)
        )
        return out

    def _memory_needed(self, num_samples: int, num_classes: int) -> int | None:
        return None if self.diagonal else k_squared_memory(num_samples, num_classes)

    def _memory_reason(self, num_samples: int, num_classes: int) -> str:
        return k_squared_reason(num_samples, num_classes)

    def _fit(
        self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool
    ) -> dict[str, Any]:
        if self.diagonal:
            return self._fit_rows(as_rows(logits), labels, objective, kw, progress_bar)
        return self._fit_matrix(logits, labels, objective, kw, progress_bar)

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit_rows(self, rows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        """The diagonal form (SVS) in blocks of rows: temperature scaling by its block fit, then the features of each
        block (computed once and kept when the rows are in memory, else at every pass) and vector scaling's block
        objective on them."""
        from hf_calibration.calibrators.temperature import nll_temperature

        n, k = rows.shape
        self._resize(k)
        temperature = nll_temperature(rows, labels)
        smoothing = 1.0 / (n + 1)
        # the features, kept in memory up to the input's size less a margin for the fit's own working memory (partial
        # sums, LBFGS's state, the report's arrays: 5 MB at 50,000 x 21,843, over the input plus one buffer); the last
        # blocks are computed again at every pass (1.5 % of them there)
        size = n * k * np.dtype(rows.compute_dtype).itemsize
        features = MappedRows(
            rows,
            lambda block: self._features_of_block(block, temperature, smoothing),
            keep_bytes=size - min(FIT_MARGIN_BYTES, size // 64),
        )
        penalty = self.penalty(k, n)
        result = fit_affine(
            BlockDiagonalNLL(features, labels),
            identity_parameters(k, True),
            max_iter=self.max_iter,
            tol=self.tol,
            rounds=1,
            penalty=penalty,
            progress_bar=progress_bar,
            desc=type(self).__name__,
        )
        self.__dict__["_fit_features"] = (
            features  # the fit-set report reads them (``_calibrated_blocks``), then drops them
        )
        return self._store(result, result.iterations, result.evaluations, temperature, smoothing, penalty)

    def _calibrated_blocks(self, rows):
        """The fit set's calibrated logits from the features the fit kept (``x w + b`` in the block's dtype, as the
        forward computes them from its own features, which agree to float rounding): the report's forward pass at
        50,000 x 21,843 recomputed the features, a third of SVS's fit."""
        features = self.__dict__.pop("_fit_features", None)
        if features is None or features.shape != rows.shape:
            yield from super()._calibrated_blocks(rows)
            return
        weight, bias = self.weight.detach().numpy(), self.bias.detach().numpy()
        for _, x in features.blocks():  # in place: the features' last use (a buffer beside them put the fit 19 MB over
            # the input plus one buffer at 50,000 x 21,843)
            map_diagonal(x, weight.astype(x.dtype), bias.astype(x.dtype), False, x)
            yield x

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit_matrix(
        self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool
    ) -> dict[str, Any]:
        from hf_calibration.calibrators.temperature import nll_temperature

        n, k = logits.shape
        self._resize(k)
        # the preprocessing: temperature scaling by NLL on the same set
        temperature = nll_temperature(logits, labels)
        smoothing = 1.0 / (n + 1)
        with torch.no_grad():
            features = self._features(torch.from_numpy(logits).double(), temperature, smoothing)
        y = torch.from_numpy(labels).long()
        penalty = self.penalty(k, n)
        common = {"penalty": penalty, "progress_bar": progress_bar, "desc": type(self).__name__}
        x0 = identity_parameters(k, self.diagonal)
        # vector scaling's compiled pass reads the features as they are; a full matrix's products run in float32
        first = AffineNLL(
            features, y, diagonal=self.diagonal, products=torch.float64 if self.diagonal else torch.float32
        )
        result = fit_affine(
            first,
            x0,
            max_iter=self.max_iter,
            tol=self.tol if self.diagonal else max(self.tol, FLOAT32_TOL),
            rounds=1,
            **common,
        )
        iterations, evaluations = result.iterations, result.evaluations
        if not self.diagonal and self.tol < FLOAT32_TOL and iterations < self.max_iter:
            result = fit_affine(
                AffineNLL(features, y), result.x, max_iter=self.max_iter - iterations, tol=self.tol, **common
            )
            iterations, evaluations = iterations + result.iterations, evaluations + result.evaluations
        return self._store(result, iterations, evaluations, temperature, smoothing, penalty)

    def _store(
        self, result, iterations: int, evaluations: int, temperature: float, smoothing: float, penalty
    ) -> dict[str, Any]:
        """Keep the fitted parameters; the fit record."""
        k = self.num_classes
        x = result.x
        with torch.no_grad():
            self.log_temperature.fill_(math.log(temperature))
            self.smoothing.fill_(smoothing)
            if self.diagonal:
                self.weight.copy_(x[:k])
            else:
                self.weight.copy_(x[: k * k].view(k, k))
            self.bias.copy_(x[-k:])
            nll = result.objective - float(penalty(x))
        return {
            "temperature": temperature,
            "smoothing": smoothing,
            "reg_intercept": penalty.bias,
            "reg_diagonal": penalty.diagonal,
            "reg_off_diagonal": penalty.off_diagonal,
            "steps": iterations,
            "evaluations": evaluations,
            "best_objective": result.objective,
            "nll": nll,
        }

    def _card_penalty(self) -> str:
        info = self.fit_info_ or {}
        if "temperature" not in info:
            return "ridge penalties that grow with K and shrink with N"
        return (
            f"ridge penalties that grow with K and shrink with N (weights per entry: intercept {info['reg_intercept']:.3g}, "
            f"diagonal {info['reg_diagonal']:.3g}"
            + ("" if self.diagonal else f", off-diagonal {info['reg_off_diagonal']:.3g}")
            + f"), after temperature scaling with T = {info['temperature']:.4f}"
        )
