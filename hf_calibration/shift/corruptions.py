"""The 19 corruptions of Hendrycks & Dietterich (2019), as their generation scripts compute them.

Each function takes the clean RGB image as a PIL image, the published parameter ``c`` of one severity
(:mod:`hf_calibration.shift.parameters`) and a ``numpy.random.RandomState``, and returns the corrupted
image as float values in [0, 255] (or a PIL image where the script returns one). The scripts'
operations are kept in order, with the same libraries (OpenCV, scikit-image, SciPy, Pillow), and every
random draw comes from ``rng`` in the scripts' order: the scripts draw from NumPy's global generator,
so ``RandomState(seed)`` reproduces a script run after ``np.random.seed(seed)``.

Departures from the scripts, each forced or a generalisation:

* **ImageMagick motion blur** (``motion_blur``, ``snow``): the scripts call MagickWand's
  ``MotionBlurImage``; here its kernel is computed directly (``magick_motion_blur``: width
  ``2·ceil(radius) + 1``, one-sided Gaussian weights ``exp(-i²/2σ²)``, sample offsets
  ``ceil(i·(cos θ, sin θ) - 0.5)``, edge pixels repeated) and the result rounded to 8 bits, as the
  script's PNG round trip does. The ``imagecorruptions`` package makes the same substitution.
* **impulse noise** draws from a generator seeded by ``rng`` (the script's scikit-image call is unseeded).
* **Any image size**: the scripts hard-code 32 or 224 pixels (loop bounds, crops, the elastic constants,
  the fog map). Here the loops and crops follow the image's height and width, the fog map is the next
  power of two, the elastic constants scale with ``min(H, W) / reference size`` (1 at the table's own
  size), and a frost texture smaller than the image is enlarged to cover it. Blur radii, noise levels
  and JPEG qualities are never rescaled: they are the published values at every size.
* ``glass_blur``: the script's ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` on NumPy rows does not swap,
  it copies ``x[h', w']`` into ``x[h, w]`` (the right-hand side holds views); that is what CIFAR-10-C and
  ImageNet-C contain, and what is computed here.
"""

from __future__ import annotations

import importlib.resources
from io import BytesIO

import numpy as np
from numba import njit
from PIL import Image

from hf_calibration.shift._optional import require

cv2 = require("cv2", "opencv-python")
skimage = require("skimage", "scikit-image")
from scipy.ndimage import map_coordinates  # noqa: E402
from scipy.ndimage import zoom as scizoom  # noqa: E402
from skimage.filters import gaussian  # noqa: E402

__all__ = ["CORRUPTION_FUNCTIONS", "magick_motion_blur", "plasma_fractal", "disk", "clipped_zoom"]


# ----------------------------------------------------------------------------- helpers (the scripts' own)


def _float(x) -> np.ndarray:
    return np.asarray(x) / 255.0


def _gaussian(x: np.ndarray, sigma: float, **kwargs) -> np.ndarray:
    """``skimage.filters.gaussian(x, sigma, multichannel=True)`` of the scripts (``channel_axis`` since 0.19)."""
    return gaussian(x, sigma=sigma, channel_axis=-1 if x.ndim == 3 else None, **kwargs)


def disk(radius: float, alias_blur: float = 0.1, dtype=np.float32) -> np.ndarray:
    """Normalised disk kernel of the given radius on a grid of at least 17 × 17, anti-aliased by a 3 × 3
    (radius <= 8) or 5 × 5 Gaussian of std ``alias_blur`` (the scripts' ``disk``)."""
    if radius <= 8:
        grid = np.arange(-8, 8 + 1)
        ksize = (3, 3)
    else:
        grid = np.arange(-radius, radius + 1)
        ksize = (5, 5)
    xx, yy = np.meshgrid(grid, grid)
    aliased = np.array((xx**2 + yy**2) <= radius**2, dtype=dtype)
    aliased /= np.sum(aliased)
    return cv2.GaussianBlur(aliased, ksize=ksize, sigmaX=alias_blur)


def plasma_fractal(rng: np.random.RandomState, mapsize: int = 256, wibbledecay: float = 3) -> np.ndarray:
    """Diamond-square height map in [0, 1] of side ``mapsize`` (a power of two), the scripts' fog layer."""
    if mapsize & (mapsize - 1):
        raise ValueError(f"Expected argument `mapsize` to be a power of two, but got {mapsize}.")
    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    stepsize = mapsize
    wibble = 100.0

    def wibbledmean(array):
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        half = stepsize // 2
        # squares: each square's centre = mean of its corners + wibble
        corners = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        square = corners + np.roll(corners, shift=-1, axis=0)
        square += np.roll(square, shift=-1, axis=1)
        maparray[half:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(square)
        # diamonds: each edge midpoint = mean of its 4 neighbours + wibble
        dr = maparray[half:mapsize:stepsize, half:mapsize:stepsize]
        ul = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        lt = dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1)
        maparray[0:mapsize:stepsize, half:mapsize:stepsize] = wibbledmean(lt)
        tt = dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0)
        maparray[half:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(tt)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def clipped_zoom(img: np.ndarray, zoom_factor: float) -> np.ndarray:
    """Zoom the centre crop of side ``ceil(side / zoom_factor)`` back to the image's size (bilinear)."""
    h, w = img.shape[:2]
    ch, cw = int(np.ceil(h / zoom_factor)), int(np.ceil(w / zoom_factor))
    top, left = (h - ch) // 2, (w - cw) // 2
    out = scizoom(img[top : top + ch, left : left + cw], (zoom_factor, zoom_factor, 1), order=1)
    trim_top, trim_left = (out.shape[0] - h) // 2, (out.shape[1] - w) // 2  # trim off any extra pixels
    return out[trim_top : trim_top + h, trim_left : trim_left + w]


def magick_motion_blur(x: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """ImageMagick's ``MotionBlurImage`` (effect.c): ``out(p) = Σ_i k_i · in(p + o_i)``, ``i < 2·ceil(r) + 1``.

    ``k_i ∝ exp(-i² / 2σ²)`` (normalised), ``o_i = (ceil(i·cos θ - 0.5), ceil(i·sin θ - 0.5))`` in
    (column, row) pixels, pixels outside the image repeat the edge. ``x`` is (H, W) or (H, W, C), float.
    """
    width = int(2 * np.ceil(radius) + 1)
    kernel = np.exp(-(np.arange(width, dtype=np.float64) ** 2) / (2.0 * sigma * sigma))
    kernel /= kernel.sum()
    theta = np.deg2rad(angle)
    px, py = width * np.sin(theta), width * np.cos(theta)
    hyp = np.hypot(px, py)
    h, w = x.shape[:2]
    pad = width
    padded = np.pad(x.astype(np.float64), ((pad, pad), (pad, pad)) + ((0, 0),) * (x.ndim - 2), mode="edge")
    out = np.zeros(x.shape, dtype=np.float64)
    for i in range(width):
        ox = int(np.ceil(i * py / hyp - 0.5))  # column offset
        oy = int(np.ceil(i * px / hyp - 0.5))  # row offset
        out += kernel[i] * padded[pad + oy : pad + oy + h, pad + ox : pad + ox + w]
    return out


def _frost_texture(index: int) -> np.ndarray:
    """The index-th frost photograph (BGR uint8) shipped with the ``imagecorruptions`` package."""
    require("imagecorruptions", "imagecorruptions-imaug")
    name = ["frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg"][index]
    ref = importlib.resources.files("imagecorruptions") / "frost" / name
    with importlib.resources.as_file(ref) as path:
        texture = cv2.imread(str(path))
    if texture is None:
        raise FileNotFoundError(f"Could not read the frost texture {name} of the `imagecorruptions` package.")
    return texture


def _glass_shuffle(x: np.ndarray, max_delta: int, iterations: int, rng: np.random.RandomState) -> np.ndarray:
    """The scripts' local pixel "swap" loop, with its copy semantics (see the module docstring)."""
    h, w = x.shape[:2]
    rows = np.arange(h - max_delta, max_delta, -1)
    cols = np.arange(w - max_delta, max_delta, -1)
    n = len(rows) * len(cols)
    for _ in range(iterations):
        if n == 0:
            break
        d = rng.randint(-max_delta, max_delta, size=(n, 2))  # the scripts' (dx, dy) per pixel, same stream
        _copy_loop(x, rows, cols, d)
    return x


def _copy_loop_py(x, rows, cols, d):
    k = 0
    for hh in rows:
        for ww in cols:
            x[hh, ww] = x[hh + d[k, 1], ww + d[k, 0]]
            k += 1


_copy_loop = njit(cache=True)(_copy_loop_py)  # sequential (later pixels read earlier writes): compiled


# ----------------------------------------------------------------------------- corruptions


def gaussian_noise(x, c, rng, **_):
    x = _float(x)
    return np.clip(x + rng.normal(size=x.shape, scale=c), 0, 1) * 255


def shot_noise(x, c, rng, **_):
    x = _float(x)
    return np.clip(rng.poisson(x * c) / float(c), 0, 1) * 255


def impulse_noise(x, c, rng, **_):
    x = skimage.util.random_noise(_float(x), mode="s&p", amount=c, rng=int(rng.randint(2**31)))
    return np.clip(x, 0, 1) * 255


def speckle_noise(x, c, rng, **_):
    x = _float(x)
    return np.clip(x + x * rng.normal(size=x.shape, scale=c), 0, 1) * 255


def gaussian_blur(x, c, rng, **_):
    return np.clip(_gaussian(_float(x), c), 0, 1) * 255


def glass_blur(x, c, rng, **_):
    sigma, max_delta, iterations = c
    x = np.uint8(_gaussian(_float(x), sigma) * 255)
    x = _glass_shuffle(x, max_delta, iterations, rng)
    return np.clip(_gaussian(x / 255.0, sigma), 0, 1) * 255


def defocus_blur(x, c, rng, **_):
    x = _float(x)
    kernel = disk(radius=c[0], alias_blur=c[1])
    channels = np.stack([cv2.filter2D(x[:, :, d], -1, kernel) for d in range(3)], axis=-1)
    return np.clip(channels, 0, 1) * 255


def motion_blur(x, c, rng, **_):
    angle = rng.uniform(-45, 45)
    out = magick_motion_blur(np.asarray(x, dtype=np.float64), radius=c[0], sigma=c[1], angle=angle)
    return np.clip(np.round(out), 0, 255)  # 8-bit result of the script's PNG round trip


def zoom_blur(x, c, rng, **_):
    x = _float(x).astype(np.float32)
    out = np.zeros_like(x)
    for zoom_factor in c:
        out += clipped_zoom(x, zoom_factor)
    return np.clip((x + out) / (len(c) + 1), 0, 1) * 255


def snow(x, c, rng, **_):
    x = np.array(x, dtype=np.float32) / 255.0
    h, w = x.shape[:2]
    layer = rng.normal(size=(h, w), loc=c[0], scale=c[1])
    layer = clipped_zoom(layer[..., np.newaxis], c[2])
    layer[layer < c[3]] = 0
    layer = np.uint8(np.clip(layer.squeeze(), 0, 1) * 255)  # the script's 8-bit PNG
    layer = magick_motion_blur(layer.astype(np.float64), radius=c[4], sigma=c[5], angle=rng.uniform(-135, -45))
    layer = (np.clip(np.round(layer), 0, 255) / 255.0)[..., np.newaxis]
    gray = cv2.cvtColor(x, cv2.COLOR_RGB2GRAY).reshape(h, w, 1)
    x = c[6] * x + (1 - c[6]) * np.maximum(x, gray * 1.5 + 0.5)
    return np.clip(x + layer + np.rot90(layer, k=2), 0, 1) * 255


def frost(x, c, rng, *, frost_scale=1.0, **_):
    idx = rng.randint(5)  # the scripts draw from the first five textures only
    texture = _frost_texture(idx)
    if frost_scale != 1.0:
        texture = cv2.resize(texture, (0, 0), fx=frost_scale, fy=frost_scale)
    x = np.asarray(x)
    h, w = x.shape[:2]
    if texture.shape[0] <= h or texture.shape[1] <= w:  # generalisation: enlarge the texture to cover the image
        scale = 1.1 * max(h / texture.shape[0], w / texture.shape[1])
        texture = cv2.resize(texture, (int(np.ceil(texture.shape[1] * scale)), int(np.ceil(texture.shape[0] * scale))))
    x_start, y_start = rng.randint(0, texture.shape[0] - h), rng.randint(0, texture.shape[1] - w)
    texture = texture[x_start : x_start + h, y_start : y_start + w][..., [2, 1, 0]]
    return np.clip(c[0] * x + c[1] * texture, 0, 255)


def fog(x, c, rng, **_):
    x = _float(x)
    h, w = x.shape[:2]
    mapsize = 1 << int(np.ceil(np.log2(max(h, w))))  # 32 for CIFAR, 256 for 224-px ImageNet: the scripts' sizes
    max_val = x.max()
    x = x + c[0] * plasma_fractal(rng, mapsize=mapsize, wibbledecay=c[1])[:h, :w][..., np.newaxis]
    return np.clip(x * max_val / (max_val + c[0]), 0, 1) * 255


def brightness(x, c, rng, **_):
    x = skimage.color.rgb2hsv(_float(x))
    x[:, :, 2] = np.clip(x[:, :, 2] + c, 0, 1)
    return np.clip(skimage.color.hsv2rgb(x), 0, 1) * 255


def contrast(x, c, rng, **_):
    x = _float(x)
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def saturate(x, c, rng, **_):
    x = skimage.color.rgb2hsv(_float(x))
    x[:, :, 1] = np.clip(x[:, :, 1] * c[0] + c[1], 0, 1)
    return np.clip(skimage.color.hsv2rgb(x), 0, 1) * 255


def jpeg_compression(x, c, rng, **_):
    output = BytesIO()
    x.save(output, "JPEG", quality=c)
    return Image.open(output)


def pixelate(x, c, rng, **_):
    w, h = x.size
    x = x.resize((int(w * c), int(h * c)), Image.BOX)
    return x.resize((w, h), Image.BOX)


def elastic_transform(image, c, rng, *, size_scale=1.0, **_):
    alpha, sigma, jitter = (v * size_scale for v in c)
    image = np.array(image, dtype=np.float32) / 255.0
    shape = image.shape
    shape_size = shape[:2]
    # random affine: jitter three points around the centre
    center_square = np.float32(shape_size) // 2
    square_size = min(shape_size) // 3
    pts1 = np.float32(
        [
            center_square + square_size,
            [center_square[0] + square_size, center_square[1] - square_size],
            center_square - square_size,
        ]
    )
    pts2 = pts1 + rng.uniform(-jitter, jitter, size=pts1.shape).astype(np.float32)
    affine = cv2.getAffineTransform(pts1, pts2)
    image = cv2.warpAffine(image, affine, shape_size[::-1], borderMode=cv2.BORDER_REFLECT_101)
    # smooth random displacement field
    dx = (gaussian(rng.uniform(-1, 1, size=shape[:2]), sigma, mode="reflect", truncate=3) * alpha).astype(np.float32)
    dy = (gaussian(rng.uniform(-1, 1, size=shape[:2]), sigma, mode="reflect", truncate=3) * alpha).astype(np.float32)
    dx, dy = dx[..., np.newaxis], dy[..., np.newaxis]
    xx, yy, zz = np.meshgrid(np.arange(shape[1]), np.arange(shape[0]), np.arange(shape[2]))
    indices = np.reshape(yy + dy, (-1, 1)), np.reshape(xx + dx, (-1, 1)), np.reshape(zz, (-1, 1))
    return np.clip(map_coordinates(image, indices, order=1, mode="reflect").reshape(shape), 0, 1) * 255


def spatter(x, c, rng, **_):
    x = np.array(x, dtype=np.float32) / 255.0
    liquid = rng.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    liquid = gaussian(liquid, sigma=c[2])
    liquid[liquid < c[3]] = 0
    if c[5] == 0:  # water: pale turquoise drops with refraction-like edges
        liquid = (liquid * 255).astype(np.uint8)
        dist = 255 - cv2.Canny(liquid, 50, 150)
        dist = cv2.distanceTransform(dist, cv2.DIST_L2, 5)
        _, dist = cv2.threshold(dist, 20, 20, cv2.THRESH_TRUNC)
        dist = cv2.blur(dist, (3, 3)).astype(np.uint8)
        dist = cv2.equalizeHist(dist)
        ker = np.array([[-2, -1, 0], [-1, 1, 1], [0, 1, 2]])
        dist = cv2.filter2D(dist, cv2.CV_8U, ker)
        dist = cv2.blur(dist, (3, 3)).astype(np.float32)
        m = cv2.cvtColor(liquid * dist, cv2.COLOR_GRAY2BGRA)
        m /= np.max(m, axis=(0, 1))
        m *= c[4]
        color = np.concatenate(
            (
                175 / 255.0 * np.ones_like(m[..., :1]),
                238 / 255.0 * np.ones_like(m[..., :1]),
                238 / 255.0 * np.ones_like(m[..., :1]),
            ),
            axis=2,
        )
        color = cv2.cvtColor(color, cv2.COLOR_BGR2BGRA)
        x = cv2.cvtColor(x, cv2.COLOR_BGR2BGRA)
        return cv2.cvtColor(np.clip(x + m * color, 0, 1), cv2.COLOR_BGRA2BGR) * 255
    # mud: brown blotches
    m = np.where(liquid > c[3], 1, 0)
    m = gaussian(m.astype(np.float32), sigma=c[4])
    m[m < 0.8] = 0
    color = np.concatenate(
        (
            63 / 255.0 * np.ones_like(x[..., :1]),
            42 / 255.0 * np.ones_like(x[..., :1]),
            20 / 255.0 * np.ones_like(x[..., :1]),
        ),
        axis=2,
    )
    color *= m[..., np.newaxis]
    x *= 1 - m[..., np.newaxis]
    return np.clip(x + color, 0, 1) * 255


CORRUPTION_FUNCTIONS = {
    f.__name__: f
    for f in (
        gaussian_noise,
        shot_noise,
        impulse_noise,
        defocus_blur,
        glass_blur,
        motion_blur,
        zoom_blur,
        snow,
        frost,
        fog,
        brightness,
        contrast,
        elastic_transform,
        pixelate,
        jpeg_compression,
        speckle_noise,
        gaussian_blur,
        spatter,
        saturate,
    )  # fmt: skip
}
