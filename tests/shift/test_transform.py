"""`corruption_transform` on a `datasets.Dataset`: per-image seeds, same result on every access."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("cv2")
pytest.importorskip("imagecorruptions")
datasets = pytest.importorskip("datasets")

from hf_calibration.shift import corruption_transform  # noqa: E402


def make_dataset(n: int = 4, column: str = "img") -> datasets.Dataset:
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
    return datasets.Dataset.from_dict({column: images, "label": list(range(n))})


def test_with_transform_corrupts_every_image_deterministically():
    ds = make_dataset()
    corrupted = ds.with_transform(corruption_transform("gaussian_noise", 4, seed=3))
    first = [np.asarray(corrupted[i]["img"]) for i in range(len(ds))]
    again = [np.asarray(row["img"]) for row in corrupted]  # another access, another batch shape
    for a, b, clean in zip(first, again, ds):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, np.asarray(clean["img"]))
    assert [corrupted[i]["label"] for i in range(len(ds))] == [0, 1, 2, 3]
    noise = [a.astype(int) - np.asarray(clean["img"], dtype=int) for a, clean in zip(first, ds)]
    assert not np.array_equal(noise[0], noise[1])  # each image draws its own noise


def test_transform_equals_corrupt_with_the_image_seed():
    from hf_calibration.shift.transform import _corrupt, _image_seed

    ds = make_dataset(2)
    out = corruption_transform("fog", 2, seed=1)({"img": [ds[0]["img"]]})["img"][0]
    image = ds[0]["img"].convert("RGB")
    expected = _corrupt(image, "fog", 2, np.random.RandomState(_image_seed(1, image)), None)
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_set_transform_column_detection_and_then():
    ds = make_dataset(2, column="pixels")
    seen = []
    ds.set_transform(corruption_transform("contrast", 5, then=lambda b: seen.append(list(b)) or b))
    assert ds[0]["pixels"].size == (32, 32) and seen == [["pixels", "label"]]
    with pytest.raises(ValueError, match="image_column"):
        corruption_transform("contrast", 5)({"label": [1]})
    with pytest.raises(KeyError, match="`picture`"):
        corruption_transform("contrast", 5, image_column="picture")({"pixels": [ds[0]["pixels"]]})


def test_bad_arguments_fail_when_the_transform_is_built():
    with pytest.raises(ValueError, match="`name`"):
        corruption_transform("rain", 1)
    with pytest.raises(ValueError, match="`severity`"):
        corruption_transform("fog", 9)


def test_docstring_examples():
    import doctest

    from hf_calibration.shift import transform

    result = doctest.testmod(transform, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
