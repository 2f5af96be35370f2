"""Straightforward, loop-based re-implementations used as independent references in the tests.

Each follows the paper / reference code literally (a Python loop over bins with explicit
``lo < p <= hi`` masks), sharing no code with ``hf_calibration.metrics``.
"""

from __future__ import annotations

import numpy as np


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def top_label(probs: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return probs.max(axis=1), (probs.argmax(axis=1) == target).astype(np.float64)


def loop_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int):
    """Per-bin (count, mean conf, mean acc) with Guo's ``lo < p <= hi``, p = 0 in the first bin."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    out = []
    for b in range(n_bins):
        lo, hi = edges[b], edges[b + 1]
        mask = (confidence > lo) & (confidence <= hi)
        if b == 0:
            mask |= confidence == 0.0
        n_b = int(mask.sum())
        out.append((n_b, confidence[mask].mean() if n_b else np.nan, correct[mask].mean() if n_b else np.nan))
    return out


def loop_ece(confidence, correct, n_bins: int) -> float:
    n = len(confidence)
    return sum(c / n * abs(acc - conf) for c, conf, acc in loop_bins(confidence, correct, n_bins) if c)


def loop_mce(confidence, correct, n_bins: int) -> float:
    return max(abs(acc - conf) for c, conf, acc in loop_bins(confidence, correct, n_bins) if c)


def loop_classwise_ece(probs: np.ndarray, target: np.ndarray, n_bins: int) -> float:
    k = probs.shape[1]
    return float(np.mean([loop_ece(probs[:, c], (target == c).astype(float), n_bins) for c in range(k)]))


def split_adaece(confidence, correct, n_bins: int) -> float:
    """Equal-mass bins, literally: cut the sorted confidences into ``np.array_split`` runs, take each
    run's largest value as its bin's upper edge, and put every sample with ``lo < p <= hi`` in that
    bin (so a tie group is never split; a bin can be empty)."""
    runs = [run for run in np.array_split(np.sort(confidence), n_bins) if len(run)]
    n = len(confidence)
    total, lo = 0.0, -np.inf
    for run in runs:
        hi = run[-1]
        mask = (confidence > lo) & (confidence <= hi)
        if mask.any():
            total += mask.sum() / n * abs(correct[mask].mean() - confidence[mask].mean())
        lo = hi
    return total


def focal_calibration_adaece(confidence, correct, n_bins: int) -> tuple[float, int]:
    """AdaECE as the focal-calibration reference code computes it (``AdaptiveECELoss``):
    ``np.interp`` edges over the sorted confidences and ``lo < p <= hi`` bins. Returns the value
    and how many samples fell in some bin."""
    n = len(confidence)
    edges = np.interp(np.linspace(0, n, n_bins + 1), np.arange(n), np.sort(confidence))
    total, binned = 0.0, 0
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (confidence > lo) & (confidence <= hi)
        prop = mask.mean()
        if prop > 0:
            total += abs(confidence[mask].mean() - correct[mask].mean()) * prop
            binned += int(mask.sum())
    return total, binned


def focal_calibration_ece_torch(logits, labels, temperature: float = 1.0, n_bins: int = 15) -> float:
    """ECE exactly as the focal-calibration repository's ``ECELoss`` computes it: float32 torch
    softmax of ``logits / T``, ``conf > lo & conf <= hi`` bins."""
    import torch

    logits = torch.as_tensor(logits, dtype=torch.float32) / temperature
    labels = torch.as_tensor(labels)
    conf, pred = torch.softmax(logits, dim=1).max(dim=1)
    acc = pred.eq(labels).float()
    edges = torch.linspace(0, 1, n_bins + 1)
    ece = torch.zeros(1)
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = conf.gt(lo.item()) * conf.le(hi.item())
        prop = in_bin.float().mean()
        if prop.item() > 0:
            ece += torch.abs(conf[in_bin].mean() - acc[in_bin].mean()) * prop
    return float(ece.item())
