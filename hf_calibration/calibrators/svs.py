"""Structured vector scaling (Berta, Holzmüller, Jordan & Bach, AISTATS 2026): temperature scaling, then
``softmax((1 + v) * x + b)`` of the scaled log-probabilities, 2K parameters shrunk towards temperature scaling by
ridge penalties that scale with K and N (``_structured.py``)."""

from __future__ import annotations

from hf_calibration.calibrators._machinery.registry import register_calibrator
from hf_calibration.calibrators._structured import StructuredScaling


@register_calibrator
class StructuredVectorScaling(
    StructuredScaling, tags=["structured-vector-scaling", "svs"], paper_url="https://arxiv.org/abs/2511.03685"
):
    """Structured vector scaling: ``softmax(w * x + b)``, ``x = log softmax(z / T)``, ``w = 1 + v``.

    ``T`` is temperature scaling's (fitted first, by NLL); ``w`` and ``b`` then minimise the NLL plus
    ``lambda_intercept K^rho / N^tau |b|^2 + lambda_diagonal K^rho / N^tau |v|^2`` (the defaults, all 1, are the
    authors'). Follows the authors' ``probmetrics`` 1.3 in everything but the optimiser (``_structured.py``). May change
    the predicted class (``preserves_argmax = False``). Needs at least ``min_samples = 10`` labelled samples.

    Args:
        num_classes: K; None until the fit sets it (a loaded checkpoint passes it).
        lambda_intercept, lambda_diagonal: the two penalties' strengths.
        lambda_off_diagonal: unused (SVS has no off-diagonal weights); kept so that SMS and SVS take the same arguments.
        rho, tau: the penalties' powers of K and N.
        max_iter: LBFGS iterations at most.
        tol: stop when an iteration lowers the objective by less than ``tol`` (relative).

    Example:
        >>> import torch
        >>> from hf_calibration.calibrators import StructuredVectorScaling
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 4, (400,), generator=g)
        >>> logits = 3 * torch.randn(400, 4, generator=g) + 6 * torch.nn.functional.one_hot(labels, 4)
        >>> svs = StructuredVectorScaling().fit(logits, labels, progress_bar=False)
        >>> svs.weight.shape, svs.bias.shape
        (torch.Size([4]), torch.Size([4]))
    """

    kind = "svs"
    diagonal = True
    fits_in_blocks = True
    paper_citation = "E. Berta, D. Holzmüller, M. I. Jordan, F. Bach, *Structured Matrix Scaling for Multi-Class Calibration*, AISTATS 2026"

    def _card_description(self) -> str:
        return (
            f"It rescales and shifts each temperature-scaled log-probability, softmax(w * x + b), with w shrunk towards 1 "
            f"(structured vector scaling, Berta et al. 2026), fitted by NLL with {self._card_penalty()}."
        )
