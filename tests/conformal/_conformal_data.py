"""Synthetic logits for the conformal tests, and the shared real logits when they are beside the repo."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHARED_LOGITS = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "logits"


def synthetic(n: int = 2000, k: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Float32 logits and labels of a ~70%-accurate, over-confident classifier."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = 3.0 * (rng.normal(size=(n, k)) + 1.8 * np.eye(k)[labels])
    return logits.astype(np.float32), labels.astype(np.int64)


def shared_file(name: str) -> Path | None:
    path = SHARED_LOGITS / name
    return path if path.is_file() else None


def _add_tests_root_to_path() -> None:
    """Make the shared tiny-model factories (tests/_models.py) importable from this folder."""
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)


_add_tests_root_to_path()
