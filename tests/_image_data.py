"""Saved checkpoints and image datasets for the model + dataset route, built offline.

* ``save_classifier(name, folder)``: a tiny random-init ViT or timm model (``tests._models``) taking 3-channel
  8x8 images, saved with its image processor the way the Hub holds them (ViT: ``preprocessor_config.json``;
  timm: ``pretrained_cfg`` inside ``config.json``).
* ``write_route(root)``: both checkpoints and both dataset forms under ``root`` (``vit``, ``timm``, ``saved``, ``folder``).
* ``digits_dataset_dict()``: scikit-learn's digits as RGB PIL images with a ``ClassLabel`` column, split into
  ``validation`` and ``test``; ``write_image_folder(root)`` writes the same images as an ``imagefolder`` tree.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from _models import digits, make_model

CLASS_NAMES = [str(i) for i in range(10)]
SPLITS = {"validation": slice(0, 61), "test": slice(61, 98)}  # odd sizes: uneven shards and partial batches
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]


def save_classifier(name: str, folder: Path, seed: int = 0):
    """Save a tiny ``vit`` or ``timm`` classifier and its image processor to ``folder``; returns the model."""
    model = make_model(name, seed=seed, num_channels=3).eval()
    model.save_pretrained(folder)
    if name == "timm":  # timm checkpoints keep their data config in config.json (TimmWrapperImageProcessor reads it)
        config = json.loads((folder / "config.json").read_text())
        config["pretrained_cfg"] = {
            "input_size": [3, 8, 8],
            "crop_pct": 1.0,
            "crop_mode": "center",
            "interpolation": "bilinear",
            "mean": MEAN,
            "std": STD,
        }
        (folder / "config.json").write_text(json.dumps(config))
    else:
        from transformers import ViTImageProcessor

        ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=MEAN, image_std=STD).save_pretrained(folder)
    return model


def _rgb_images(index: slice) -> tuple[list, list[int]]:
    from PIL import Image

    x, y = digits(index)
    pixels = (x[:, 0].numpy() * 255).round().astype(np.uint8)
    # three different channels, so a mix-up of channels or of mean/std shows in the logits
    images = [Image.fromarray(np.stack([p, p[::-1], p.T], axis=-1), mode="RGB") for p in pixels]
    return images, y.tolist()


def digits_dataset_dict():
    """``DatasetDict`` with ``validation`` (61 rows) and ``test`` (37 rows): columns ``img`` (Image) and ``digit`` (ClassLabel)."""
    import datasets

    features = datasets.Features({"img": datasets.Image(), "digit": datasets.ClassLabel(names=CLASS_NAMES)})
    out = {}
    for split, index in SPLITS.items():
        images, labels = _rgb_images(index)
        out[split] = datasets.Dataset.from_dict({"img": images, "digit": labels}, features=features)
    return datasets.DatasetDict(out)


def write_image_folder(root: Path) -> Path:
    """The same images as PNG files in an ``imagefolder`` tree: ``root/<split>/<class>/<i>.png``."""
    for split, index in SPLITS.items():
        images, labels = _rgb_images(index)
        for i, (image, label) in enumerate(zip(images, labels)):
            path = root / split / CLASS_NAMES[label] / f"{index.start + i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path)
    return root


def write_route(root: Path) -> Path:
    """``root/vit`` and ``root/timm`` (checkpoints), ``root/saved`` (save_to_disk) and ``root/folder`` (imagefolder)."""
    for name in ("vit", "timm"):
        save_classifier(name, root / name)
    digits_dataset_dict().save_to_disk(str(root / "saved"))
    write_image_folder(root / "folder")
    return root
