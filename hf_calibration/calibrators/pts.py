"""Parameterized temperature scaling (PTS; Tomani, Cremers, Buettner 2022, ECCV): a per-sample temperature
predicted by a small MLP from the sorted top-k logits.

    x_i  = the k largest of clip(z_i - max_k z_ik, -c, c), in descending order        (k = 10, c = 100)
    T_i  = |MLP(x_i)|,  MLP = Linear(k, 5) -> ReLU -> Linear(5, 5) -> ReLU -> Linear(5, 1)
    z_i -> z_i / T_i

(the paper's and its official code's settings: top 10 logits, two hidden layers of 5 units, |.| of the last
layer, a mean-squared-error loss, i.e. the Brier score up to the factor K). Dividing a row by a positive number
keeps its order, so the predicted class never changes.

Choices of ours, each measured on 8 synthetic draws whose right temperature varies with the logits:

* the MLP sees the logits relative to their row maximum (the paper feeds the raw logits), so that the temperature,
  and the map, are the same for ``z`` and ``z + c``: logits and log-probabilities of one prediction are calibrated
  alike. The clip only shapes the MLP's input (the division uses the logits themselves);
* instead of ~100k mini-batch Adam steps from a random start, full-batch float64 LBFGS from temperature scaling:
  the last layer starts as the constant fitted ``T`` (weights 0), so the fit never ends worse than temperature
  scaling on its objective (plus the weight penalty), and each hidden unit's bias starts where the unit is active
  on half the fit set (see ``_reset``);
* run to convergence, that fit overfits: it closed 13-72 % of the held-out Brier gap between temperature scaling
  and the true temperatures. The official code's L2 weight decay on the weight matrices, at 1e-3 by default,
  closes 75-97 %.

The objective is evaluated through ``LogPartitionTable`` (O(N) per step after one pass over the logits, relative
error below 1e-4). With fewer than k classes the sorted logits are padded with the smallest one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_float, check_int, check_seed
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration.calibrators._machinery.fitting.lbfgs import l2_penalty, minimize
from hf_calibration.calibrators._machinery.fitting.partition import LogPartitionTable
from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._machinery.scaling import TemperatureCalibrator
from hf_calibration.calibrators.objectives import get_objective

T_FLOOR, T_CEIL = 1e-12, 1e12  # the official code's clip of |MLP| before dividing


@register_calibrator
class ParameterizedTemperatureScaling(
    TemperatureCalibrator,
    tags=["parameterized-temperature-scaling", "temperature-scaling"],
    paper_url="https://arxiv.org/abs/2102.12182",
):
    """PTS: ``T_i = |MLP(top-k sorted logits)|``, fitted by the Brier score (the paper's MSE) from temperature scaling.

    Needs at least ``min_samples = 50`` labelled samples. Deterministic given ``seed`` (the hidden layers'
    initialisation; the rest is full-batch). A fit on at most 1,000 samples checks itself on held-out data (5 folds of
    the fit set) and warns (``HeldOutWorseWarning``) when it leaves the held-out NLL worse than the uncalibrated
    model's (``_machinery/fitting/held_out.py``).

    Args:
        top_k: how many of the largest logits the MLP sees (10).
        hidden_layers: hidden layers of the MLP (2).
        hidden_size: units per hidden layer (5).
        clip: the MLP's inputs are clipped to [-clip, clip] (100, the official code's clip of the logits).
        weight_decay: L2 penalty on the MLP's weight matrices, added to the objective (1e-3, see above).
        max_iter: LBFGS iterations at most.
        seed: seed of the hidden layers' initialisation.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import ParameterizedTemperatureScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> logits = 3 * torch.randn(500, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> pts = ParameterizedTemperatureScaling().fit(logits, labels, progress_bar=False)
        >>> bool(torch.equal(pts(logits).argmax(1), logits.argmax(1)))
        True
    """

    kind = "pts"
    paper_citation = (
        "C. Tomani, D. Cremers, F. Buettner, *Parameterized Temperature Scaling for Boosting the Expressive Power in "
        "Post-Hoc Uncertainty Calibration*, ECCV 2022"
    )
    min_samples = 50
    held_out_check = True  # tens of parameters, a non-convex fit: see _machinery/fitting/held_out.py
    default_objective = "brier"
    objectives = ("brier", "nll")

    def __init__(
        self,
        top_k: int = 10,
        hidden_layers: int = 2,
        hidden_size: int = 5,
        clip: float = 100.0,
        weight_decay: float = 1e-3,
        max_iter: int = 500,
        seed: int = 0,
    ):
        super().__init__()
        self.top_k = check_int(top_k, "top_k", minimum=1)
        self.hidden_layers = check_int(hidden_layers, "hidden_layers", minimum=0)
        self.hidden_size = check_int(hidden_size, "hidden_size", minimum=1)
        self.clip = check_float(clip, "clip", minimum=0, min_inclusive=False)
        self.weight_decay = check_float(weight_decay, "weight_decay", minimum=0)
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.seed = check_seed(seed)
        sizes = [self.top_k] + [self.hidden_size] * self.hidden_layers + [1]
        self.layers = nn.ModuleList(nn.Linear(a, b, dtype=torch.float64) for a, b in zip(sizes[:-1], sizes[1:]))
        self._reset()

    def _reset(self, inputs: torch.Tensor | None = None) -> None:
        """Seeded PyTorch-default init of the hidden layers; the last layer is the constant 1 (weights 0, bias 1).

        With the fit's ``inputs``, each hidden unit's bias is then shifted so that it is active on half of them (its
        median pre-activation is 0): a unit dead on every input gets no gradient, and with every unit of a layer
        dead the fit cannot leave temperature scaling (seen on 1 of 8 synthetic draws).
        """
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            h = inputs
            for layer in self.layers[:-1]:
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
                if h is not None:
                    pre = torch.addmm(layer.bias, h, layer.weight.t())
                    layer.bias.sub_(pre.median(dim=0).values)
                    h = torch.relu(pre - pre.median(dim=0).values)
            self.layers[-1].weight.zero_()
            self.layers[-1].bias.fill_(1.0)

    # ------------------------------------------------------------------ the map
    @staticmethod
    def relative_logits(z: torch.Tensor) -> torch.Tensor:
        """``z - max z`` per row, rounded to float32 (then float64): the same numbers, bit for bit, for logits and for
        log-probabilities of one prediction (their float64 differences agree to ~1e-15; the fit is non-convex, and
        such differences were enough to send LBFGS to another local minimum)."""
        x = z.double()
        return (x - x.amax(dim=1, keepdim=True)).float().double()

    def sorted_inputs(self, z: torch.Tensor) -> torch.Tensor:
        """The MLP's input: the ``top_k`` largest of ``clip(z - max z)`` per row, descending, float64 (N, top_k)."""
        x = self.relative_logits(z).clamp(-self.clip, self.clip)
        k = min(self.top_k, x.shape[1])
        top = torch.topk(x, k, dim=1).values
        if k < self.top_k:  # fewer classes than inputs: repeat the smallest
            top = torch.cat([top, top[:, -1:].expand(-1, self.top_k - k)], dim=1)
        return top

    def _mlp(self, x: torch.Tensor, params: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``MLP(x)`` (N,) with the module's weights, or with ``params = [W_1, b_1, ..., W_L, b_L]``."""
        if params is None:
            params = [p for layer in self.layers for p in (layer.weight, layer.bias)]
        h = x
        for i in range(0, len(params), 2):
            h = torch.addmm(params[i + 1], h, params[i].t())
            if i + 2 < len(params):
                h = torch.relu(h)
        return h[:, 0]

    def temperature_of_inputs(self, x: torch.Tensor, params: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``T = clip(|MLP(x)|, 1e-12, 1e12)`` (N,) for sorted inputs ``x``."""
        t = self._mlp(x, params).abs()
        return torch.minimum(
            torch.maximum(t, _graph.constant(t, T_FLOOR)), _graph.constant(t, T_CEIL)
        )  # float64 in a graph too

    def _temperature(self, z: torch.Tensor) -> torch.Tensor:
        device = self.layers[0].weight.device
        t = self.temperature_of_inputs(self.sorted_inputs(z).to(device))
        return t.detach().to(device=z.device, dtype=z.dtype)[:, None]

    def _card_temperature(self) -> str:
        return (
            f"a per-sample temperature T = |MLP(top-{self.top_k} sorted logits)| "
            f"({self.hidden_layers} hidden layers of {self.hidden_size}; parameterized temperature scaling, Tomani et al. 2022)"
        )

    # ------------------------------------------------------------------ fitting
    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit(
        self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool
    ) -> dict[str, Any]:
        relative = self.relative_logits(torch.from_numpy(logits))
        table = LogPartitionTable(relative.float().numpy(), labels)  # the same rounded logits as the MLP's input
        x = self.sorted_inputs(relative)
        self._reset(x)
        fn = get_objective(objective)
        shapes = [p.shape for layer in self.layers for p in (layer.weight, layer.bias)]
        sizes = [math.prod(s) for s in shapes]

        def unflatten(theta: torch.Tensor) -> list[torch.Tensor]:
            return [part.view(shape) for part, shape in zip(torch.split(theta, sizes), shapes)]

        def loss(theta: torch.Tensor) -> torch.Tensor:
            t = self.temperature_of_inputs(x, unflatten(theta))
            return fn(table.stats(1.0 / t, sum_p_sq=objective == "brier"), **kw)

        theta = torch.cat([p.detach().reshape(-1) for layer in self.layers for p in (layer.weight, layer.bias)])
        # 1. temperature scaling: only the last bias moves (the MLP is the constant |b|)
        last = theta.numel() - 1
        first = minimize(
            lambda b: loss(torch.cat([theta[:last], b])),
            theta[last:],
            max_iter=self.max_iter,
            progress_bar=progress_bar,
            desc="PTS (temperature scaling)",
        )
        theta = torch.cat([theta[:last], first.x])
        # 2. every parameter, from there
        mask = torch.cat([torch.full((n,), len(s) == 2) for n, s in zip(sizes, shapes)])  # weight matrices only
        penalty = l2_penalty(self.weight_decay, mask) if self.weight_decay > 0 else None
        second = minimize(loss, theta, penalty=penalty, max_iter=self.max_iter, progress_bar=progress_bar, desc="PTS")
        with torch.no_grad():
            for p, value in zip((p for layer in self.layers for p in (layer.weight, layer.bias)), unflatten(second.x)):
                p.copy_(value)
        return {
            "temperature_scaling": float(abs(first.x[0])),
            "temperature_scaling_objective": first.objective,
            "steps": first.iterations + second.iterations,
            "best_objective": second.objective,
        }
