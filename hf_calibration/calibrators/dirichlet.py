"""Dirichlet calibration with ODIR (Kull et al. 2019): ``z -> W log softmax(z) + b``, K^2 + K parameters.

Matrix scaling on the log-probabilities (the paper's Eq. 4, "a linear layer on log-transformed probabilities
followed by a softmax"), with the same ODIR-regularised NLL and the same cross-validated lambda and mu as
``MatrixScaling``. As in the authors' implementation, the probabilities are clipped at the float64 machine
epsilon before the log (``log q >= log(2.2e-16) = -36.04``), so that classes the model rules out completely do not
feed arbitrarily large negative inputs to ``W``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators.matrix import MatrixScaling

LOG_EPS = math.log(np.finfo(np.float64).eps)  # the authors' clip of the probabilities, in log space


@register_calibrator
class DirichletCalibration(
    MatrixScaling, tags=["dirichlet-calibration", "odir"], paper_url="https://arxiv.org/abs/1910.12656"
):
    """Dirichlet calibration with ODIR: ``softmax(W max(log softmax(z), log eps) + b)``; lambda and mu by cross-validation.

    Takes the same arguments as ``MatrixScaling`` (``reg_lambda``, ``reg_mu``, ``reg_diagonal``, ``lambdas``, ``mus``,
    ``cv``, ``cv_patience``, ``cv_seed``, ``max_iter``, ``tol``), and is fitted and cross-validated the same way, with
    the same departures from the paper (``matrix.py``: the diagonal lightly shrunk towards its mean, one refit instead
    of the five fold models' average). From the identity (``W = I``, ``b = 0``) the map returns the model's own
    probabilities. May change the predicted class (``preserves_argmax = False``).
    Needs at least ``min_samples = 10`` labelled samples.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import DirichletCalibration
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 4, (400,), generator=g)
        >>> logits = 3 * torch.randn(400, 4, generator=g) + 6 * torch.nn.functional.one_hot(labels, 4)
        >>> dirichlet = DirichletCalibration(reg_lambda=1.0, reg_mu=1.0).fit(logits, labels, progress_bar=False)
        >>> dirichlet.predict_proba(logits).shape
        torch.Size([400, 4])
    """

    kind = "dirichlet"
    shift_invariant = True  # log softmax(z + c) = log softmax(z)

    def _features(self, z: torch.Tensor) -> torch.Tensor:
        """The clipped log-probabilities ``max(log softmax(z), log eps)``."""
        return torch.log_softmax(z, dim=1).clamp_min(LOG_EPS)

    def _card_description(self) -> str:
        return (
            f"It maps the log-probabilities log q to softmax(W log q + b) with a full K x K matrix W and bias b (Dirichlet "
            f"calibration, Kull et al. 2019), fitted by NLL with {self._card_regularisation()}."
        )
