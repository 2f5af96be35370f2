"""save_logits / load_logits: a round trip, the .npz name numpy really writes, and no silent overwrite."""

from __future__ import annotations

import numpy as np
import pytest

from hf_calibration.io.logits_files import load_logits, npz_path, save_logits


def test_round_trip_and_the_name_written(tmp_path):
    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(20, 4)).astype(np.float32), rng.integers(0, 4, 20)
    path = save_logits(tmp_path / "out", val=(z, y), test=(z[:5], y[:5]))
    assert path == tmp_path / "out.npz" == npz_path(tmp_path / "out") and path.is_file()  # numpy appends .npz
    assert npz_path(tmp_path / "a.npz") == tmp_path / "a.npz"
    loaded = load_logits(path, "val")
    np.testing.assert_array_equal(loaded.logits, z)
    np.testing.assert_array_equal(loaded.labels, y)


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    z, y = np.zeros((3, 2), np.float32), np.zeros(3, np.int64)
    (tmp_path / "mine.npz").write_bytes(b"not yours")
    with pytest.raises(ValueError, match=r"argument `path` to name a new file.*mine.npz' exists; pass overwrite=True"):
        save_logits(tmp_path / "mine", z, y)
    assert (tmp_path / "mine.npz").read_bytes() == b"not yours"
    save_logits(tmp_path / "mine.npz", z, y, overwrite=True)
    np.testing.assert_array_equal(load_logits(tmp_path / "mine.npz").logits, z)
    with pytest.raises(TypeError, match="overwrite"):
        save_logits(tmp_path / "other.npz", z, y, overwrite=1)
