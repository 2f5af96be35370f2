"""The large synthetic logits of ``benchmarks/scale.py``: written once into ``.data/scale/`` (git-ignored), reused.

ImageNet-like (the generator of ``benchmarks/calibrators.py``: Gaussian logits, a true-class boost of varying
strength, sharpened x2, so over-confident), drawn block by block from per-block seeds, so a file never needs its
whole size in memory and the same (N, K, seed) always gives the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".data" / "scale"
BLOCK_ROWS = 2_000


def _block(start: int, stop: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, start])
    n = stop - start
    y = rng.integers(0, k, n)
    z = rng.standard_normal((n, k), dtype=np.float32)
    z *= np.float32(2.4)
    z[np.arange(n), y] += (2.0 * rng.gamma(3.0, 2.0, n)).astype(np.float32)
    return z, y


def synthetic(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(logits float32 (n, k), labels int64 (n,))`` in memory."""
    z = np.empty((n, k), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    for start in range(0, n, BLOCK_ROWS):
        stop = min(n, start + BLOCK_ROWS)
        z[start:stop], y[start:stop] = _block(start, stop, k, seed)
    return z, y


def paths(n: int, k: int, seed: int = 0) -> tuple[Path, Path]:
    stem = DATA / f"logits_{n}x{k}_seed{seed}"
    return stem.with_suffix(".npy"), stem.with_name(stem.name + "_labels.npy")


def ensure(n: int, k: int, seed: int = 0) -> tuple[Path, Path]:
    """The ``.npy`` files of ``synthetic(n, k, seed)``, written block by block if they are not there yet."""
    logits_path, labels_path = paths(n, k, seed)
    if logits_path.exists() and labels_path.exists():
        return logits_path, labels_path
    DATA.mkdir(parents=True, exist_ok=True)
    partial = logits_path.with_suffix(".partial.npy")
    z = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(n, k))
    y = np.empty(n, dtype=np.int64)
    for start in range(0, n, BLOCK_ROWS):
        stop = min(n, start + BLOCK_ROWS)
        z[start:stop], y[start:stop] = _block(start, stop, k, seed)
    z.flush()
    del z
    np.save(labels_path, y)
    partial.rename(logits_path)
    return logits_path, labels_path
