"""A deterministic, procedurally drawn detection and segmentation set: squares, circles and triangles on noise.

``shapes_dataset(n, size=64, seed=0)`` returns a ``datasets.Dataset`` with an ``image`` (RGB), COCO-style
``objects`` (``bbox`` [x, y, w, h] in pixels, ``category`` 0 square, 1 circle, 2 triangle) and a ``mask`` image
(0 background, 1 + category inside a shape, 255 on a one-pixel void band along each shape's outline, as VOC draws
it). The same ``(n, size, seed)`` always gives the same images; for tests, benchmarks and the docs, where no hub
data set can be downloaded.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SHAPE_NAMES", "shapes_dataset"]

SHAPE_NAMES = ("square", "circle", "triangle")


def _draw(rng: np.random.Generator, size: int, max_shapes: int):
    from PIL import Image, ImageDraw

    noise = rng.integers(0, 80, (size, size, 3), dtype=np.uint8)
    image = Image.fromarray(noise)
    mask = Image.new("L", (size, size), 0)
    paint, label = ImageDraw.Draw(image), ImageDraw.Draw(mask)
    boxes, categories = [], []
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        side = int(rng.integers(size // 6, size // 2))
        x, y = (int(v) for v in rng.integers(0, size - side, 2))
        kind = int(rng.integers(0, 3))
        color = tuple(int(c) for c in rng.integers(100, 256, 3))
        box = [x, y, x + side - 1, y + side - 1]
        if kind == 0:
            paint.rectangle(box, fill=color)
            label.rectangle(box, fill=1, outline=255)
        elif kind == 1:
            paint.ellipse(box, fill=color)
            label.ellipse(box, fill=2, outline=255)
        else:
            corners = [(x, y + side - 1), (x + side - 1, y + side - 1), (x + side // 2, y)]
            paint.polygon(corners, fill=color)
            label.polygon(corners, fill=3, outline=255)
        boxes.append([float(x), float(y), float(side), float(side)])
        categories.append(kind)
    return image, {"bbox": boxes, "category": categories}, mask


def shapes_dataset(n: int, *, size: int = 64, seed: int = 0, max_shapes: int = 3):
    """``n`` drawn images of ``size`` x ``size`` pixels with 1 to ``max_shapes`` shapes each (see the module docstring)."""
    import datasets

    for name, value, low in (("n", n, 1), ("size", size, 16), ("max_shapes", max_shapes, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"Expected argument `{name}` to be an integer >= {low}, but got {value!r}.")
    rng = np.random.default_rng(seed)
    rows = [_draw(rng, size, max_shapes) for _ in range(n)]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "objects": {
                "bbox": datasets.Sequence(datasets.Sequence(datasets.Value("float32"), length=4)),
                "category": datasets.Sequence(datasets.ClassLabel(names=list(SHAPE_NAMES))),
            },
            "mask": datasets.Image(),
        }
    )
    return datasets.Dataset.from_dict(
        {"image": [r[0] for r in rows], "objects": [r[1] for r in rows], "mask": [r[2] for r in rows]},
        features=features,
    )
