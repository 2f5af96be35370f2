"""Vector scaling (Guo et al. 2017, Sec. 4.2): ``z -> w * z + b``, one weight and one bias per class (2K parameters).

Guo et al. fit it unregularised, on the logits. Here, as for every map that is not shift-invariant, it sees the
logits relative to their row maximum (so logits and log-probabilities of one prediction calibrate alike): the top
class's logit is its bias, and ``w_j`` scales class j's gap to the top. With many classes and few samples per
class the unregularised fit then has no finite optimum: a class whose samples are always predicted correctly gains
from an ever larger ``w_j`` (its gap is 0 on its own samples and negative elsewhere). At K = 1,000, N = 10,000 it
ran 300 LBFGS iterations without converging, held-out NLL 2.81 (temperature scaling: 1.80).

So the fit adds a shrinkage, ``lambda / K * sum_j (w_j - mean(w))^2 + mu / K * sum_j b_j^2``: the weights towards
their common value (temperature scaling, ``T = 1 / mean(w)``, which vector scaling contains), the biases towards 0
(ODIR's intercept term). A strong ``lambda`` gives temperature scaling plus per-class biases. The defaults,
``lambda = K / 100`` and ``mu = K / 1000``, were chosen on held-out NLL over 3 synthetic sets (K = 10, 100, 1,000)
and the 7 shared real logit files (test halves): against the earlier shrinkage towards ``w = 1`` (``lambda = mu
= K / 1000``) held-out NLL fell on 9 of the 10 (synthetic K = 100: 0.9460 -> 0.9415, K = 1,000: 1.8194 -> 1.7991,
DenseNet CIFAR-100: 0.8833 -> 0.8728) and rose on one (WRN CIFAR-100: 0.9412 -> 0.9421), and the fit took fewer
LBFGS evaluations (15 -> 12 at K = 100). ``reg_lambda=0, reg_mu=0`` is the unregularised fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_float, check_int
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration.calibrators._machinery.fitting.affine import (
    BlockDiagonalNLL,
    fit_affine,
    identity_parameters,
    map_diagonal,
)
from hf_calibration.calibrators._machinery.fitting.lbfgs import odir_penalty
from hf_calibration.calibrators._machinery.fitting.rows import FitRows, MappedRows, uncentred
from hf_calibration.calibrators._machinery.per_class import PerClassCalibrator
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators.temperature import nll_temperature


@register_calibrator
class VectorScaling(PerClassCalibrator, tags=["vector-scaling"], paper_url="https://arxiv.org/abs/1706.04599"):
    """Vector scaling: ``softmax(w * z + b)`` with per-class ``w`` (K) and ``b`` (K), fitted by NLL.

    Starts from temperature scaling (``w = 1 / T``, ``b = 0``, T by temperature scaling's own fit on the same rows: the
    model vector scaling contains, where the shrinkage is 0; from the identity, LBFGS spent most of its evaluations
    finding that common scale: 16 against 5 at 10,000 x 21,843) and minimises the validation NLL plus the shrinkage
    above with full-batch float64 LBFGS (strong-Wolfe line search, preconditioned once by the Gauss-Newton curvature at the start:
    a second round, re-preconditioned at the solution, lowered the objective by at most 3e-10 on the 10 sets above,
    and cost a curvature pass and two evaluations). The per-class weights make it a
    non-monotone map of each row: it may change the predicted class (``preserves_argmax = False``).
    Needs at least ``min_samples = 10`` labelled samples.

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
        reg_lambda: the weights' shrinkage towards their mean, lambda (default None: ``K / 100``; 0: none).
        reg_mu: the biases' shrinkage towards 0, mu (default None: ``K / 1000``; 0: none).
        max_iter: LBFGS iterations at most.
        tol: stop when an iteration lowers the NLL by less than ``tol`` (relative).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import VectorScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> logits = 3 * torch.randn(500, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> vs = VectorScaling().fit(logits, labels, progress_bar=False)
        >>> vs.weight.shape, vs.bias.shape
        (torch.Size([5]), torch.Size([5]))
    """

    kind = "vector_scaling"
    fits_in_blocks = True
    paper_citation = (
        "C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger, *On Calibration of Modern Neural Networks*, ICML 2017"
    )
    min_samples = 10

    def __init__(
        self,
        num_classes: int | None = None,
        reg_lambda: float | None = None,
        reg_mu: float | None = None,
        max_iter: int = 500,
        tol: float = 1e-10,
    ):
        super().__init__(num_classes)
        self.reg_lambda = None if reg_lambda is None else check_float(reg_lambda, "reg_lambda", minimum=0)
        self.reg_mu = None if reg_mu is None else check_float(reg_mu, "reg_mu", minimum=0)
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.tol = check_float(tol, "tol", minimum=0)

    def _allocate(self, k: int) -> None:
        self.weight = nn.Parameter(torch.ones(k, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(k, dtype=torch.float64))

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return z * self.weight.to(device=z.device, dtype=z.dtype) + self.bias.to(device=z.device, dtype=z.dtype)

    def _calibrated_blocks(self, rows):
        """The fit-set report's calibrated logits, ``(z - max z) w + b`` in the block's dtype by one compiled pass into one
        buffer (the forward's arithmetic, bit for bit, without its checks and temporaries, which dominated the fit at
        50,000 x 21,843); a block whose output overflows goes through the forward, which saturates it."""
        weight, bias = self.weight.detach().numpy(), self.bias.detach().numpy()
        out = None
        for _, block in uncentred(rows).blocks():
            if out is None or out.shape[0] < block.shape[0]:
                out = np.empty(block.shape, dtype=block.dtype)
            mapped = out[: block.shape[0]]
            map_diagonal(block, weight.astype(block.dtype), bias.astype(block.dtype), True, mapped)
            yield mapped if np.isfinite(mapped.sum()) else self(torch.from_numpy(block), from_logits=True).numpy()

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit_rows(self, rows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        k = rows.shape[1]
        self._resize(k)
        # z - max z, subtracted row by row inside each pass from the rows as stored (no shifted copy: at 50,000 x 21,843
        # the copy was 4.2 GB above the input); log-probabilities are computed rows, kept when in memory
        if isinstance(rows, FitRows) and rows.canonical and not rows.log_probabilities:
            nll = BlockDiagonalNLL(rows.view(log_probabilities=False, canonical=False), labels, shift=True)
        else:
            nll = BlockDiagonalNLL(MappedRows(rows), labels)
        reg_lambda = k / 100 if self.reg_lambda is None else self.reg_lambda
        reg_mu = k / 1000 if self.reg_mu is None else self.reg_mu
        penalty = odir_penalty(k, reg_lambda, reg_mu, diagonal=True)
        temperature = nll_temperature(uncentred(rows), labels)
        x0 = identity_parameters(k, diagonal=True)
        x0[:k] = 1.0 / temperature
        result = fit_affine(
            nll,
            x0,
            penalty=penalty,
            max_iter=self.max_iter,
            tol=self.tol,
            rounds=1,
            progress_bar=progress_bar,
            desc="VectorScaling",
        )
        with torch.no_grad():
            self.weight.copy_(result.x[:k])
            self.bias.copy_(result.x[k:])
        with (
            torch.no_grad()
        ):  # the NLL alone: the objective less the shrinkage (0 when unregularised), no pass over the rows
            nll_value = result.objective - float(penalty(result.x))
        return {
            "reg_lambda": reg_lambda,
            "reg_mu": reg_mu,
            "start_temperature": temperature,
            "steps": result.iterations,
            "evaluations": result.evaluations,
            "best_objective": result.objective,
            "nll": nll_value,
        }

    def _card_description(self) -> str:
        info = self.fit_info_ or {}
        lam, mu = info.get("reg_lambda"), info.get("reg_mu")
        if lam is None:
            penalty = ""
        elif lam == 0 and mu == 0:
            penalty = " unregularised"
        else:
            penalty = (
                f" with the weights shrunk towards their mean and the biases towards 0 (lambda = {lam:g}, mu = {mu:g})"
            )
        return (
            f"It rescales and shifts each class's logit, softmax(w * z + b), with one weight and one bias per class (vector "
            f"scaling, Guo et al. 2017), fitted by NLL{penalty}."
        )
