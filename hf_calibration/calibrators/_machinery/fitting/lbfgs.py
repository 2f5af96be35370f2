"""Full-batch float64 fitting with ``torch.optim.LBFGS`` (strong-Wolfe line search), shared by the scaling calibrators.

ETS, vector, matrix and Dirichlet scaling and PTS each minimise a smooth objective of a flat float64 parameter
vector on the whole calibration set, optionally plus a quadratic penalty:

    minimize   f(x) + penalty(x)

``f`` is written with torch operations and differentiated by autograd. The penalties used by the papers live
here too: a plain L2 term (PTS's weight decay) and the quadratic penalties of the affine maps (``QuadraticPenalty``):
ODIR, the off-diagonal and intercept regulariser of Kull et al. 2019 (Sec. 3.3),
``lambda / (K (K - 1)) * sum_{i != j} W_ij^2 + mu / K * sum_j b_j^2``, and the structured penalties of Berta et al.
2026 (SMS / SVS).

A badly scaled problem (per-class weights whose curvatures differ by orders of magnitude, a weight and a bias
that move together) takes LBFGS hundreds of iterations. ``precondition`` is a linear change of variables
``x = P(u)`` (with its inverse): LBFGS then works on ``u``, where the caller has made the curvature roughly
uniform, and the result is mapped back to ``x``. The objective and its minimiser are unchanged.

The fit runs torch on one thread (``_threads.torch_single_threaded``): its passes are small or memory-bound, and
on a busy machine parallel regions stall; an objective's heavy step may choose more threads itself.

The fit stops after ``max_iter`` LBFGS iterations, when the gradient vanishes (``max |g| <= 1e-9``), or when the
objective goes flat: an iteration that lowers it by less than ``tol * max(|f(x0)|, 1)`` ends the fit. The
objective reported is the one LBFGS evaluated at the final point (evaluated again only if it was not).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from hf_calibration._core import progress as _progress
from hf_calibration._core.threads import torch_single_threaded

Objective = Callable[[torch.Tensor], torch.Tensor]


class Preconditioner(NamedTuple):
    """A linear change of variables ``x = to_x(u)``, ``u = to_u(x)``."""

    to_x: Callable[[torch.Tensor], torch.Tensor]
    to_u: Callable[[torch.Tensor], torch.Tensor]
    newton: Callable[[torch.Tensor], torch.Tensor] | None = (
        None  # g -> to_x(to_x^T(g)), the curvature model's inverse applied
    )


class LBFGSResult(NamedTuple):
    x: torch.Tensor  # the final parameters (float64, detached)
    objective: float  # f(x) + penalty(x) at x
    iterations: int
    evaluations: int  # objective-and-gradient evaluations, line search included


def l2_penalty(strength: float, mask: torch.Tensor | None = None) -> Objective:
    """``strength * sum(x[mask]^2)`` (all of ``x`` when ``mask`` is None)."""

    def penalty(x: torch.Tensor) -> torch.Tensor:
        v = x if mask is None else x[mask]
        return strength * (v * v).sum()

    return penalty


class QuadraticPenalty(NamedTuple):
    """A quadratic penalty on the affine map's parameters, with a weight per entry:

        off_diagonal * sum_{i != j} W_ij^2 + diagonal * sum_j (W_jj - c)^2 + bias * sum_j b_j^2

    for ``x = [W.flatten() (K * K, row-major), b (K)]``, or ``x = [w (K), b (K)]`` with ``diagonal_only`` (vector
    scaling's ``W = diag(w)``). ``c`` is ``centre``, or with ``centre=None`` the mean of the diagonal: the weights then
    shrink towards a common value, i.e. towards temperature scaling with ``T = 1 / mean``. Each paper's normalisation
    (by K, K (K - 1), N) is applied by whoever builds it (``odir_penalty``; the SMS / SVS calibrators)."""

    num_classes: int
    off_diagonal: float = 0.0
    diagonal: float = 0.0
    bias: float = 0.0
    centre: float | None = None
    diagonal_only: bool = False

    @property
    def active(self) -> bool:
        return bool(self.off_diagonal or self.diagonal or self.bias)

    def diagonal_curvature(self) -> float:
        """The penalty's second derivative along one diagonal weight (``(1 - 1/K)`` of it when centred on the mean)."""
        return 2 * self.diagonal * (1 - 1 / self.num_classes if self.centre is None else 1.0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = self.num_classes
        if self.diagonal_only:
            d, off = x[:k], None
        else:
            w = x[: k * k].view(k, k)
            d = torch.diagonal(w)
            off = w - torch.diag_embed(d)
        spread = d - (d.mean() if self.centre is None else self.centre)
        b = x[-k:]
        value = self.diagonal * (spread * spread).sum() + self.bias * (b * b).sum()
        if off is not None and self.off_diagonal:
            value = value + self.off_diagonal * (off * off).sum()
        return value


def odir_penalty(
    num_classes: int, reg_lambda: float, reg_mu: float, diagonal: bool = False, reg_diagonal: float = 0.0
) -> QuadraticPenalty:
    """ODIR (Kull et al. 2019, Sec. 3.3) for ``x = [W.flatten() (K * K, row-major), b (K)]``:
    ``lambda / (K (K - 1)) * sum_{i != j} W_ij^2 + mu / K * sum_j b_j^2``; the paper leaves the diagonal free, and
    ``reg_diagonal`` adds ``reg_diagonal / K * sum_j (W_jj - mean_j W_jj)^2`` (``matrix.py`` says why).

    With ``diagonal``, ``x = [w (K), b (K)]`` (vector scaling, which has no off-diagonal weight to shrink): the
    weights shrink towards their mean, i.e. towards temperature scaling with ``T = 1 / mean(w)``, and the biases
    towards 0: ``lambda / K * sum_j (w_j - mean(w))^2 + mu / K * sum_j b_j^2``."""
    k = num_classes
    if diagonal:
        return QuadraticPenalty(k, diagonal=reg_lambda / k, bias=reg_mu / k, diagonal_only=True)
    return QuadraticPenalty(k, off_diagonal=reg_lambda / (k * (k - 1)), diagonal=reg_diagonal / k, bias=reg_mu / k)


def minimize(
    fun: Objective,
    x0: torch.Tensor,
    *,
    penalty: Objective | None = None,
    precondition: Preconditioner | None = None,
    max_iter: int = 500,
    tol: float = 1e-10,
    history_size: int = 20,
    progress_bar: bool = False,
    desc: str = "fit",
) -> LBFGSResult:
    """Minimise ``fun(x) + penalty(x)`` over a flat float64 vector from ``x0`` with LBFGS (strong-Wolfe line search).

    Raises ``FloatingPointError`` if the objective or its gradient becomes non-finite.
    """
    with (
        torch_single_threaded(),
        torch.enable_grad(),
    ):  # a fit called under torch.no_grad() (inference code) still needs it
        return _minimize(fun, x0, penalty, precondition, max_iter, tol, history_size, progress_bar, desc)


def _minimize(fun, x0, penalty, precondition, max_iter, tol, history_size, progress_bar, desc) -> LBFGSResult:
    x0 = x0.detach().to(torch.float64)
    x = (x0 if precondition is None else precondition.to_u(x0)).clone().requires_grad_(True)

    def total(u: torch.Tensor) -> torch.Tensor:
        v = u if precondition is None else precondition.to_x(u)
        value = fun(v)
        return value if penalty is None else value + penalty(v)

    value = total(x)  # with its gradient: LBFGS's first evaluation is at this same point, and is served from here
    start = float(value.detach())
    if not math.isfinite(start):
        raise FloatingPointError(f"The fit objective is not finite at the starting point ({start}).")
    value.backward()
    pending = [value.detach(), x.grad]
    max_eval = 2 * max_iter
    optimizer = torch.optim.LBFGS(
        [x],
        lr=1.0,
        max_iter=max_iter,
        max_eval=max_eval,
        tolerance_grad=1e-9,
        tolerance_change=tol * max(abs(start), 1.0),
        history_size=history_size,
        line_search_fn="strong_wolfe",
    )
    lowest = [math.inf, None]  # the lowest objective evaluated, and where: usually where LBFGS stops
    with _progress.progress_bar(total=max_eval, desc=desc, enabled=progress_bar, leave=False) as bar:

        def closure() -> torch.Tensor:
            if pending:  # the starting point, evaluated above
                value, x.grad = pending
                pending.clear()
            else:
                optimizer.zero_grad()
                value = total(x)
                value.backward()
            if not (math.isfinite(float(value.detach())) and bool(torch.isfinite(x.grad).all())):
                raise FloatingPointError("The fit objective or its gradient became non-finite (the fit diverged).")
            if float(value.detach()) < lowest[0]:
                lowest[:] = float(value.detach()), x.detach().clone()
            bar.update(1)
            return value

        optimizer.step(closure)
        _progress.finish(bar, bar.n)  # LBFGS stops before its evaluation budget: close at 100 %
    state = optimizer.state[x]
    with torch.no_grad():
        final = lowest[0] if lowest[1] is not None and torch.equal(lowest[1], x) else float(total(x))
        solution = x.detach() if precondition is None else precondition.to_x(x.detach())
    return LBFGSResult(solution, final, int(state.get("n_iter", 0)), int(state.get("func_evals", 0)))
