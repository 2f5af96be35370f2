"""Structured matrix scaling (Berta, Holzmüller, Jordan & Bach, AISTATS 2026): temperature scaling, then
``softmax((I + diag(v) + offdiag(M)) x + b)`` of the scaled log-probabilities, K^2 + K parameters shrunk towards the
identity by ridge penalties that scale with K and N (``_structured.py``)."""

from __future__ import annotations

from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._structured import StructuredScaling


@register_calibrator
class StructuredMatrixScaling(
    StructuredScaling, tags=["structured-matrix-scaling", "sms"], paper_url="https://arxiv.org/abs/2511.03685"
):
    """Structured matrix scaling: ``softmax(W x + b)``, ``x = log softmax(z / T)``, ``W = I + diag(v) + offdiag(M)``.

    ``T`` is temperature scaling's (fitted first, by NLL); ``W`` and ``b`` then minimise the NLL plus
    ``lambda_intercept K^rho / N^tau |b|^2 + lambda_diagonal K^rho / N^tau |v|^2 + lambda_off_diagonal (K (K - 1))^rho /
    N^tau |M|^2``, which holds the off-diagonal part near 0 unless the calibration set is large: no cross-validation
    is needed (the defaults, all 1, are the authors'). Follows the authors' ``probmetrics`` 1.3 in everything but the
    optimiser (``_structured.py``). May change the predicted class (``preserves_argmax = False``).
    Needs at least ``min_samples = 10`` labelled samples.

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
        lambda_intercept, lambda_diagonal, lambda_off_diagonal: the three penalties' strengths.
        rho, tau: the penalties' powers of K and N.
        max_iter: LBFGS iterations at most.
        tol: stop when an iteration lowers the objective by less than ``tol`` (relative); below 1e-7 the fit finishes in
            float64.

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import StructuredMatrixScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 4, (400,), generator=g)
        >>> logits = 3 * torch.randn(400, 4, generator=g) + 6 * torch.nn.functional.one_hot(labels, 4)
        >>> sms = StructuredMatrixScaling().fit(logits, labels, progress_bar=False)
        >>> sms.weight.shape, sms.fit_info_["temperature"] > 1
        (torch.Size([4, 4]), True)
    """

    kind = "sms"
    paper_citation = "E. Berta, D. Holzmüller, M. I. Jordan, F. Bach, *Structured Matrix Scaling for Multi-Class Calibration*, AISTATS 2026"

    def _card_description(self) -> str:
        return (
            f"It maps the temperature-scaled log-probabilities x to softmax(W x + b) with a full K x K matrix W shrunk towards "
            f"the identity (structured matrix scaling, Berta et al. 2026), fitted by NLL with {self._card_penalty()}."
        )
