"""Vector scaling (Guo et al. 2017, Sec. 4.2): ``z -> w * z + b``, one weight and one bias per class (2K parameters)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from .._checks import check_float, check_int
from ._affine import AffineNLL, fit_affine, identity_parameters
from ._per_class import PerClassCalibrator
from ._registry import register_calibrator
from ._threads import torch_single_threaded


@register_calibrator
class VectorScaling(PerClassCalibrator, tags=["vector-scaling"], paper_url="https://arxiv.org/abs/1706.04599"):
    """Vector scaling: ``softmax(w * z + b)`` with per-class ``w`` (K) and ``b`` (K), fitted by NLL.

    Starts from the identity (``w = 1``, ``b = 0``) and minimises the validation NLL with full-batch float64
    LBFGS (strong-Wolfe line search, preconditioned by the Gauss-Newton curvature), unregularised as in Guo et
    al. 2017. The per-class weights make it a
    non-monotone map of each row: it may change the predicted class (``preserves_argmax = False``).
    Needs at least ``min_samples = 10`` labelled samples.

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
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
    min_samples = 10

    def __init__(self, num_classes: int | None = None, max_iter: int = 500, tol: float = 1e-10):
        super().__init__(num_classes)
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.tol = check_float(tol, "tol", minimum=0)

    def _allocate(self, k: int) -> None:
        self.weight = nn.Parameter(torch.ones(k, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(k, dtype=torch.float64))

    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return z * self.weight.to(device=z.device, dtype=z.dtype) + self.bias.to(device=z.device, dtype=z.dtype)

    @torch_single_threaded()  # its own heavy steps choose their thread count (_threads.py)
    def _fit(self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict[str, Any]:
        k = logits.shape[1]
        self._resize(k)
        nll = AffineNLL(torch.from_numpy(logits).double(), torch.from_numpy(labels).long(), diagonal=True)
        result = fit_affine(nll, identity_parameters(k, diagonal=True), max_iter=self.max_iter, tol=self.tol,
                            progress_bar=progress_bar, desc="VectorScaling")
        with torch.no_grad():
            self.weight.copy_(result.x[:k])
            self.bias.copy_(result.x[k:])
        return {"steps": result.iterations, "evaluations": result.evaluations, "best_objective": result.objective}

    def _card_description(self) -> str:
        return "It rescales and shifts each class's logit, softmax(w * z + b), with one weight and one bias per class (vector scaling, Guo et al. 2017)."
