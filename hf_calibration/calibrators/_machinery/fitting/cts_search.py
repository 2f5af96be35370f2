"""The compiled inner loop of class-based temperature scaling's grid search (``cts.py``).

CTS divides column k of the logits by its own temperature ``T_k`` and, one class at a time, tries every ``t``
of a grid for ``T_k``, keeping the one with the lowest ECE. Evaluating a candidate naively costs a softmax of
the whole (N, K) matrix: K x grid x sweeps of them took the SMART paper over an hour on ImageNet. Here each row
keeps a summary of its scaled logits ``s_ij = z_ij / T_j``: the top two (value and first index, as
``torch.argmax`` breaks ties) and ``tot_i = sum_j exp(s_ij - s_i,max)``. Changing one column then moves a row's
top-label confidence and prediction in O(1):

    without class k:  M = the largest s_ij (j != k), J its index, R = sum_{j != k} exp(s_ij - M)
    with s_ik = u:    if u beats M: conf = 1 / (1 + R exp(M - u)), prediction k
                      else:         conf = 1 / (R + exp(u - M)),     prediction J

so a class costs O(N x grid) (one exp per row and candidate) plus O(K) for the rows whose top class is k
(R is recomputed from the logits there: subtracting the top's share would lose its precision). Rows are
processed in fixed chunks in parallel; per-chunk sums are added in chunk order (thread-count independent).
ECE uses 15 equal-width bins on (0, 1] with ``lo < p <= hi``, exactly as ``hf_calibration.metrics.ece``:
``ECE = sum_b |sum_{i in b} (conf_i - correct_i)| / N``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hf_calibration._core.bins import uniform_bin
from hf_calibration._core.vmath import exp_into

CHUNK = 512


@numba.njit(cache=True)
def _summarise_row(z, i, inv_t, v1, j1, v2, j2, tot):  # pragma: no cover - compiled
    """Top two scaled logits of row ``i`` (first index wins ties) and ``sum_j exp(s_ij - top)``."""
    k = z.shape[1]
    a, ia, b, ib = -np.inf, -1, -np.inf, -1
    for j in range(k):
        s = np.float64(z[i, j]) * inv_t[j]
        if s > a:
            b, ib = a, ia
            a, ia = s, j
        elif s > b:
            b, ib = s, j
    total = 0.0
    for j in range(k):
        total += math.exp(np.float64(z[i, j]) * inv_t[j] - a)
    v1[i], j1[i], v2[i], j2[i], tot[i] = a, ia, b, ib, total


@numba.njit(parallel=True, cache=True)
def summarise(z, inv_t, v1, j1, v2, j2, tot):  # pragma: no cover - compiled
    """Row summaries for temperatures ``1 / inv_t``, from scratch."""
    for i in numba.prange(z.shape[0]):
        _summarise_row(z, i, inv_t, v1, j1, v2, j2, tot)


@numba.njit(cache=True)
def current_bins(labels, j1, tot, edges):  # pragma: no cover - compiled
    """``(sum_b |sum_{i in b} (conf_i - correct_i)|, correct count)`` of the current summaries (ECE x N)."""
    n_bins = edges.shape[0] - 1
    gap = np.zeros(n_bins)
    correct = 0
    for i in range(labels.shape[0]):
        conf = 1.0 / tot[i]
        hit = 1.0 if j1[i] == labels[i] else 0.0
        gap[uniform_bin(conf, edges)] += conf - hit
        correct += int(hit)
    total = 0.0
    for b in range(n_bins):
        total += abs(gap[b])
    return total, correct


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def candidate_bins(z, labels, k, inv_t, grid_inv, v1, j1, v2, j2, tot, edges):  # pragma: no cover - compiled
    """For every candidate ``t`` (``grid_inv = 1 / grid``) for class ``k``: ``(sum_b |gap_b|, correct count)``.

    Per chunk of rows: the candidate-independent part of each row first, then one candidate at a time over the
    chunk's rows (vectorised: exp, confidence, bin), then the bin sums (a scalar scatter, in row order).
    """
    n, n_classes = z.shape
    g_count = grid_inv.shape[0]
    n_bins = edges.shape[0] - 1
    n_chunks = (n + CHUNK - 1) // CHUNK
    part_gap = np.zeros((n_chunks, g_count, n_bins))
    part_correct = np.zeros((n_chunks, g_count), dtype=np.int64)
    for c in numba.prange(n_chunks):
        start = c * CHUNK
        rows = min(n, start + CHUNK) - start
        zk = np.empty(rows)
        top = np.empty(rows)
        r = np.empty(rows)
        k_first = np.empty(rows)  # 1.0 where k, tied with the top, still wins (k comes first)
        hit_k = np.empty(rows)
        hit_other = np.empty(rows)
        a = np.empty(rows)
        arg = np.empty(rows)
        e = np.empty(rows)
        bits = np.empty(rows)
        conf = np.empty(rows)
        hit = np.empty(rows)
        bins = np.empty(rows, dtype=np.int64)
        for q in range(rows):
            i = start + q
            zk[q] = np.float64(z[i, k])
            y = labels[i]
            if j1[i] == k:  # the top class is k: summarise the row without it, from the logits
                t, idx = v2[i], j2[i]
                s = 0.0
                for j in range(n_classes):
                    if j != k:
                        s += math.exp(np.float64(z[i, j]) * inv_t[j] - t)
                r[q] = s
            else:
                t, idx = v1[i], j1[i]
                r[q] = tot[i] - math.exp(zk[q] * inv_t[k] - t)
            top[q] = t
            k_first[q] = 1.0 if k < idx else 0.0
            hit_k[q] = 1.0 if y == k else 0.0
            hit_other[q] = 1.0 if y == idx else 0.0
        gap = part_gap[c]
        cor = part_correct[c]
        for g in range(g_count):
            gi = grid_inv[g]
            for q in range(rows):
                a[q] = zk[q] * gi - top[q]
                arg[q] = -abs(a[q])
            exp_into(arg, e, bits)
            for q in range(rows):
                wins = a[q] > 0.0 or (a[q] == 0.0 and k_first[q] > 0.0)
                conf[q] = 1.0 / (1.0 + r[q] * e[q]) if wins else 1.0 / (r[q] + e[q])
                hit[q] = hit_k[q] if wins else hit_other[q]
            for q in range(rows):
                bins[q] = uniform_bin(conf[q], edges)
            count = 0
            for q in range(rows):
                gap[g, bins[q]] += conf[q] - hit[q]
                count += int(hit[q])
            cor[g] = count
    totals = np.zeros(g_count)
    correct = np.zeros(g_count, dtype=np.int64)
    for g in range(g_count):
        for b in range(n_bins):
            s = 0.0
            for c in range(n_chunks):
                s += part_gap[c, g, b]
            totals[g] += abs(s)
        for c in range(n_chunks):
            correct[g] += part_correct[c, g]
    return totals, correct


@numba.njit(parallel=True, cache=True)
def update_column(z, k, old_inv, inv_t, v1, j1, v2, j2, tot):  # pragma: no cover - compiled
    """Update the summaries after column ``k``'s inverse temperature went from ``old_inv`` to ``inv_t[k]``."""
    new_inv = inv_t[k]
    for i in numba.prange(z.shape[0]):
        zk = np.float64(z[i, k])
        new = zk * new_inv
        if j1[i] == k or j2[i] == k or new >= v2[i]:  # the top two may change: redo the row
            _summarise_row(z, i, inv_t, v1, j1, v2, j2, tot)
        else:
            tot[i] += math.exp(new - v1[i]) - math.exp(zk * old_inv - v1[i])
