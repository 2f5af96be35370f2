"""Logits read from disk: a file that changes while a fit reads it is refused, not mixed (issue 40, item 5)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.io import open_logits


def _npy(tmp_path, seed=0, n=4000, k=10):
    rng = np.random.default_rng(seed)
    z = (3 * rng.normal(size=(n, k))).astype(np.float32)
    y = rng.integers(0, k, n)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "z_labels.npy", y)
    return z, y


def test_a_file_rewritten_during_a_fit_is_refused(tmp_path, monkeypatch):
    """The issue's case: TS on a .npy rewritten in place (values x 3) at the 6th read gave T = 1.1593, a temperature
    neither version gives (1.1572 and 3.4717)."""
    from hf_calibration._core import disk_logits

    z, y = _npy(tmp_path)
    logits = open_logits(tmp_path / "z.npy")
    read, calls = disk_logits.DiskLogits.read, []

    def read_then_rewrite(self, start, stop, out=None):
        calls.append(start)
        if len(calls) == 6:  # the file rewritten in place, as a writer would
            data = np.load(tmp_path / "z.npy", mmap_mode="r+")
            data[:] *= 3
            data.flush()
            del data
            stat = os.stat(tmp_path / "z.npy")
            os.utime(tmp_path / "z.npy", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        return read(self, start, stop, out)

    monkeypatch.setattr(disk_logits.DiskLogits, "read", read_then_rewrite)
    monkeypatch.setattr(
        "hf_calibration.calibrators._machinery.fitting.rows.BLOCK_ELEMENTS", 4000
    )  # many blocks, many reads
    with pytest.raises(ValueError, match="changed since it was opened"):
        TemperatureScaling().fit(logits, progress_bar=False)
    assert len(calls) >= 6


def test_an_unchanged_file_fits_as_in_memory(tmp_path):
    z, y = _npy(tmp_path, seed=1)
    from_disk = TemperatureScaling().fit(open_logits(tmp_path / "z.npy"), progress_bar=False)
    assert from_disk.fitted_temperature == TemperatureScaling().fit(z, y, progress_bar=False).fitted_temperature
