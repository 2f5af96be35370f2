"""Class-based temperature scaling (CTS; Frenkel & Goldberger 2021, EUSIPCO): one temperature per class.

    z_ik -> z_ik / T_k                                   (K parameters)

Since ECE is not differentiable, the temperatures are found by a greedy grid search on the calibration set:
start every ``T_k`` at the temperature-scaling solution (NLL, clipped to the grid's range); then, for several
sweeps over the classes, set ``T_k`` to the grid value with the lowest 15-bin ECE, the other temperatures
fixed, if that improves the ECE without lowering the calibration-set accuracy. The grid (0.5 to 5.0 by 0.1),
the 5 sweeps, the initialisation and the accuracy condition are those of the SMART paper's comparison code;
classes without a calibration sample keep the initial temperature. A sweep that changes nothing ends the
search (the next would repeat it). ECE improvements below 1e-12 are rounding noise and not taken.

Different temperatures per class reorder a row's logits, so the predicted class can change
(``preserves_argmax = False``). The search is exact and fast: ``_machinery/fitting/cts_search.py`` updates each row's summary in
O(1) per candidate instead of recomputing a softmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_calibration._core import progress as _progress
from hf_calibration._core.checks import check_float, check_int
from hf_calibration._core.threads import ThreadCountChooser, torch_single_threaded
from hf_calibration.calibrators._machinery.fitting import cts_search as search
from hf_calibration.calibrators._machinery.per_class import PerClassCalibrator
from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.metrics.binning import uniform_edges

DEFAULT_GRID = tuple(float(t) for t in np.round(np.linspace(0.5, 5.0, 46), 12))
ECE_TIE = 1e-12  # an ECE improvement smaller than this is rounding noise


@register_calibrator
class ClassBasedTemperatureScaling(
    PerClassCalibrator,
    tags=["class-based-temperature-scaling"],
    paper_url="https://cris.iucc.ac.il/en/publications/network-calibration-by-class-based-temperature-scaling/",
):
    """CTS: ``z_ik / T_k`` with one temperature per class, chosen by a greedy grid search on the ECE.

    ``fit(objective=...)`` names the objective of the initial temperature scaling (NLL); the per-class search
    itself minimises the ECE with ``n_bins`` equal-width bins. Needs at least ``min_samples = 10`` labelled samples.

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
        grid: candidate temperatures (default 0.5, 0.6, ..., 5.0).
        sweeps: passes over the classes at most (5).
        n_bins: ECE bins (15).
        accuracy_tolerance: a candidate may lower the calibration-set accuracy by at most this (fraction; 0).
            None drops the condition.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import ClassBasedTemperatureScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 5, (500,), generator=g)
        >>> logits = 3 * torch.randn(500, 5, generator=g) + 6 * torch.nn.functional.one_hot(labels, 5)
        >>> cts = ClassBasedTemperatureScaling().fit(logits, labels, progress_bar=False)
        >>> cts.temperatures.shape
        torch.Size([5])
    """

    kind = "cts"
    paper_citation = "L. Frenkel, J. Goldberger, *Network Calibration by Class-based Temperature Scaling*, EUSIPCO 2021"
    min_samples = 10

    def __init__(
        self,
        num_classes: int | None = None,
        grid: Sequence[float] = DEFAULT_GRID,
        sweeps: int = 5,
        n_bins: int = 15,
        accuracy_tolerance: float | None = 0.0,
    ):
        super().__init__(num_classes)
        if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or len(grid) == 0:
            raise TypeError(f"Expected argument `grid` to be a non-empty sequence of temperatures, but got {grid!r}.")
        self.grid = tuple(check_float(t, "grid", minimum=0, min_inclusive=False) for t in grid)
        self.sweeps = check_int(sweeps, "sweeps", minimum=1)
        self.n_bins = check_int(n_bins, "n_bins", minimum=1)
        self.accuracy_tolerance = (
            None
            if accuracy_tolerance is None
            else check_float(accuracy_tolerance, "accuracy_tolerance", minimum=0, maximum=1)
        )

    def _allocate(self, k: int) -> None:
        self.temperatures = nn.Parameter(torch.ones(k, dtype=torch.float64), requires_grad=False)

    def _check_state(self, where: str) -> None:
        t = self.temperatures.detach()
        if not bool((t > 0).all()):
            raise ValueError(
                f"The calibrator weights {where!r} are corrupted: a class temperature is not positive ({float(t.min()):.6g})."
            )

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        return z / self.temperatures.to(device=z.device, dtype=z.dtype)

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit(
        self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool
    ) -> dict[str, Any]:
        from hf_calibration.calibrators.temperature import TemperatureScaling

        n, k = logits.shape
        self._resize(k)
        grid = np.asarray(self.grid, dtype=np.float64)
        initial = TemperatureScaling().fit(logits, labels, objective=objective, progress_bar=False).fitted_temperature
        temperatures = np.full(k, float(np.clip(initial, grid.min(), grid.max())))
        inv_t = 1.0 / temperatures
        grid_inv = 1.0 / grid
        edges = uniform_edges(self.n_bins)
        z, y = np.ascontiguousarray(logits), np.ascontiguousarray(labels, dtype=np.int64)
        v1, v2, tot = np.empty(n), np.empty(n), np.empty(n)
        j1, j2 = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        # every parallel kernel runs on the thread count its timing favours (a busy machine stalls parallel regions)
        step, summarise, update = (
            ThreadCountChooser(f) for f in (search.candidate_bins, search.summarise, search.update_column)
        )
        summarise(z, inv_t, v1, j1, v2, j2, tot)
        best_gap, best_correct = search.current_bins(y, j1, tot, edges)
        initial_ece = best_gap / n
        slack = np.inf if self.accuracy_tolerance is None else self.accuracy_tolerance * n + 1e-9
        classes = np.unique(y)
        sweeps, updates = 0, 0
        with _progress.progress_bar(total=self.sweeps * len(classes), desc="CTS", enabled=progress_bar) as bar:
            for sweeps in range(1, self.sweeps + 1):  # noqa: B007 - the count of sweeps run is read after the loop
                summarise(z, inv_t, v1, j1, v2, j2, tot)  # from scratch: no rounding carried across sweeps
                changed = False
                for c in classes:
                    gaps, correct = step(z, y, int(c), inv_t, grid_inv, v1, j1, v2, j2, tot, edges)
                    choice, best = -1, best_gap
                    for g in range(len(grid)):  # the lowest ECE that keeps the accuracy; the first one on ties
                        if gaps[g] < best - ECE_TIE * n and correct[g] >= best_correct - slack:
                            choice, best = g, gaps[g]
                    if choice >= 0 and grid[choice] != temperatures[c]:
                        old = inv_t[c]
                        temperatures[c], inv_t[c] = grid[choice], grid_inv[choice]
                        update(z, int(c), old, inv_t, v1, j1, v2, j2, tot)
                        best_gap, best_correct = gaps[choice], int(correct[choice])
                        changed, updates = True, updates + 1
                    bar.update(1)
                if not changed:
                    break
            _progress.finish(bar, bar.n)  # a sweep that changes nothing ends the search: close at 100 %
        with torch.no_grad():
            self.temperatures.copy_(torch.from_numpy(temperatures))
        return {
            "initial_temperature": initial,
            "search_criterion": f"ece ({self.n_bins} bins)",
            "search_ece_before": float(initial_ece),
            "search_ece_after": float(best_gap / n),
            "sweeps": sweeps,
            "updates": updates,
        }

    def _card_description(self) -> str:
        return (
            "It divides each class's logit by that class's own temperature T_k, chosen by a greedy grid search on the "
            "calibration-set ECE (class-based temperature scaling, Frenkel & Goldberger 2021)."
        )
