"""Matrix scaling with ODIR (Kull et al. 2019, "Beyond temperature scaling"): ``z -> W x(z) + b``, K^2 + K parameters.

For the logits ``x(z) = z`` (matrix scaling, Guo et al. 2017); ``DirichletCalibration`` (``dirichlet.py``) is the
same map on the log-probabilities. Fitted by the regularised NLL of Kull et al. 2019 (Sec. 3.3),

    L(W, b) = 1/N sum_i -log softmax(W x_i + b)_{y_i}
              + lambda / (K (K - 1)) sum_{i != j} W_ij^2 + mu / K sum_j b_j^2          (ODIR)

on the logits relative to their row maximum (``Calibrator`` hands non-shift-invariant maps ``z - max_k z_k``),
from the identity (W = I, b = 0) with full-batch LBFGS, preconditioned by the Gauss-Newton curvature
(``_affine.py``). ODIR leaves the diagonal free and shrinks the rest, which is what keeps K^2 + K parameters
from overfitting at K = 100.

As in the paper, lambda (and mu) are chosen by k-fold cross-validation on the calibration set itself: the mean
held-out NLL over the folds of ``stratified_folds``, then a refit on the whole set. The candidates are visited
from the strongest regularisation down; the walk stops ``cv_patience`` candidates after the best one (the
held-out NLL rises once the penalty is too weak to stop overfitting, and the weakest fits are the slowest). By
default mu is tied to lambda with the same weight per entry, ``mu = lambda / (K - 1)`` (the authors' experiment
code does this when it is given no grid for mu); a ``mus`` grid searches both.

Where the time goes: each objective evaluation is two N x K x K matrix products. The cross-validation fits,
which only rank candidates, run them in float32 (the softmax, the NLL and every sum stay float64), stop at a
relative change of ``CV_TOL`` with one preconditioning round, and start warm: the first candidate's folds
from the previous fold's solution, later candidates from the same fold's previous solution. The final fit on
the whole set starts from the mean of the chosen candidate's fold solutions, goes down to ``CV_TOL`` the same
way, then finishes in float64 throughout to ``tol``, so its minimiser is the float64 objective's.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from .._checks import check_float, check_int
from ._affine import AffineNLL, fit_affine, identity_parameters
from ._cv import stratified_folds
from ._lbfgs import odir_penalty
from ._per_class import PerClassCalibrator
from ._registry import register_calibrator
from ._threads import torch_single_threaded

# default candidates: the weight per off-diagonal entry, lambda / (K (K - 1)), one per decade from the strongest
PER_ENTRY_LAMBDAS = (10.0, 1.0, 0.1, 0.01, 1e-3, 1e-4)
# The cross-validation fits only rank candidates (their held-out NLLs differ by ~1e-3 at K = 100): a looser stop than
# the final fit's, one preconditioning round, float32 matrix products (the softmax and the sums stay float64). The
# final fit is float64 throughout.
CV_TOL = 1e-7
CV_ROUNDS = 1
CV_PRODUCTS = torch.float32


def _check_grid(values: Any, name: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise TypeError(f"Expected argument `{name}` to be a non-empty sequence of numbers, but got {values!r}.")
    return tuple(sorted({check_float(v, name, minimum=0) for v in values}, reverse=True))


def _check_reg(value: Any, name: str) -> float | None:
    return None if value is None else check_float(value, name, minimum=0)


@register_calibrator
class MatrixScaling(PerClassCalibrator, tags=["matrix-scaling", "odir"], paper_url="https://arxiv.org/abs/1910.12656"):
    """Matrix scaling with ODIR: ``softmax(W z + b)``, ``W`` (K, K) and ``b`` (K); lambda and mu by cross-validation.

    With ``reg_lambda=None`` (the default) lambda is chosen from ``lambdas`` by ``cv``-fold cross-validation of
    the held-out NLL on the calibration set, as Kull et al. 2019 do; ties go to the stronger regularisation. mu
    follows lambda (``mu = lambda / (K - 1)``, the same weight per entry) unless ``reg_mu`` fixes it or ``mus``
    gives a grid to search with it. ``reg_lambda=0, reg_mu=0`` is the unregularised matrix scaling of Guo et al.
    2017. May change the predicted class (``preserves_argmax = False``).
    Needs at least ``min_samples = 10`` labelled samples (and ``cv`` of them to cross-validate).

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
        reg_lambda: the off-diagonal weight lambda, or None to cross-validate it over ``lambdas``.
        reg_mu: the intercept weight mu, or None to tie it to lambda (or cross-validate it over ``mus``).
        lambdas: candidate lambdas (default: ``K (K - 1) * (10, 1, 0.1, 0.01, 1e-3, 1e-4)``, i.e. a weight of 10 down to
            1e-4 per off-diagonal entry; the best one measured was ~0.1 at K = 10 and ~1 at K = 100).
        mus: candidate mus to search together with lambda (default None: tied to lambda).
        cv: number of cross-validation folds (5, the paper's).
        cv_patience: stop walking down the candidates this many after the best one (None: try them all).
        cv_seed: seed of the fold assignment (the fit itself is deterministic).
        max_iter: LBFGS iterations at most, per fit.
        tol: stop a fit when an iteration lowers the objective by less than ``tol`` (relative).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import MatrixScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 4, (400,), generator=g)
        >>> logits = 3 * torch.randn(400, 4, generator=g) + 6 * torch.nn.functional.one_hot(labels, 4)
        >>> ms = MatrixScaling(reg_lambda=1.0, reg_mu=1.0).fit(logits, labels, progress_bar=False)
        >>> ms.weight.shape
        torch.Size([4, 4])
    """

    kind = "matrix_scaling"
    paper_citation = (
        "M. Kull, M. Perello-Nieto, M. Kängsepp, T. Silva Filho, H. Song, P. Flach, *Beyond temperature scaling: Obtaining "
        "well-calibrated multi-class probabilities with Dirichlet calibration*, NeurIPS 2019"
    )
    min_samples = 10

    def __init__(
        self,
        num_classes: int | None = None,
        reg_lambda: float | None = None,
        reg_mu: float | None = None,
        lambdas: Sequence[float] | None = None,
        mus: Sequence[float] | None = None,
        cv: int = 5,
        cv_patience: int | None = 1,
        cv_seed: int = 0,
        max_iter: int = 1000,
        tol: float = 1e-10,
    ):
        super().__init__(num_classes)
        self.reg_lambda = _check_reg(reg_lambda, "reg_lambda")
        self.reg_mu = _check_reg(reg_mu, "reg_mu")
        self.lambdas = _check_grid(lambdas, "lambdas")
        self.mus = _check_grid(mus, "mus")
        self.cv = check_int(cv, "cv", minimum=2)
        self.cv_patience = None if cv_patience is None else check_int(cv_patience, "cv_patience", minimum=1)
        self.cv_seed = check_int(cv_seed, "cv_seed", minimum=0)
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.tol = check_float(tol, "tol", minimum=0)

    def _allocate(self, k: int) -> None:
        self.weight = nn.Parameter(torch.eye(k, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(k, dtype=torch.float64))

    # ------------------------------------------------------------------ the map
    def _features(self, z: torch.Tensor) -> torch.Tensor:
        """What ``W`` multiplies: the logits themselves."""
        return z

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            w = self.weight.to(device=z.device, dtype=z.dtype)
            b = self.bias.to(device=z.device, dtype=z.dtype)
            return torch.addmm(b, self._features(z).contiguous(), w.t())  # one memory layout: one summation order

    # ------------------------------------------------------------------ fitting
    def _fit_one(self, nll: AffineNLL, reg_lambda: float, reg_mu: float, x0: torch.Tensor, progress_bar: bool = False,
                 tol: float | None = None, rounds: int = 3, max_iter: int | None = None):
        return fit_affine(nll, x0, reg_lambda=reg_lambda, reg_mu=reg_mu, max_iter=self.max_iter if max_iter is None else max_iter,
                          tol=self.tol if tol is None else tol, rounds=rounds, progress_bar=progress_bar, desc=type(self).__name__)

    def _fit_final(self, features: torch.Tensor, labels: torch.Tensor, reg_lambda: float, reg_mu: float, x0: torch.Tensor,
                   progress_bar: bool) -> tuple[torch.Tensor, int, int]:
        """The fit on the whole set: float32 products down to ``CV_TOL``, then float64 throughout down to ``tol`` (the
        minimiser is the float64 objective's); returns (parameters, iterations, evaluations)."""
        rough = self._fit_one(AffineNLL(features, labels, products=CV_PRODUCTS), reg_lambda, reg_mu, x0, progress_bar,
                              tol=max(self.tol, CV_TOL), rounds=1)
        if rough.iterations >= self.max_iter:
            return rough.x, rough.iterations, rough.evaluations
        exact = self._fit_one(AffineNLL(features, labels), reg_lambda, reg_mu, rough.x, progress_bar, max_iter=self.max_iter - rough.iterations)
        return exact.x, rough.iterations + exact.iterations, rough.evaluations + exact.evaluations

    def _lambda_grid(self, k: int) -> tuple[float, ...]:
        if self.reg_lambda is not None:
            return (self.reg_lambda,)
        return self.lambdas if self.lambdas is not None else tuple(w * k * (k - 1) for w in PER_ENTRY_LAMBDAS)

    def _mus_for(self, reg_lambda: float, k: int) -> tuple[float, ...]:
        if self.reg_mu is not None:
            return (self.reg_mu,)
        if self.mus is not None:
            return self.mus
        return (reg_lambda / (k - 1),)

    def _cross_validate(self, features: torch.Tensor, labels: torch.Tensor, progress_bar: bool) -> tuple[float, float, torch.Tensor, list]:
        """Walk the candidates from the strongest regularisation down; returns (lambda, mu, warm start, CV table)."""
        from tqdm.auto import tqdm

        k = features.shape[1]
        folds = [(AffineNLL(features[train], labels[train], products=CV_PRODUCTS), AffineNLL(features[val], labels[val]), len(val))
                 for train, val in stratified_folds(labels.numpy(), self.cv, self.cv_seed)]
        starts = [identity_parameters(k) for _ in folds]
        table: list[dict] = []
        best, best_score, best_solution, since_best = None, np.inf, None, 0
        lambdas = self._lambda_grid(k)
        with tqdm(total=len(lambdas), desc=f"{type(self).__name__} CV", disable=not progress_bar, delay=1.0, leave=False) as bar:
            for i, lam in enumerate(lambdas):
                mus = self._mus_for(lam, k)
                improved = False
                for mu in mus if i % 2 == 0 else mus[::-1]:  # snake through a mu grid: neighbours warm-start each other
                    score, mean_solution = 0.0, torch.zeros_like(starts[0])
                    for f, (train, held_out, n_val) in enumerate(folds):
                        # the first candidate's folds start from the previous fold's solution (three quarters of the
                        # same data), the later ones from their own fold's solution at the previous candidate
                        x0 = starts[f - 1] if f > 0 and not table else starts[f]
                        starts[f] = self._fit_one(train, lam, mu, x0, tol=max(self.tol, CV_TOL), rounds=CV_ROUNDS).x
                        with torch.no_grad():
                            score += float(held_out(starts[f])) * n_val / len(labels)
                        mean_solution += starts[f] / len(folds)
                    table.append({"reg_lambda": lam, "reg_mu": mu, "cv_nll": score})
                    if score < best_score:
                        best, best_score, best_solution, improved = (lam, mu), score, mean_solution, True
                bar.update(1)
                since_best = 0 if improved else since_best + 1
                if self.cv_patience is not None and since_best >= self.cv_patience:
                    break
        return best[0], best[1], best_solution, table

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit(self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        k = logits.shape[1]
        self._resize(k)
        with torch.no_grad():
            features = self._features(torch.from_numpy(logits).double())
        y = torch.from_numpy(labels).long()
        info: dict[str, Any] = {}
        try:
            if self.reg_lambda is None or (self.reg_mu is None and self.mus is not None):
                if len(y) < self.cv:
                    raise ValueError(f"Expected at least `cv` = {self.cv} labelled samples to choose lambda and mu by cross-validation, but got {len(y)}.")
                reg_lambda, reg_mu, x0, table = self._cross_validate(features, y, progress_bar)
                info["cv"] = table
            else:
                reg_lambda = self.reg_lambda
                reg_mu = self._mus_for(reg_lambda, k)[0]
                x0 = identity_parameters(k)
            x, iterations, evaluations = self._fit_final(features, y, reg_lambda, reg_mu, x0, progress_bar)
        except FloatingPointError:
            # ODIR leaves the diagonal free: a class the fit set never (or hardly) shows can be pushed to -inf
            unseen = k - int(torch.unique(y).numel())
            raise ValueError(
                f"{type(self).__name__}'s fit diverged on {len(y)} labelled samples with K = {k} classes ({unseen} of them never "
                f"a label): its K^2 + K = {k * k + k} parameters need a larger calibration set. Use a calibrator with fewer "
                "parameters (temperature_scaling, ets, vector_scaling) or more `logits`."
            ) from None
        with torch.no_grad():
            self.weight.copy_(x[: k * k].view(k, k))
            self.bias.copy_(x[k * k :])
            nll = float(AffineNLL(features, y)(x))
            objective = nll + float(odir_penalty(k, reg_lambda, reg_mu)(x)) if reg_lambda or reg_mu else nll
        info.update({"reg_lambda": reg_lambda, "reg_mu": reg_mu, "steps": iterations, "evaluations": evaluations,
                     "best_objective": objective, "nll": nll})
        return info

    def _card_regularisation(self) -> str:
        info = self.fit_info_ or {}
        lam, mu = info.get("reg_lambda"), info.get("reg_mu")
        if lam is None:
            return "off-diagonal and intercept regularisation (ODIR)"
        how = f"chosen by {self.cv}-fold cross-validation on the calibration set" if "cv" in info else "given"
        return f"off-diagonal and intercept regularisation (ODIR, lambda = {lam:g}, mu = {mu:g}, {how})"

    def _card_description(self) -> str:
        return (f"It maps the logits z to softmax(W z + b) with a full K x K matrix W and bias b (matrix scaling), fitted by NLL "
                f"with {self._card_regularisation()} as in Kull et al. 2019.")
