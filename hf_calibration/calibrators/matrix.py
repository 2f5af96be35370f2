"""Matrix scaling with ODIR (Kull et al. 2019, "Beyond temperature scaling"): ``z -> W x(z) + b``, K^2 + K parameters.

For the logits ``x(z) = z`` (matrix scaling, Guo et al. 2017); ``DirichletCalibration`` (``dirichlet.py``) is the
same map on the log-probabilities. Fitted by the regularised NLL of Kull et al. 2019 (Sec. 3.3),

    L(W, b) = 1/N sum_i -log softmax(W x_i + b)_{y_i}
              + lambda / (K (K - 1)) sum_{i != j} W_ij^2 + mu / K sum_j b_j^2          (ODIR)
              + nu / K sum_j (W_jj - mean_j W_jj)^2                                     (ours, see below)

on the logits relative to their row maximum (``Calibrator`` hands non-shift-invariant maps ``z - max_k z_k``), with
full-batch LBFGS preconditioned by the Gauss-Newton curvature (``_machinery/fitting/affine.py``).

Where this departs from the paper, and why:

* **The diagonal is shrunk, lightly.** ODIR leaves the diagonal free. Fitted exactly, that has no finite optimum
  whenever the calibration set classifies some class's samples all correctly (at K = 100 and 50 samples a class,
  common): the fit sends that class's diagonal weight to infinity, which costs nothing on the calibration set and
  gives a probability of ~0 to that class on any test sample it does not rank first. On the DenseNet-BC CIFAR-100
  logits two such classes reached weights of 91 and 36 and the test NLL 1.29 (uncalibrated 1.23). Kull et al.'s
  Keras fit (Adam, early stopping) never gets there. ``nu = reg_diagonal`` (default ``K / 100``, a weight of 0.01 per
  entry, the same as vector scaling's) pulls the diagonal towards its mean, i.e. towards temperature scaling, and
  removes that direction (test NLL 0.87, temperature scaling 0.88); ``reg_diagonal=0`` is the paper's objective.
* **One refit, not five.** The paper's tables report the average of the five fold models' probabilities; here the
  chosen (lambda, mu) is refitted on the whole calibration set, so the calibrator is one map.
* **Stratified folds** (``_machinery.fitting.cv.stratified_folds``, the folds every calibrator of the package shares), not plain k-fold.


The choice of lambda and mu follows the authors' experiment code (their ``tune_cal_odir.py``, which adds
``l2 * sum_{i != j} W_ij^2 + mu * sum_j b_j^2`` to the mean NLL: weights per entry, i.e. ``lambda / (K (K - 1))`` and
``mu / K`` in the paper's normalisation): 5-fold cross-validation of the mean held-out NLL over their grid, lambda's
weight per entry in ``{0.25, 0.5, 1} x 10^i`` and mu's in ``10^i``, ``i`` from -2 (K >= 100; -5 below) to 6. At
K = 100 that is lambda from 0.0025 x 9,900 = 24.75 to 10^6 x 9,900. The grid has 27 x 9 candidates (36 x 12 below
K = 100); the search (``_Search``) visits those that can win, each on all five folds:

1. lambda's decades, mu tied to lambda (the same weight per entry, the authors' choice when given no mu), from the
   strongest down, until the held-out NLL has been worse than the best by more than ``PLATEAU`` (0.1 %) ``cv_patience``
   times in a row (the strong end of the grid is a plateau whose scores differ by less than the fits' noise: crossing
   it, not stopping on it);
2. mu's decades on either side of the tie, while they improve or stay within ``PLATEAU`` (two flat decades end a side);
3. lambda's in-between points (0.5 and 0.25 below the best decade, 2.5 and 5 above), nearest first, while they improve.

A candidate worse than the best on each of its first two folds by more than 0.1 % on average (or on its first fold by
more than 1 %) is not fitted on the others (racing): its score in ``fit_info_["cv"]`` is then the mean over the folds it
saw (``"folds"``). On a narrowed grid (five decades, K = 3) the search picked the brute-force search's best candidate
or one within 1e-4 of it (``tests/calibrators/test_matrix.py``); on the seven shared logit files it chose a lambda inside
the grid every time, never an end point. mu did sit at the grid's weak end (10^-2 per entry) on two of the three
CIFAR-100 files, and weaker ones cross-validate better there (LeNet-5: CV NLL 3.6714 at 10^-2, 3.6671 at 10^-4; test
NLL 3.6777 -> 3.6737; WRN-16-4: 0.9101 -> 0.9096 at 10^-3), at ~30 % more fit time: ``mus=`` widens it.

Where the time goes: each objective evaluation is two N x K x K matrix products. The cross-validation fits, which
only rank candidates, run them in float32 (the softmax, the NLL and every sum stay float64), stop at a relative
change of ``CV_TOL`` with one preconditioning round, and start warm: the first candidate from temperature scaling's
fit on the same fold (``W = I / T``), later ones from the same fold's solution at the nearest candidate seen, moved by
the step the first fold took. One preconditioner serves them all: the per-class Gauss-Newton blocks (K + 1 square,
``_machinery.fitting.affine.affine_curvature``) computed once on the whole set at the first solution, factored once per lambda with
that lambda's penalty (3-6x fewer LBFGS evaluations than a diagonal scaling at the weakly regularised candidates). The
final fit on the whole set starts from the mean of the chosen candidate's fold solutions, goes down to ``CV_TOL`` the
same way, then finishes in float64 throughout to ``tol``, so its minimiser is the float64 objective's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from hf_calibration._core import progress as _progress
from hf_calibration._core.checks import check_float, check_int
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration.calibrators._machinery.base import k_squared_memory, k_squared_reason, logger
from hf_calibration.calibrators._machinery.fitting.affine import (
    AffineCurvature,
    AffineNLL,
    affine_curvature,
    affine_preconditioner,
    fit_affine,
    identity_parameters,
)
from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds
from hf_calibration.calibrators._machinery.fitting.lbfgs import Preconditioner, QuadraticPenalty, odir_penalty
from hf_calibration.calibrators._machinery.per_class import PerClassCalibrator
from hf_calibration.calibrators._machinery.registry import register_calibrator

# The authors' grid (their experiment code): weights per entry, 10^i for i from -5 (10 classes) or -2 (100 classes) to 6,
# lambda's also at 0.25 and 0.5 of each decade.
GRID_TOP = 6
GRID_BOTTOM_SMALL_K, GRID_BOTTOM_LARGE_K = -5, -2
LAMBDA_STEPS = (0.25, 0.5)
# The cross-validation fits only rank candidates (their held-out NLLs differ by ~1e-3 at K = 100): a looser stop than
# the final fit's, one preconditioning round, float32 matrix products (the softmax and the sums stay float64). The
# final fit is float64 throughout.
CV_TOL = 1e-6
CV_ROUNDS = 1
CV_PRODUCTS = torch.float32
# Racing: a candidate worse than the best on each of its first RACE_FOLDS folds, by more than RACE_MARGIN of the best's
# NLL on average, stops there (the weak-lambda candidates past the best are the slowest fits of the search).
RACE_FOLDS = 2
RACE_MARGIN = 1e-3
RACE_FIRST = 10  # after one fold only: ten times the margin
# The walk down lambda's decades counts a candidate against its patience only when it is worse than the best by more than
# this (relative): the strong end of the grid is a plateau whose scores differ by less than the cross-validation fits'
# own noise (~1e-4 relative, measured against fits to 1e-10).
PLATEAU = 1e-3
MU_FLAT_STEPS = 2  # mu's curve is flat on one side or both: two decades without a gain end its walk that way
SMALLER = "temperature_scaling, vector_scaling or svs"  # what a user can fall back on, fewest parameters first


def _check_grid(values: Any, name: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise TypeError(f"Expected argument `{name}` to be a non-empty sequence of numbers, but got {values!r}.")
    return tuple(sorted({check_float(v, name, minimum=0) for v in values}, reverse=True))


def _check_reg(value: Any, name: str) -> float | None:
    return None if value is None else check_float(value, name, minimum=0)


def grid_exponents(num_classes: int) -> range:
    """The decades ``i`` of the authors' grid, strongest first: 6 down to -2 for K >= 100, down to -5 below."""
    return range(GRID_TOP, (GRID_BOTTOM_LARGE_K if num_classes >= 100 else GRID_BOTTOM_SMALL_K) - 1, -1)


class _Fold(NamedTuple):
    train: AffineNLL
    held_out: AffineNLL
    weight: float  # the held-out part's share of the calibration set


@register_calibrator
class MatrixScaling(PerClassCalibrator, tags=["matrix-scaling", "odir"], paper_url="https://arxiv.org/abs/1910.12656"):
    """Matrix scaling with ODIR: ``softmax(W z + b)``, ``W`` (K, K) and ``b`` (K); lambda and mu by cross-validation.

    With ``reg_lambda=None`` (the default) lambda and mu are chosen on the authors' grid by ``cv``-fold
    cross-validation of the held-out NLL on the calibration set, as Kull et al. 2019 do (module docstring: the grid,
    the search, and where this departs from the paper); ties go to the stronger regularisation. A given
    ``reg_lambda`` with ``reg_mu=None`` ties mu to it (``mu = lambda / (K - 1)``, the same weight per entry); a given
    ``reg_mu`` with ``reg_lambda=None`` is kept while lambda is searched.
    ``lambdas`` (and ``mus``) replace the grid by your own: each lambda, strongest first, with every mu (``cv_patience``
    and the racing of clear losers apply; ``cv_patience=None`` tries every lambda). ``reg_lambda=0, reg_mu=0,
    reg_diagonal=0`` is the unregularised matrix scaling of Guo et al. 2017. When the chosen candidate's
    cross-validated NLL is above temperature scaling's on the same folds, the fit warns: the calibration set is too
    small for K^2 + K parameters. May change the predicted class (``preserves_argmax = False``).
    Needs at least ``min_samples = 10`` labelled samples (and ``cv`` of them to cross-validate).

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
        reg_lambda: the off-diagonal weight lambda, or None to cross-validate it.
        reg_mu: the intercept weight mu, or None to cross-validate it (or tie it to a given lambda).
        reg_diagonal: nu, the diagonal's shrinkage towards its mean (default None: ``K / 100``; 0: none, the paper's).
        lambdas: your own candidate lambdas (default None: the authors' grid, ``K (K - 1) x {0.25, 0.5, 1} x 10^i``).
        mus: your own candidate mus, searched with every lambda (default None: the authors' grid, ``K x 10^i``, with
            the default lambdas; tied to lambda with your ``lambdas``).
        cv: number of cross-validation folds (5, the paper's).
        cv_patience: stop walking down the decades of lambda (or your ``lambdas``) this many candidates after the best
            one (None: try them all).
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
        reg_diagonal: float | None = None,
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
        self.reg_diagonal = _check_reg(reg_diagonal, "reg_diagonal")
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
    def _nu(self, k: int) -> float:
        return k / 100 if self.reg_diagonal is None else self.reg_diagonal

    def _penalty(self, k: int, reg_lambda: float, reg_mu: float):
        return odir_penalty(k, reg_lambda, reg_mu, reg_diagonal=self._nu(k))

    def _fit_final(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        reg_lambda: float,
        reg_mu: float,
        x0: torch.Tensor,
        progress_bar: bool,
        precondition=None,
    ) -> tuple[torch.Tensor, float, int, int]:
        """The fit on the whole set: float32 products down to ``CV_TOL``, then float64 throughout down to ``tol`` (the
        minimiser is the float64 objective's), both preconditioned by per-class curvature blocks (the search's, when
        it ran; else at the start, and again at the float32 solution); returns (parameters, objective, iterations,
        evaluations)."""
        penalty = self._penalty(features.shape[1], reg_lambda, reg_mu)
        common = {
            "penalty": penalty,
            "blocks": True,
            "precondition": precondition,
            "progress_bar": progress_bar,
            "desc": type(self).__name__,
        }
        rough = fit_affine(
            AffineNLL(features, labels, products=CV_PRODUCTS, softmax=CV_PRODUCTS),
            x0,
            max_iter=self.max_iter,
            tol=max(self.tol, CV_TOL),
            rounds=1 if precondition is not None else 2,
            **common,
        )
        if rough.iterations >= self.max_iter:
            return rough.x, rough.objective, rough.iterations, rough.evaluations
        exact = fit_affine(
            AffineNLL(features, labels),
            rough.x,
            max_iter=self.max_iter - rough.iterations,
            tol=self.tol,
            rounds=1,
            **common,
        )
        return exact.x, exact.objective, rough.iterations + exact.iterations, rough.evaluations + exact.evaluations

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _memory_needed(self, num_samples: int, num_classes: int) -> int:
        return k_squared_memory(num_samples, num_classes)

    def _memory_reason(self, num_samples: int, num_classes: int) -> str:
        return k_squared_reason(num_samples, num_classes)

    def _fit(
        self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool
    ) -> dict[str, Any]:
        k = logits.shape[1]
        self._resize(k)
        with torch.no_grad():
            features = self._features(torch.from_numpy(logits).double())
        y = torch.from_numpy(labels).long()
        info: dict[str, Any] = {}
        searched = self.reg_lambda is None or (self.reg_mu is None and self.mus is not None)
        try:
            if searched:
                if len(y) < self.cv:
                    raise ValueError(
                        f"Expected at least `cv` = {self.cv} labelled samples to choose lambda and mu by cross-validation, but got {len(y)}."
                    )
                search = _Search(self, logits, features, y)
                reg_lambda, reg_mu, x0 = search.run(progress_bar)
                info.update(search.report())
                precondition = affine_preconditioner(
                    search.whole, None, self._penalty(k, reg_lambda, reg_mu), search.curvature
                )
            else:
                reg_lambda = self.reg_lambda
                reg_mu = reg_lambda / (k - 1) if self.reg_mu is None else self.reg_mu
                x0, precondition = identity_parameters(k), None
            x, objective, iterations, evaluations = self._fit_final(
                features, y, reg_lambda, reg_mu, x0, progress_bar, precondition
            )
        except FloatingPointError:
            # a class the fit set never (or hardly) shows can be pushed to -inf
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
        info.update(
            {
                "reg_lambda": reg_lambda,
                "reg_mu": reg_mu,
                "reg_diagonal": self._nu(k),
                "steps": iterations,
                "evaluations": evaluations,
                "best_objective": objective,
                "nll": nll,
            }
        )
        if searched and info["cv_nll"] > info["cv_nll_temperature_scaling"]:
            logger.warning(
                "%s's cross-validated NLL (%.4f at lambda = %g, mu = %g) is above temperature scaling's on the same folds "
                "(%.4f): %d labelled samples are too few for its K^2 + K = %d parameters. A calibrator with fewer parameters "
                "should do better: %s.",
                type(self).__name__,
                info["cv_nll"],
                reg_lambda,
                reg_mu,
                info["cv_nll_temperature_scaling"],
                len(y),
                k * k + k,
                SMALLER,
            )
        return info

    def _card_regularisation(self) -> str:
        info = self.fit_info_ or {}
        lam, mu = info.get("reg_lambda"), info.get("reg_mu")
        if lam is None:
            return "off-diagonal and intercept regularisation (ODIR)"
        how = f"chosen by {self.cv}-fold cross-validation on the calibration set" if "cv" in info else "given"
        nu = info.get("reg_diagonal")
        diagonal = f", and the diagonal shrunk towards its mean with nu = {nu:g}" if nu else ""
        return f"off-diagonal and intercept regularisation (ODIR, lambda = {lam:g}, mu = {mu:g}, {how}){diagonal}"

    def _card_description(self) -> str:
        return (
            f"It maps the logits z to softmax(W z + b) with a full K x K matrix W and bias b (matrix scaling), fitted by NLL "
            f"with {self._card_regularisation()} as in Kull et al. 2019."
        )


class _Search:
    """The cross-validated choice of (lambda, mu) for one fit: folds, warm starts, the candidates tried."""

    def __init__(self, owner: MatrixScaling, logits: np.ndarray, features: torch.Tensor, labels: torch.Tensor):
        self.owner, self.k, self.n = owner, features.shape[1], len(labels)
        splits = stratified_folds(labels.numpy(), owner.cv, owner.cv_seed)
        self.splits = splits
        self.folds = [
            _Fold(
                AffineNLL(features[tr], labels[tr], products=CV_PRODUCTS, softmax=CV_PRODUCTS),
                AffineNLL(features[va], labels[va]),
                len(va) / self.n,
            )
            for tr, va in splits
        ]
        self.logits, self.labels = logits, labels.numpy()
        self.whole = AffineNLL(features, labels)
        self.curvature: AffineCurvature | None = None
        self.table: list[dict] = []
        self.solutions: dict[tuple[float, float], list[torch.Tensor]] = {}  # the best's and the last one's, per fold
        self.best: tuple[float, float] | None = None
        self.fold_scores: dict[tuple[float, float], list[float]] = {}
        self.temperatures, self.ts_score = self._temperature_scaling()
        self.bar = None
        self._pre, self._pre_key = None, None
        self.evaluations = 0

    # ------------------------------------------------------------------ one candidate
    def _nearest(self, lam: float, mu: float) -> tuple[tuple[float, float] | None, list[torch.Tensor] | None]:
        """The solved candidate nearest to (lam, mu) in log scale: its (lam, mu) and its per-fold solutions."""
        if not self.solutions:
            return None, None
        return min(
            self.solutions.items(),
            key=lambda item: (
                abs(math.log(max(item[0][0], 1e-300) / max(lam, 1e-300)))
                + abs(math.log(max(item[0][1], 1e-300) / max(mu, 1e-300)))
            ),
        )

    def _predicted(
        self, x: torch.Tensor, old: QuadraticPenalty, new: QuadraticPenalty, shared: Preconditioner | None
    ) -> torch.Tensor:
        """One Newton step from the solution ``x`` for the penalty ``old`` to the one for ``new``: the new objective's
        gradient at ``x`` is the penalties' difference's (the data part was ~0 with ``old``; the diagonal's weight,
        ``reg_diagonal``, is the same for both). Only a warm start: the fit that follows converges from where it lands."""
        if shared is None or shared.newton is None:
            return x
        k = self.k
        g = torch.empty_like(x)
        w = x[: k * k].view(k, k)
        gw = g[: k * k].view(k, k)
        torch.mul(w, 2 * (new.off_diagonal - old.off_diagonal), out=gw)
        gw.diagonal().zero_()
        torch.mul(x[k * k :], 2 * (new.bias - old.bias), out=g[k * k :])
        return x - shared.newton(g)

    def score(self, lam: float, mu: float) -> float:
        """The mean held-out NLL of (lam, mu) over the folds (each fit warm from the nearest candidate seen). A
        candidate worse than the best on each of the first ``RACE_FOLDS`` folds or more, by more than ``RACE_MARGIN``
        (relative) on average, is not fitted on the others: its score is then the mean over the folds it was fitted on."""
        key = (lam, mu)
        for row in self.table:
            if (row["reg_lambda"], row["reg_mu"]) == key:
                return row["cv_nll"]
        owner, (near, starts) = self.owner, self._nearest(lam, mu)
        penalty = owner._penalty(self.k, lam, mu)
        shared = self._preconditioner(lam, penalty)
        if starts is not None:
            old = owner._penalty(self.k, *near)
            predicted = [self._predicted(x, old, penalty, shared) for x in starts]
        best = None if self.best is None else self.fold_scores[self.best]
        scores, solutions, evaluations = [], [], 0
        for f, fold in enumerate(self.folds):
            if starts is not None:
                x0 = predicted[f]
                if f > 0:  # the move fold 0 made from the same start predicts this fold's
                    x0 = x0 + (solutions[0] - predicted[0])
            else:  # the first candidate: from temperature scaling's fit on the same fold (W = I / T)
                x0 = identity_parameters(self.k) / torch.cat(
                    [torch.full((self.k * self.k,), self.temperatures[f]), torch.ones(self.k)]
                )
            result = fit_affine(
                fold.train,
                x0,
                penalty=penalty,
                max_iter=owner.max_iter,
                tol=max(owner.tol, CV_TOL),
                rounds=CV_ROUNDS,
                precondition=shared,
            )
            if self.curvature is None:  # one curvature for every later fit, at the first solution (~ every fold's)
                self.curvature = affine_curvature(self.whole, result.x, blocks=True)
                shared = self._preconditioner(lam, penalty)
            evaluations += result.evaluations
            solutions.append(result.x)
            with torch.no_grad():
                scores.append(float(fold.held_out(result.x)))
            if best is not None and len(scores) < len(self.folds):
                excess = [s - b for s, b in zip(scores, best)]
                margin = (
                    RACE_MARGIN
                    * (1 if len(scores) >= RACE_FOLDS else RACE_FIRST)
                    * sum(best[: len(scores)])
                    / len(scores)
                )
                if min(excess) > 0 and sum(excess) / len(excess) > margin:
                    break
        self.evaluations += evaluations
        weights = [fold.weight for fold in self.folds[: len(scores)]]
        score = sum(s * w for s, w in zip(scores, weights)) / sum(weights)
        self.table.append(
            {"reg_lambda": lam, "reg_mu": mu, "cv_nll": score, "folds": len(scores), "evaluations": evaluations}
        )
        if self.bar is not None:
            self.bar.update(1)
        self.fold_scores[key] = scores
        if len(scores) == len(self.folds) and (self.best is None or score < self.table_score(self.best)):
            self.best = key
        keep = {key, self.best}
        self.solutions = {k: v for k, v in self.solutions.items() if k in keep}
        if len(solutions) == len(self.folds):
            self.solutions[key] = solutions
        return score

    def _preconditioner(self, lam: float, penalty):
        """The shared curvature's preconditioner for this lambda (None before the first fit has given a curvature). One
        per lambda: a candidate that changes only mu changes only the bias's curvature, and reuses it (still an exact
        change of variables, slightly less well scaled; factoring the K blocks again cost as much as a fold's fit)."""
        if self.curvature is None:
            return None
        if self._pre_key != lam:
            self._pre, self._pre_key = (
                affine_preconditioner(self.whole, None, penalty, self.curvature, CV_PRODUCTS),
                lam,
            )
        return self._pre

    def table_score(self, key: tuple[float, float]) -> float:
        return next(row["cv_nll"] for row in self.table if (row["reg_lambda"], row["reg_mu"]) == key)

    # ------------------------------------------------------------------ the walks
    def walk(
        self,
        candidates: Sequence[tuple[float, float]],
        patience: int | None,
        plateau: float = 0.0,
        flat_steps: int | None = None,
    ) -> None:
        """Try ``candidates`` in order until ``patience`` of them in a row have not beaten the best (None: all); with
        ``plateau``, a candidate within that (relative) of the best does not count against the patience, but
        ``flat_steps`` of those in a row end the walk (None: crossed to the end)."""
        since, flat = 0, 0
        for lam, mu in candidates:
            before = self.best
            score = self.score(lam, mu)
            complete = len(self.fold_scores[(lam, mu)]) == len(self.folds)  # not stopped early as a clear loser
            if self.best != before:
                since, flat = 0, 0
            elif plateau and complete and score <= self.table_score(self.best) * (1 + plateau):
                flat += 1
            else:
                since, flat = since + 1, 0
            if (patience is not None and since >= patience) or (flat_steps is not None and flat >= flat_steps):
                break

    def run(self, progress_bar: bool) -> tuple[float, float, torch.Tensor]:
        owner, k = self.owner, self.k
        explicit = owner.lambdas is not None or owner.mus is not None or owner.reg_lambda is not None
        lambdas = (owner.reg_lambda,) if owner.reg_lambda is not None else (owner.lambdas or self._decades(k * (k - 1)))
        grid = (
            len(lambdas) * len(owner.mus or (1,)) if explicit else len(lambdas) * (1 + len(LAMBDA_STEPS)) * len(lambdas)
        )
        # the bar counts the candidates fitted, out of the grid's size (the search ends it at 100 % when it stops early)
        with _progress.progress_bar(total=grid, desc=f"{type(owner).__name__} CV", enabled=progress_bar) as self.bar:
            if explicit:
                for i, lam in enumerate(lambdas):
                    mus = (
                        owner.mus
                        if owner.mus is not None
                        else (lam / (k - 1) if owner.reg_mu is None else owner.reg_mu,)
                    )
                    before = len(self.table)
                    self.walk(
                        [(lam, mu) for mu in (mus if i % 2 == 0 else mus[::-1])], None
                    )  # snake: neighbours warm-start
                    if (
                        owner.cv_patience is not None
                        and len(self.table) > before
                        and self._since_best_lambda(lambdas[: i + 1]) >= owner.cv_patience
                    ):
                        break
            else:
                self._paper_search()
            _progress.finish(self.bar, self.bar.n)
        self.bar = None
        lam, mu = self.best
        return lam, mu, torch.stack(self.solutions[self.best]).mean(0)

    def _since_best_lambda(self, lambdas: Sequence[float]) -> int:
        """How many of the lambdas tried (in order) came after the best one."""
        return len(lambdas) - 1 - list(lambdas).index(self.best[0])

    def _decades(self, scale: float) -> list[float]:
        return [scale * 10.0**i for i in grid_exponents(self.k)]

    def _paper_search(self) -> None:
        """The authors' grid, visited where it can win: lambda's decades (mu tied, or the given ``reg_mu``) from the
        strongest down; mu's decades either side of the tie (not when ``reg_mu`` is given); lambda's in-between points
        either side of the best decade."""
        k, patience, fixed_mu = self.k, self.owner.cv_patience, self.owner.reg_mu
        lambdas, mus = self._decades(k * (k - 1)), self._decades(k)
        self.walk([(lam, mu if fixed_mu is None else fixed_mu) for lam, mu in zip(lambdas, mus)], patience, PLATEAU)
        if fixed_mu is None:
            lam, tied = self.best
            at = mus.index(min(mus, key=lambda m: abs(math.log(m / tied))))
            for side in (
                mus[at + 1 :],
                mus[:at][::-1],
            ):  # weaker mus, then stronger ones; mu's curve is mostly flat too
                self.walk([(lam, m) for m in side], 1, PLATEAU, MU_FLAT_STEPS)
        lam, mu = self.best
        top = lambdas[0]
        for side in (
            [lam * s for s in LAMBDA_STEPS[::-1]],
            [lam * 10 * s for s in LAMBDA_STEPS],
        ):  # weaker, then stronger; nearest first
            self.walk([(value, mu) for value in side if value <= top * (1 + 1e-12)], 1)

    # ------------------------------------------------------------------ the report
    def _temperature_scaling(self) -> tuple[list[float], float]:
        """Temperature scaling on the same folds: each fold's T (the first candidate's start, ``W = I / T``) and the mean
        held-out NLL (the baseline a K^2 + K fit must beat)."""
        from hf_calibration.calibrators._machinery.fitting.partition import scaled_nll
        from hf_calibration.calibrators.temperature import nll_temperature

        temperatures, score = [], 0.0
        for (train, val), fold in zip(self.splits, self.folds):
            # (its fit alone: a fold may hold fewer samples than a user-facing fit's minimum)
            t = nll_temperature(np.ascontiguousarray(self.logits[train]), self.labels[train])
            temperatures.append(t)
            score += (
                scaled_nll(np.ascontiguousarray(self.logits[val]), np.ascontiguousarray(self.labels[val]), 1 / t)[0]
                * fold.weight
            )
        return temperatures, score

    def report(self) -> dict[str, Any]:
        return {
            "cv": self.table,
            "cv_nll": self.table_score(self.best),
            "cv_nll_temperature_scaling": self.ts_score,
            "cv_evaluations": self.evaluations,
        }
