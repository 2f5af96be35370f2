"""SMART (Sample Margin-Aware Recalibration of Temperature): a per-sample temperature from the logit margin.

For logits ``z`` with top-two values ``z_(1) >= z_(2)`` (SMART Sec. 3.2, 3.5 and Algorithm 1):

    m     = z_(1) - z_(2)                          (logit margin)
    m_hat = (m - mu_m) / sigma_m                   (fit-set mean / population std, stored as buffers)
    T(m)  = softplus(W2 . ReLU(W1 m_hat + b1) + b2) + 0.1,     hidden size 16: 49 trainable parameters
    z    -> z / T(m)

fitted with full-batch Adam (lr 5e-3, at most 2000 steps, early stopping that restores the best
weights) on Charbonnier-SoftECE (Eq. 6; 15 soft bins, sigma = 0.05, delta = 1e-3) by default.

Where the objective is flat at the initialisation (saturated logits: every confidence rounds to 0 or 1), Adam
cannot move and the fit would return the untrained MLP; instead it warns and falls back to the constant
temperature that temperature scaling fits by NLL, written in SMART's parameters (``W2 = 0``), and records
``fit_info_["fallback"] = "temperature_scaling"``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_float, check_int, check_seed
from hf_calibration._core.numpy_twin import NumpyTwin
from hf_calibration._core.parallel import serial_twin
from hf_calibration.calibrators._machinery.fitting.optim import adam_early_stopping
from hf_calibration.calibrators._machinery.fitting.partition import GRID, LogPartitionTable
from hf_calibration.calibrators._machinery.fitting.rows import MappedRows
from hf_calibration.calibrators._machinery.fitting.smart_step import (
    OBJECTIVE_CODES,
    ThreadCountChooser,
    smart_step,
    workspace,
)
from hf_calibration.calibrators._machinery.forward import apply as _apply
from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.scaling import TemperatureCalibrator
from hf_calibration.calibrators.objectives import get_objective, objective_kwargs

logger = logging.getLogger(__name__)
_FORWARD_TWIN = NumpyTwin(
    _apply._scale_rows, serial_twin(_apply._scale_rows), compile_seconds=0.9, seconds_per_value=2e-8
)

# A fit that lowers its objective by at most this fraction of the initial value may not have learned anything
# (saturated logits: under 0.05 %; real fits of the default objective: 92-99 %, of NLL / Brier on a weak, nearly
# calibrated model: 0.3-0.8 %). Such a fit is compared with temperature scaling on its own objective and falls back
# to it only where temperature scaling does at least as well.
FLAT_IMPROVEMENT = 1e-2


def logit_margin(z: torch.Tensor) -> torch.Tensor:
    """``z_(1) - z_(2)`` per row in float64 (exact for float32 logits; 0 for tied top-two logits)."""
    top2 = torch.topk(z, 2, dim=1).values.double()
    return top2[:, 0] - top2[:, 1]


def _softplus(x: torch.Tensor) -> torch.Tensor:
    """torch's softplus (beta 1, threshold 20) in elementary operations: ONNX Runtime has no float64 Softplus."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(x)))


@register_calibrator
class SMARTCalibrator(
    TemperatureCalibrator,
    tags=["smart", "temperature-scaling"],
    paper_url="https://arxiv.org/abs/2506.23492",
):
    """SMART: ``T(m)`` from the standardised logit margin through a 1-16-1 MLP (49 parameters).

    Needs at least ``min_samples = 50`` labelled samples (the smallest validation set the paper reports).
    Fitting is deterministic given ``seed`` (the MLP's initialisation; the rest is full-batch). A fit on at most 1,000
    samples checks itself on held-out data (5 folds of the fit set) and warns (``HeldOutWorseWarning``) when it leaves
    the held-out NLL worse than the uncalibrated model's (``_machinery/fitting/held_out.py``).
    Method: H. Guo, L. Tao, H. Luo, M. Dong, C. Xu, *Sample Margin-Aware Recalibration of Temperature*
    (arXiv:2506.23492).

    Args:
        hidden_size: width of the hidden layer (16 in the paper).
        eps: the temperature floor added after the softplus (0.1 in the paper).
        lr: Adam learning rate (5e-3 in the paper).
        max_steps: Adam steps at most (2000).
        patience: early stopping: stop after this many steps without lowering the best objective by
            1e-6 relative; the best weights (a deep copy) are restored.
        seed: seed of the MLP's initialisation, in [0, 2**64) (torch's range; negative seeds are refused, as
            everywhere in the package).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import SMARTCalibrator
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> logits = 3 * torch.randn(500, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> smart = SMARTCalibrator(seed=0).fit(logits, labels, progress_bar=False)
        >>> smart.temperature(logits).shape
        torch.Size([500])
    """

    kind = "smart"
    fits_in_blocks = True
    min_samples = 50
    held_out_check = True  # tens of parameters, a non-convex fit: see _machinery/fitting/held_out.py
    default_objective = "charbonnier_soft_ece"
    paper_citation = (
        "H. Guo, L. Tao, H. Luo, M. Dong, C. Xu, *Sample Margin-Aware Recalibration of Temperature*, arXiv:2506.23492"
    )

    def __init__(
        self,
        hidden_size: int = 16,
        eps: float = 0.1,
        lr: float = 5e-3,
        max_steps: int = 2000,
        patience: int = 100,
        seed: int = 0,
    ):
        super().__init__()
        self.hidden_size = check_int(hidden_size, "hidden_size", minimum=1)
        self.eps = check_float(eps, "eps", minimum=0, min_inclusive=False)
        self.lr = check_float(lr, "lr", minimum=0, min_inclusive=False)
        self.max_steps = check_int(max_steps, "max_steps", minimum=1)
        self.patience = check_int(patience, "patience", minimum=1)
        self.seed = check_seed(seed)
        self.hidden = nn.Linear(1, self.hidden_size, dtype=torch.float64)
        self.output = nn.Linear(self.hidden_size, 1, dtype=torch.float64)
        self.register_buffer("margin_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("margin_std", torch.ones((), dtype=torch.float64))
        self._reset()

    def _reset(self) -> None:
        """Seeded PyTorch-default init (U(-1/sqrt(fan_in), 1/sqrt(fan_in))) of both layers."""
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for layer in (self.hidden, self.output):
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)

    def temperature_of_margin(self, margin: torch.Tensor, *, softplus=nn.functional.softplus) -> torch.Tensor:
        """``T(m)`` (float64, shape (N,)) for raw margins ``m`` (differentiable in the MLP's weights)."""
        m_hat = ((margin.double() - self.margin_mean) / self.margin_std)[:, None]
        # elementwise products and a row sum rather than matmuls: each row's T does not depend on the batch
        # it is computed in (BLAS kernels vary with the batch size), so block-wise and whole-tensor calls agree
        hidden = torch.relu(m_hat * self.hidden.weight[:, 0] + self.hidden.bias)
        out = softplus((hidden * self.output.weight[0]).sum(dim=1) + self.output.bias)
        return out + _graph.constant(out, self.eps)  # a float64 tensor, not a Python float

    def _graph_temperature(self, z: torch.Tensor) -> torch.Tensor:
        # the fused kernel's T in torch (float64, as the kernel computes it), cast to z's dtype as the kernel does
        return self.temperature_of_margin(logit_margin(z), softplus=_softplus).to(z.dtype)[:, None]

    def _check_state(self, where: str) -> None:
        std = float(self.margin_std)
        if not (math.isfinite(std) and std > 0):
            raise ValueError(
                f"Expected `margin_std` (the fit set's margin standard deviation, 1 when all margins are equal) to be "
                f"positive, but {where!r} holds {std}: the calibrator is corrupted."
            )

    def _temperature(self, z: torch.Tensor) -> torch.Tensor:
        self._check_state("this SMARTCalibrator")
        if _apply.supports(z) and self.margin_mean.device.type == "cpu":  # the fused kernel's T, as forward uses it
            return _apply.temperatures(z, self._mlp_arrays())[:, None]
        margin = logit_margin(z).to(device=self.margin_mean.device)
        return self.temperature_of_margin(margin).detach().to(device=z.device, dtype=z.dtype)[:, None]

    def _forward_cpu(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        self._check_state("this SMARTCalibrator")
        if self.margin_mean.device.type != "cpu":
            return None
        if z.dtype == torch.float32 and _FORWARD_TWIN.use(z.numel()):
            return _FORWARD_TWIN.run(self._forward_twin, z, out)
        return _apply.scale_rows(z, smart_mlp=self._mlp_arrays(), out=out)

    def _forward_twin(self, z: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor | None:
        """The fused forward in torch for float32 logits, until its compile pays (``_core.numpy_twin``): the kernel's
        ``T`` in float64 (``_graph_temperature``), rounded to float32, and its division. The same bits, but for a
        temperature whose float64 values on the two sides (within an ulp) round to two float32 values: a float32
        rounding midpoint within 1e-16 relative of it, about one row in a billion."""
        if not bool(torch.isfinite(z).all()):
            return None
        return _apply.divide_rows(z, self._graph_temperature(z), out)

    def _mlp_arrays(self) -> tuple:
        """``(margin_mean, margin_std, W1, b1, W2, b2, eps)`` as float64 numpy for the fused CPU kernels."""
        w = self._flat_parameters()
        h = self.hidden_size
        return (
            float(self.margin_mean),
            float(self.margin_std),
            w[:h],
            w[h : 2 * h],
            w[2 * h : 3 * h],
            float(w[3 * h]),
            self.eps,
        )

    def _card_temperature(self) -> str:
        return "a per-sample temperature T(m) = softplus(W2 ReLU(W1 m_hat + b1) + b2) + 0.1 of the standardised logit margin"

    def _fit_rows(self, rows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        if rows.compute_dtype == np.float64:
            # z - max z rounded to float32 (a model's precision): float64 logits and log(softmax) of them differ by
            # ~1e-16, which 2,000 Adam steps on a non-convex objective grew to 6e-3 in the calibrated probabilities;
            # rounded, both are the same numbers. float32 input is used as given (its margins are exact in float64).
            rows = MappedRows(
                rows, lambda block: (block - block.max(axis=1, keepdims=True)).astype(np.float32), dtype=np.float32
            )
        n = rows.shape[0]
        margin = torch.empty(n, dtype=torch.float64)
        for start, block in rows.blocks():  # the margins (float64, as logit_margin gives them), a block at a time
            margin[start : start + block.shape[0]] = logit_margin(torch.from_numpy(block))
        std = float(margin.std(correction=0))
        with torch.no_grad():
            self.margin_mean.fill_(float(margin.mean()))
            self.margin_std.fill_(std if std > 1e-12 else 1.0)  # all margins equal: nothing to standardise
        self._reset()
        table = LogPartitionTable.from_rows(rows, labels)
        m_hat = ((margin - self.margin_mean) / self.margin_std).numpy()
        scratch = workspace(m_hat.shape[0], kw.get("n_bins", 1))
        code = OBJECTIVE_CODES[objective]
        args = (
            m_hat,
            table.fd.reshape(-1).numpy(),
            GRID,
            table.gap_true.numpy(),
            table.correct.numpy(),
            code,
            kw.get("n_bins", 1),
            kw.get("sigma", 1.0),
            kw.get("delta", 0.0),
            self.eps,
        )
        step = ThreadCountChooser(smart_step)
        result = adam_early_stopping(
            self._flat_parameters(),
            lambda x: step(x, *args, scratch, False),
            lr=self.lr,
            max_steps=self.max_steps,
            patience=self.patience,
            progress_bar=progress_bar,
            desc="SMART",
        )
        self._set_flat_parameters(result.x)
        self.history_ = result.history
        info = {"steps": result.steps, "best_step": result.best_step, "best_objective": result.best}
        if result.history[0] - result.best <= FLAT_IMPROVEMENT * abs(result.history[0]):
            # flat at the initialisation (saturated logits): Adam's normalised steps still move the weights and may
            # lower the objective by a few rows near a tie (0.01-0.05 % on logits x 1e3-1e4), leaving an untrained MLP
            info.update(
                self._fall_back_to_temperature_scaling(
                    rows, labels, lambda x: step(x, *args, scratch, False)[0], result
                )
            )
        return info

    def _fall_back_to_temperature_scaling(self, rows, labels: np.ndarray, objective_at, result) -> dict[str, Any]:
        """Where temperature scaling does at least as well on the fit's objective, set a constant ``T(m) = T_ts``
        (``W2 = 0``, ``b2 = softplus^-1(T_ts - eps)``), ``T_ts`` fitted by temperature scaling, and say so; otherwise
        keep the fit. Returns what to add to ``fit_info_``."""
        from hf_calibration.calibrators.temperature import TemperatureScaling

        ts = TemperatureScaling()
        ts._fit_checked(rows, labels, "nll", {}, False, report=False)
        t_ts = ts.fitted_temperature
        excess = max(t_ts - self.eps, 1e-9 * self.eps)  # T(m) >= eps: the closest SMART gets to a smaller T
        x = self._flat_parameters()  # a copy: the trained weights stay until TS is chosen
        h = self.hidden_size
        x[2 * h : 3 * h] = 0.0
        x[3 * h] = excess + math.log(-math.expm1(-excess))  # softplus^-1
        at_ts = float(objective_at(x))
        if at_ts > result.best:  # the small improvement was real: temperature scaling does worse on this objective
            return {}
        self._set_flat_parameters(x)
        t = self.eps + excess
        start = result.history[0]  # 0 where every fit sample is already right at confidence 1 (separable logits)
        lowered = (
            f"by only {100 * (start - result.best) / abs(start):.2g} %"
            if start
            else "by nothing: it is 0 from the start"
        )
        logger.warning(
            "SMART's fit lowered its objective %s (%.6g -> %.6g), and temperature scaling does at least as well "
            "on it (%.6g): the objective is flat on these logits (typically a saturated softmax, confidences rounding to 0 "
            "or 1). Falling back to the constant temperature T = %.4g that temperature scaling fits by NLL "
            "(fit_info_['fallback']).",
            lowered,
            start,
            result.best,
            at_ts,
            t,
        )
        return {"fallback": "temperature_scaling", "temperature": t, "best_objective": at_ts}

    def _flat_parameters(self) -> np.ndarray:
        """``[W1, b1, W2, b2]`` as one float64 vector (the fused step's layout)."""
        parts = (self.hidden.weight[:, 0], self.hidden.bias, self.output.weight[0], self.output.bias)
        return torch.cat([p.detach().double() for p in parts]).numpy().copy()

    def _set_flat_parameters(self, x: np.ndarray) -> None:
        h = self.hidden_size
        x = torch.from_numpy(np.asarray(x, dtype=np.float64))
        with torch.no_grad():
            self.hidden.weight.copy_(x[:h, None])
            self.hidden.bias.copy_(x[h : 2 * h])
            self.output.weight.copy_(x[None, 2 * h : 3 * h])
            self.output.bias.copy_(x[3 * h :])

    def _torch_objective(
        self, logits: np.ndarray, labels: np.ndarray, objective: str = "charbonnier_soft_ece", **options
    ):
        """The fit objective at the current weights through torch autograd (slow reference for the fused step)."""
        kw = objective_kwargs(objective, **options)
        margin = logit_margin(torch.from_numpy(logits)).double()
        table = LogPartitionTable(logits, labels)
        stats = table.stats(1.0 / self.temperature_of_margin(margin), sum_p_sq=objective == "brier")
        return get_objective(objective)(stats, **kw)
