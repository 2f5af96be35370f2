"""Out-of-distribution detection from a classifier's outputs: AUROC, AUPR-in, AUPR-out, FPR at 95 % TPR.

Scores (higher = more in-distribution):

* ``"msp"``: maximum softmax probability, ``max_k softmax(z)_k`` (Hendrycks & Gimpel 2017);
* ``"max_logit"``: ``max_k z_k`` (Hendrycks et al. 2022, "Scaling out-of-distribution detection");
* ``"energy"``: the negative free energy ``T · logsumexp(z / T)`` (Liu et al. 2020, Eq. 5 with E = -score).

Convention: **in-distribution is the positive class**. AUROC is the probability that an in-distribution
sample scores above an OOD one, ties counted one half (Mann-Whitney; the trapezoid under the ROC over the
distinct thresholds), equal to scikit-learn's ``roc_auc_score``. AUPR-in is the average precision with the
in-distribution samples positive and the score as is; AUPR-out with the OOD samples positive and the
score negated; both are scikit-learn's ``average_precision_score``: ``Σ_k (R_k - R_{k-1}) P_k`` over the
distinct thresholds (tied scores enter together, no interpolation). FPR95 is the fraction of OOD samples
accepted at the highest threshold ``t`` (a distinct score value) that accepts (``score >= t``) at least 95 %
of the in-distribution samples, that is, the smallest FPR on the ROC with TPR >= 0.95 (tested as
``20·TP >= 19·P`` in integers, so no rounding decides it). Some OOD papers take the ROC point whose TPR is
*nearest* to 0.95 instead; that can be lower.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from hf_calibration._core.checks import check_choice, check_float, resolve_from_logits, to_numpy
from hf_calibration.metrics._format import Inputs, probability_chunks

Score = Literal["msp", "max_logit", "energy"]
SCORES = ("msp", "max_logit", "energy")


def _check_outputs(preds: Any, name: str) -> np.ndarray:
    preds = to_numpy(preds, name)
    if preds.ndim != 2:
        raise ValueError(
            f"Expected `{name}` to have shape (N, K) (rank 2), but got rank {preds.ndim} with shape {tuple(preds.shape)}."
        )
    if preds.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, but got shape {tuple(preds.shape)}.")
    if preds.shape[1] < 2:
        raise ValueError(f"Expected `{name}` to have K >= 2 classes, but got K = {preds.shape[1]}.")
    if preds.dtype.kind != "f":
        raise TypeError(f"Expected `{name}` to be a floating array, but got {preds.dtype}.")
    return preds


def ood_scores(
    preds: Any,
    score: Score = "msp",
    *,
    from_logits: bool | None = None,
    temperature: float = 1.0,
    preds_name: str = "preds",
) -> np.ndarray:
    """Per-sample OOD score, float64 ``(N,)``, higher = more in-distribution (see the module docstring).

    ``preds`` are ``(N, K)`` logits or probabilities (``from_logits=None`` detects them, as every metric
    does). MSP works from either; ``max_logit`` and ``energy`` need logits (softmax probabilities have lost
    them) and raise ``ValueError`` on probabilities. ``temperature`` is the energy score's T > 0.
    """
    check_choice(score, "score", SCORES)
    temperature = check_float(temperature, "temperature", minimum=0.0, min_inclusive=False)
    preds = _check_outputs(preds, preds_name)
    if from_logits is not None and not isinstance(from_logits, bool):
        raise TypeError(f"Expected argument `from_logits` to be None (detect), True or False, but got {from_logits!r}.")
    with np.errstate(over="ignore"):  # as the metrics' `prepare`: an overflowing row sum is not a probability row
        from_logits = resolve_from_logits(preds, from_logits, preds_name)
    if score != "msp" and not from_logits:
        raise ValueError(
            f"Expected logits for score={score!r}, but `{preds_name}` holds probabilities (from_logits=False or detected): "
            "softmax has removed the logits' offset this score needs. Use score='msp' or pass logits."
        )
    out = np.empty(preds.shape[0], dtype=np.float64)
    no_labels = np.zeros(
        preds.shape[0], dtype=np.int64
    )  # the shared streaming pass checks finiteness / probability rows
    for rows, probs, _ in probability_chunks(Inputs(preds, no_labels, from_logits, preds_name)):
        if score == "msp":
            out[rows] = probs.max(axis=1)
        else:
            z = preds[rows].astype(np.float64)
            if score == "max_logit":
                out[rows] = z.max(axis=1)
            else:
                z = z / temperature
                top = z.max(axis=1)
                out[rows] = temperature * (top + np.log(np.exp(z - top[:, None]).sum(axis=1)))
    return out


def _curve_counts(in_scores: np.ndarray, out_scores: np.ndarray):
    """Cumulative (TP, FP) at each distinct threshold, thresholds descending; positives = in-distribution."""
    scores = np.concatenate([in_scores, out_scores])
    positive = np.concatenate([np.ones(len(in_scores), np.int64), np.zeros(len(out_scores), np.int64)])
    order = np.argsort(-scores, kind="mergesort")
    scores, positive = scores[order], positive[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # last index of each block of tied scores
    tp = np.cumsum(positive)[last]
    fp = (last + 1) - tp
    return tp, fp


def _average_precision(tp: np.ndarray, fp: np.ndarray) -> float:
    """``Σ_k (R_k - R_{k-1}) P_k`` over distinct thresholds (scikit-learn's step-wise average precision)."""
    recall_step = np.diff(np.r_[0, tp]) / tp[-1]
    precision = tp / (tp + fp)
    return float(np.sum(recall_step * precision))


def ood_metrics_from_scores(in_scores: Any, out_scores: Any) -> dict[str, float]:
    """AUROC, AUPR-in, AUPR-out and FPR95 from per-sample scores (higher = in-distribution); fractions in [0, 1]."""
    scores = []
    for value, name in ((in_scores, "in_scores"), (out_scores, "out_scores")):
        value = np.asarray(to_numpy(value, name), dtype=np.float64)
        if value.ndim != 1 or value.shape[0] == 0:
            raise ValueError(f"Expected `{name}` to have shape (N,) with N >= 1, but got shape {value.shape}.")
        if not np.isfinite(value).all():
            raise ValueError(
                f"Expected `{name}` to be finite, but element {int(np.flatnonzero(~np.isfinite(value))[0])} is not."
            )
        scores.append(value)
    in_scores, out_scores = scores
    n_in, n_out = len(in_scores), len(out_scores)
    tp, fp = _curve_counts(in_scores, out_scores)
    tpr, fpr = np.r_[0, tp] / n_in, np.r_[0, fp] / n_out
    auroc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))  # trapezoid: ties give the 1/2
    # AUPR-out: OOD positive, score negated; its distinct thresholds are the same blocks in reverse order
    tp_out, fp_out = (n_out - np.r_[0, fp][:-1])[::-1], (n_in - np.r_[0, tp][:-1])[::-1]
    first = int(np.argmax(20 * tp >= 19 * n_in))  # highest threshold with TPR >= 95 % (exists: the last has TPR 1)
    return {
        "auroc": auroc,
        "aupr_in": _average_precision(tp, fp),
        "aupr_out": _average_precision(tp_out, fp_out),
        "fpr95": float(fp[first] / n_out),
    }


def ood_metrics(
    in_logits: Any,
    out_logits: Any,
    score: Score = "msp",
    *,
    from_logits: bool | None = None,
    temperature: float = 1.0,
) -> dict[str, float]:
    """OOD detection quality of ``score`` between in-distribution and OOD outputs.

    Args:
        in_logits: ``(N_in, K)`` logits (or probabilities) on in-distribution inputs (the positives).
        out_logits: ``(N_out, K)`` on out-of-distribution inputs, same K.
        score: ``"msp"``, ``"max_logit"`` or ``"energy"`` (higher = in-distribution).
        from_logits: None detects probabilities in each input (see ``hf_calibration._core.checks``); True/False forces it.
        temperature: T of the energy score.

    Returns:
        ``{"auroc", "aupr_in", "aupr_out", "fpr95"}`` as fractions (definitions and tie handling in the module docstring).

    Example:
        >>> import numpy as np
        >>> in_logits = np.array([[4.0, 0.0], [3.0, 0.0], [1.0, 0.0]])
        >>> out_logits = np.array([[0.5, 0.0], [2.0, 0.0]])
        >>> {k: round(v, 4) for k, v in ood_metrics(in_logits, out_logits).items()}
        {'auroc': 0.8333, 'aupr_in': 0.9167, 'aupr_out': 0.8333, 'fpr95': 0.5}
    """
    a = _check_outputs(in_logits, "in_logits")
    b = _check_outputs(out_logits, "out_logits")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"Expected `in_logits` and `out_logits` to have the same K, but got {a.shape[1]} and {b.shape[1]}."
        )
    kw = {"score": score, "from_logits": from_logits, "temperature": temperature}
    return ood_metrics_from_scores(
        ood_scores(a, preds_name="in_logits", **kw), ood_scores(b, preds_name="out_logits", **kw)
    )
