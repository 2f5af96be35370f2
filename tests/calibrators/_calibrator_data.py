"""Synthetic logits with a realistic (over-confident) profile, and the shared real logits when present."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHARED_LOGITS = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "logits"


def overconfident(n: int = 600, k: int = 10, seed: int = 0, scale: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Labels and float32 logits of a ~80%-accurate classifier whose logits are ``scale`` times too sharp."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) + 2.2 * np.eye(k)[labels]
    return (scale * logits).astype(np.float32), labels.astype(np.int64)


def small_sample_draws(k: int, n: int, seed: int, test_size: int = 20_000):
    """``(z, y, z_test, y_test)``: the generator of ``benchmarks/small_sample_selection.py`` (a model drawn from
    ``seed``: signal in [0.5, 3], temperature error in [1/3, 3], class biases; labels drawn from ``softmax(u)``, logits
    ``c u + bias``), ``n`` calibration samples and an independent test draw from the same model."""
    import math

    rng = np.random.default_rng([seed, k, 29])
    signal, error = rng.uniform(0.5, 3.0), math.exp(rng.uniform(math.log(1 / 3), math.log(3)))
    bias = rng.normal(0.0, 0.5, size=k)

    def draw(size, draw_seed):
        g = np.random.default_rng(draw_seed)
        u = signal * g.normal(size=(size, k))
        p = np.exp(u - u.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        y = (p.cumsum(axis=1) < g.uniform(size=(size, 1))).sum(axis=1).clip(max=k - 1)
        return (error * u + bias).astype(np.float32), y.astype(np.int64)

    return (*draw(n, 10_000 * seed + 7 * k + n), *draw(test_size, 10_000 * seed + 7 * k + n + 1))


def shared_files() -> list[Path]:
    return sorted(SHARED_LOGITS.glob("*.npz")) if SHARED_LOGITS.is_dir() else []


def _add_tests_root_to_path() -> None:
    """Make the shared tiny-model factories (tests/_models.py) importable from this folder."""
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)


_add_tests_root_to_path()
