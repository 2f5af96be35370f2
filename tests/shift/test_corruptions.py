"""Each corruption against its published definition (Hendrycks & Dietterich 2019, make_cifar_c.py /
make_imagenet_c.py): noise levels, blur kernels, JPEG quantisation tables, HSV shifts, computed here
independently (scipy, matplotlib, numpy by hand), and at 224 px against the `imagecorruptions` package,
an independent implementation of the same scripts."""

from __future__ import annotations

import re
from io import BytesIO

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("cv2")
pytest.importorskip("skimage")
imagecorruptions = pytest.importorskip("imagecorruptions")

from hf_calibration.shift import CORRUPTIONS, corrupt  # noqa: E402
from hf_calibration.shift import corruptions as C  # noqa: E402
from hf_calibration.shift.parameters import BENCHMARK_CORRUPTIONS, CIFAR_C, IMAGENET_C  # noqa: E402


def smooth_image(size: int, seed: int = 0) -> np.ndarray:
    """A natural-ish test image: smoothed uniform noise, uint8 (size, size, 3)."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    x = rng.random((size, size, 3)) * 255
    return np.uint8(np.clip(gaussian_filter(x, (size / 16, size / 16, 0)) * 3 - 255, 0, 255))


def gray(size: int, value: int = 128) -> np.ndarray:
    return np.full((size, size, 3), value, dtype=np.uint8)


def run(x: np.ndarray, name: str, severity: int, seed: int = 0, preset: str | None = None) -> np.ndarray:
    return np.asarray(corrupt(x, name, severity, seed=seed, preset=preset)).astype(np.float64)


# ----------------------------------------------------------------------------- the names


def test_names_are_the_15_benchmark_and_4_extra_corruptions():
    assert len(BENCHMARK_CORRUPTIONS) == 15 and len(CORRUPTIONS) == 19
    assert set(CORRUPTIONS) == set(imagecorruptions.get_corruption_names("all"))
    assert list(BENCHMARK_CORRUPTIONS) == imagecorruptions.get_corruption_names("common")
    assert set(CIFAR_C) == set(IMAGENET_C) == set(CORRUPTIONS)


# ----------------------------------------------------------------------------- 224 px: the imagecorruptions package

# corruptions whose imagecorruptions code is the published script's (same random draws in the same order);
# value = largest allowed difference in grey levels (1: it truncates where the script's PNG round trip rounds)
SAME_AS_IMAGECORRUPTIONS = {
    "gaussian_noise": 0, "shot_noise": 0, "speckle_noise": 0, "defocus_blur": 0, "gaussian_blur": 0,
    "zoom_blur": 0, "contrast": 0, "brightness": 0, "saturate": 0, "jpeg_compression": 0, "pixelate": 0,
    "spatter": 1, "fog": 1, "motion_blur": 1,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SAME_AS_IMAGECORRUPTIONS))
@pytest.mark.parametrize("severity", [1, 3, 5])
def test_imagenet_c_parameters_match_imagecorruptions(name, severity):
    x = smooth_image(224)
    np.random.seed(11)  # the package draws from NumPy's global generator, as the scripts do
    expected = imagecorruptions.corrupt(x, severity=severity, corruption_name=name).astype(np.float64)
    got = run(x, name, severity, seed=11, preset="imagenet")
    assert np.abs(got - expected).max() <= SAME_AS_IMAGECORRUPTIONS[name]


def test_snow_224_matches_imagecorruptions_up_to_its_motion_blur_border():
    x = smooth_image(224)
    for severity in (1, 3, 5):
        np.random.seed(3)
        expected = imagecorruptions.corrupt(x, severity=severity, corruption_name="snow").astype(np.float64)
        diff = np.abs(run(x, "snow", severity, seed=3, preset="imagenet") - expected)
        assert (diff > 2).mean() < 0.03  # the package stops the blur where the streak leaves the image


@pytest.mark.parametrize("radius,sigma,angle", [(6, 1, 30.0), (9, 2.5, -44.0), (15, 8, 12.5), (20, 15, -90.0)])
def test_motion_blur_kernel_matches_imagecorruptions(radius, sigma, angle):
    from imagecorruptions.corruptions import _motion_blur

    x = smooth_image(64).astype(np.float64)
    np.testing.assert_allclose(
        C.magick_motion_blur(x, radius, sigma, angle), _motion_blur(x, radius, sigma, angle), atol=1e-3
    )


# ----------------------------------------------------------------------------- 32 px: the published definitions

# Written here from make_cifar_c.py (not read from the package's table), severities 1-5.
PUBLISHED_32 = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],
    "shot_noise": [500, 250, 100, 75, 50],
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],
    "speckle_noise": [0.06, 0.1, 0.12, 0.16, 0.2],
    "gaussian_blur": [0.4, 0.6, 0.7, 0.8, 1],
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],
    "saturate": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],
    "jpeg_compression": [80, 65, 58, 50, 40],
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
}
PUBLISHED_224 = {"jpeg_compression": [25, 18, 15, 10, 7], "glass_blur": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
                 "frost": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)]}  # fmt: skip


def test_gaussian_noise_std_is_the_published_c():
    x = gray(224)
    for severity, c in enumerate(PUBLISHED_32["gaussian_noise"], start=1):
        noise = (run(x, "gaussian_noise", severity, preset="cifar") - 128) / 255
        assert abs(noise.std() - c) < 0.02 * c + 1 / 255 and abs(noise.mean()) < 2 / 255


def test_shot_noise_is_poisson_with_rate_c():
    x = gray(224)
    for severity, c in enumerate(PUBLISHED_32["shot_noise"], start=1):
        y = run(x, "shot_noise", severity, preset="cifar") / 255
        p = 128 / 255
        assert abs(y.mean() - p) < 0.01  # E[Poisson(pc)/c] = p
        assert abs(y.var() / (p / c) - 1) < 0.1  # Var = p / c


def test_impulse_noise_replaces_a_fraction_c_of_values():
    x = gray(224)
    for severity, c in enumerate(PUBLISHED_32["impulse_noise"], start=1):
        y = run(x, "impulse_noise", severity, preset="cifar")
        salt, pepper = (y == 255).mean(), (y == 0).mean()
        assert abs(salt + pepper - c) < 0.1 * c and abs(salt - pepper) < 0.2 * c


def test_speckle_noise_relative_std_is_c():
    x = gray(224, 100)
    for severity, c in enumerate(PUBLISHED_32["speckle_noise"], start=1):
        rel = run(x, "speckle_noise", severity, preset="cifar") / 100 - 1
        assert abs(rel.std() - c) < 0.03 * c + 0.01


@pytest.mark.parametrize("severity", range(1, 6))
def test_gaussian_blur_is_scipys_gaussian_filter_with_sigma_c(severity):
    from scipy.ndimage import gaussian_filter

    x = smooth_image(32)
    sigma = PUBLISHED_32["gaussian_blur"][severity - 1]
    expected = np.floor(
        np.clip(gaussian_filter(x / 255.0, (sigma, sigma, 0), mode="nearest", truncate=4.0), 0, 1) * 255
    )
    np.testing.assert_array_equal(run(x, "gaussian_blur", severity, preset="cifar"), expected)


def _disk_by_hand(radius: float, alias: float) -> np.ndarray:
    grid = np.arange(-8, 9) if radius <= 8 else np.arange(-radius, radius + 1)
    xx, yy = np.meshgrid(grid, grid)
    d = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    d /= d.sum()
    g = np.exp(-(np.arange(-1, 2) ** 2) / (2 * alias**2))  # OpenCV's 3-tap Gaussian for ksize (3, 3)
    g /= g.sum()
    from scipy.ndimage import correlate1d

    d = correlate1d(d, g, axis=0, mode="mirror")  # OpenCV's default border is reflect-101 = scipy's "mirror"
    return correlate1d(d, g, axis=1, mode="mirror")


@pytest.mark.parametrize("severity", range(1, 6))
def test_defocus_blur_is_the_antialiased_disk_of_the_published_radius(severity):
    from scipy.ndimage import correlate

    radius, alias = PUBLISHED_32["defocus_blur"][severity - 1]
    x = smooth_image(32)
    kernel = _disk_by_hand(radius, alias)
    expected = np.stack([correlate(x[..., ch] / 255.0, kernel, mode="mirror") for ch in range(3)], -1)
    got = run(x, "defocus_blur", severity, preset="cifar")
    assert np.abs(got - np.floor(np.clip(expected, 0, 1) * 255)).max() <= 1  # float32 kernel vs float64


@pytest.mark.parametrize("preset,published", [("cifar", PUBLISHED_32), ("imagenet", PUBLISHED_224)])
def test_jpeg_uses_the_ijg_quantisation_table_of_the_published_quality(preset, published):
    luminance = np.array([16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
                          14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
                          49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99])  # ITU T.81 Table K.1, row-major  # fmt: skip
    image = smooth_image(32 if preset == "cifar" else 224)
    for severity, quality in enumerate(published["jpeg_compression"], start=1):
        buf = BytesIO()
        Image.fromarray(image).save(buf, "JPEG", quality=quality)
        np.testing.assert_array_equal(
            run(image, "jpeg_compression", severity, preset=preset), np.asarray(Image.open(buf))
        )
        out = C.jpeg_compression(Image.fromarray(image), quality, None)  # the decoded file's own quantisation table
        scale = 5000 // quality if quality < 50 else 200 - 2 * quality  # libjpeg's jpeg_quality_scaling (integer)
        expected = np.clip((luminance * scale + 50) // 100, 1, 255)
        np.testing.assert_array_equal(np.array(out.quantization[0]), expected)


def test_pixelate_averages_blocks():
    x = smooth_image(224)
    got = run(x, "pixelate", 2, preset="imagenet")  # c = 0.5: 2 × 2 box average, then back up
    blocks = x.reshape(112, 2, 112, 2, 3).mean(axis=(1, 3))
    assert np.abs(got[::2, ::2] - blocks).max() <= 1 and np.array_equal(got[::2, ::2], got[1::2, 1::2])
    small = Image.fromarray(np.ascontiguousarray(x[:32, :32]))
    for severity, c in enumerate(PUBLISHED_32["pixelate"], start=1):  # box down to int(32·c) px, box back up to 32
        side = int(32 * c)
        expected = small.resize((side, side), Image.BOX).resize((32, 32), Image.BOX)
        np.testing.assert_array_equal(
            run(np.asarray(small), "pixelate", severity, preset="cifar"), np.asarray(expected)
        )


@pytest.mark.parametrize("severity", range(1, 6))
def test_contrast_by_hand(severity):
    c = PUBLISHED_32["contrast"][severity - 1]
    x = np.zeros((32, 32, 3), dtype=np.uint8)
    x[:16] = 200  # half 200, half 0: mean 100 in every channel
    got = run(x, "contrast", severity, preset="cifar")
    for value, pixel in ((200, got[0, 0]), (0, got[-1, 0])):
        exact = (value - 100) * c + 100  # grey levels; np.uint8 truncates, and float rounding may land on either side
        assert set(pixel) <= {np.floor(exact - 1e-9), np.floor(exact + 1e-9)}


@pytest.mark.parametrize("name,channel", [("brightness", 2), ("saturate", 1)])
def test_hsv_shift_by_matplotlib(name, channel):
    from matplotlib.colors import rgb_to_hsv

    x = smooth_image(32)
    hsv = rgb_to_hsv(x / 255.0)
    for severity, c in enumerate(PUBLISHED_32[name], start=1):
        out = rgb_to_hsv(run(x, name, severity, preset="cifar") / 255.0)
        expected = (
            np.clip(hsv[..., channel] + c, 0, 1)
            if name == "brightness"
            else np.clip(hsv[..., channel] * c[0] + c[1], 0, 1)
        )
        assert np.abs(out[..., channel] - expected).max() < 0.02  # 8-bit output


def _published_glass_blur(x: np.ndarray, c, seed: int) -> np.ndarray:
    """make_cifar_c.py's loop verbatim in behaviour: per-pixel draws of size 2 and the tuple "swap" on rows."""
    from skimage.filters import gaussian

    np.random.seed(seed)
    x = np.uint8(gaussian(x / 255.0, sigma=c[0], channel_axis=-1) * 255)
    for _ in range(c[2]):
        for h in range(x.shape[0] - c[1], c[1], -1):
            for w in range(x.shape[1] - c[1], c[1], -1):
                dx, dy = np.random.randint(-c[1], c[1], size=(2,))
                h_prime, w_prime = h + dy, w + dx
                x[h, w], x[h_prime, w_prime] = x[h_prime, w_prime], x[h, w]
    return np.floor(np.clip(gaussian(x / 255.0, sigma=c[0], channel_axis=-1), 0, 1) * 255)


@pytest.mark.parametrize("preset,size", [("cifar", 32), ("imagenet", 40)])
@pytest.mark.parametrize("severity", range(1, 6))
def test_glass_blur_equals_the_scripts_loop(preset, size, severity):
    x = smooth_image(size)
    c = (PUBLISHED_32 if preset == "cifar" else PUBLISHED_224)["glass_blur"][severity - 1]
    np.testing.assert_array_equal(run(x, "glass_blur", severity, seed=5, preset=preset), _published_glass_blur(x, c, 5))


def test_zoom_blur_averages_the_published_zoom_factors():
    x = smooth_image(32)
    got = run(x, "zoom_blur", 1, preset="cifar")  # factors 1.00 ... 1.05 of make_cifar_c.py
    factors = np.arange(1, 1.06, 0.01)  # make_cifar_c.py severity 1; float rounding makes it end at 1.06
    assert len(factors) == 7
    expected = (
        2 * x.astype(np.float32) / 255.0 + sum(C.clipped_zoom(x.astype(np.float32) / 255.0, f) for f in factors[1:])
    ) / 8
    assert np.abs(got - np.floor(np.clip(expected, 0, 1) * 255)).max() <= 1
    # zoom 1.00 is the identity, so the output is (2·x + Σ_{f > 1} zoom_f(x)) / 7: closer to x than any single zoom
    single = C.clipped_zoom(x / 255.0, 1.05) * 255
    assert np.abs(got - x).mean() < np.abs(single - x).mean()


def test_elastic_severity_1_is_the_pure_affine_jitter():
    """CIFAR severity 1 has α = σ = 0: no displacement field, only the affine warp of three jittered points."""
    from scipy.ndimage import affine_transform

    x = smooth_image(32)
    seed = 4
    jitter = 32 * 0.08  # make_cifar_c.py severity 1: (IMSIZE*0, IMSIZE*0, IMSIZE*0.08)
    rs = np.random.RandomState(seed)
    centre, half = 16.0, 32 // 3
    pts1 = np.array([[centre + half, centre + half], [centre + half, centre - half], [centre - half, centre - half]])
    pts2 = pts1 + rs.uniform(-jitter, jitter, size=(3, 2)).astype(np.float32)
    # forward affine (x, y) -> (x', y') through the three point pairs, solved by hand
    forward = np.linalg.solve(np.c_[pts1, np.ones(3)], pts2).T  # 2 x 3
    inverse = np.linalg.inv(np.vstack([forward, [0, 0, 1]]))
    # scipy works in (row, col) = (y, x): swap the axes of the inverse map
    swap = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1]])
    m = swap @ inverse @ swap
    expected = np.stack(
        [affine_transform(x[..., ch] / 255.0, m[:2, :2], m[:2, 2], order=1, mode="mirror") for ch in range(3)], -1
    )
    got = run(x, "elastic_transform", 1, seed=seed, preset="cifar")
    assert np.abs(got - np.floor(np.clip(expected, 0, 1) * 255))[2:-2, 2:-2].max() <= 2  # OpenCV's 5-bit interpolation


@pytest.mark.parametrize("preset,size", [("cifar", 32), ("imagenet", 224)])
def test_frost_blends_a_crop_of_one_of_the_first_five_textures(preset, size):
    import cv2

    seed = 2
    weights = (PUBLISHED_32 if preset == "cifar" else PUBLISHED_224)["frost"][0]
    got = run(np.zeros((size, size, 3), np.uint8), "frost", 1, seed=seed, preset=preset)
    rs = np.random.RandomState(seed)
    idx = rs.randint(5)
    texture = C._frost_texture(idx)
    if preset == "cifar":
        texture = cv2.resize(texture, (0, 0), fx=0.2, fy=0.2)  # make_cifar_c.py shrinks the textures 5x
    xs, ys = rs.randint(0, texture.shape[0] - size), rs.randint(0, texture.shape[1] - size)
    expected = np.floor(np.clip(weights[1] * texture[xs : xs + size, ys : ys + size, ::-1], 0, 255))
    np.testing.assert_array_equal(got, expected)


def test_fog_adds_a_plasma_layer_that_grows_with_severity():
    x = gray(32, 100)
    levels = [run(x, "fog", s, preset="cifar") for s in range(1, 6)]
    spread = [lv.std() for lv in levels]
    assert all(a < b for a, b in zip(spread, spread[1:]))  # the fog's own texture, c[0] growing 0.2 → 1.5
    fractal = C.plasma_fractal(np.random.RandomState(0), mapsize=32, wibbledecay=3)
    assert fractal.shape == (32, 32) and fractal.min() == 0 and fractal.max() == 1


def test_snow_and_spatter_leave_most_of_a_dark_image_but_brighten_it():
    x = gray(32, 40)
    for name in ("snow", "spatter"):
        means = [run(x, name, s, preset="cifar").mean() for s in (1, 5)]
        assert all(m >= 40 - 1 for m in means)


# ----------------------------------------------------------------------------- API


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_deterministic_in_the_seed_and_same_size(name):
    x = smooth_image(32)
    a, b = run(x, name, 3, seed=1), run(x, name, 3, seed=1)
    np.testing.assert_array_equal(a, b)
    assert a.shape == x.shape


@pytest.mark.parametrize(
    "name", ["gaussian_noise", "glass_blur", "frost", "fog", "snow", "elastic_transform", "impulse_noise"]
)
def test_random_corruptions_change_with_the_seed(name):
    x = smooth_image(32)
    assert not np.array_equal(run(x, name, 5, seed=1), run(x, name, 5, seed=2))


def test_seed_reproduces_a_script_run_after_np_random_seed():
    x = smooth_image(32)
    np.random.seed(9)
    expected = np.floor(np.clip(x / 255.0 + np.random.normal(size=x.shape, scale=0.10), 0, 1) * 255)
    np.testing.assert_array_equal(run(x, "gaussian_noise", 5, seed=9, preset="cifar"), expected)


def test_preset_follows_the_image_size():
    from hf_calibration.shift.transform import preset_for_size

    assert preset_for_size(32, 32) == "cifar" and preset_for_size(64, 64) == "cifar"
    assert preset_for_size(224, 224) == "imagenet" and preset_for_size(96, 300) == "imagenet"
    x = smooth_image(32)
    np.testing.assert_array_equal(run(x, "contrast", 1), run(x, "contrast", 1, preset="cifar"))


def test_greyscale_and_array_inputs():
    x = smooth_image(32)[..., 0]
    out = corrupt(x, "gaussian_noise", 2)
    assert out.mode == "L" and out.size == (32, 32)
    assert corrupt(Image.fromarray(x), "gaussian_noise", 2).mode == "L"
    assert corrupt(x[..., None], "gaussian_noise", 2).mode == "L"


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"name": "blur"}, ValueError, "`name`"),
        ({"severity": 0}, ValueError, "`severity`"),
        ({"severity": 6}, ValueError, "`severity`"),
        ({"severity": 2.0}, TypeError, "`severity`"),
        ({"severity": True}, TypeError, "`severity`"),
        ({"seed": -1}, ValueError, "`seed`"),
        (
            {"seed": 2**32},
            ValueError,
            r"`seed` to be an integer in \[0, 2\*\*32 - 1\]",
        ),  # issue 23 item 12: numpy's own message
        ({"preset": "tiny"}, ValueError, "`preset`"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = {"image": smooth_image(32), "name": "fog", "severity": 1} | kwargs
    with pytest.raises(error, match=match):
        corrupt(**args)


def test_bad_images():
    with pytest.raises(TypeError, match="`image`"):
        corrupt([[1, 2], [3, 4]], "fog", 1)
    with pytest.raises(ValueError, match="`image`"):
        corrupt(np.zeros((32, 32, 3), np.float32), "fog", 1)
    with pytest.raises(ValueError, match="at least 8"):
        corrupt(np.zeros((4, 32, 3), np.uint8), "fog", 1)


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_images_of_more_than_8_bits_are_refused_not_clipped(mode):
    # issue 23 item 3: a uint16 ramp came back 99.6 % white and an "F" image in [0, 1] as values 12-13
    ramp = np.tile(np.linspace(0, 1, 64), (64, 1))
    values = {
        "I;16": (ramp * 65535).astype(np.uint16),
        "I": (ramp * 65535).astype(np.int32),
        "F": ramp.astype(np.float32),
    }
    image = Image.fromarray(values[mode], mode=mode if mode != "I;16" else None)
    assert image.mode == mode
    with pytest.raises(ValueError, match=rf"`image` to be an 8-bit image .* got mode '{re.escape(mode)}'"):
        corrupt(image, "contrast", 1)
    from hf_calibration.shift import corruption_transform

    with pytest.raises(ValueError, match="8-bit image"):
        corruption_transform("contrast", 1)({"image": [image]})
    eight_bit = Image.fromarray((ramp * 255).astype(np.uint8))  # the same ramp in 8 bits is corrupted as before
    assert corrupt(eight_bit, "contrast", 1).mode == "L"
    with pytest.raises(ValueError, match="`seed`"):
        corruption_transform("contrast", 1, seed=2**32)
