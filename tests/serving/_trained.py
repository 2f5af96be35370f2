"""Tiny ViT / Swin / ResNet / timm classifiers trained for real (a few epochs on scikit-learn's digits, 16x16 RGB, as
the demo's), their calibration and test splits, and helpers shared by the serving tests."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _models import make_model  # noqa: E402

IMAGE_SIZE = 16


@functools.cache
def splits():
    from hf_calibration.demo import digits_splits

    return digits_splits(0, calibration_size=300, test_size=200)


@functools.cache
def processor():
    from hf_calibration.demo import digits_image_processor

    return digits_image_processor(IMAGE_SIZE)


def pixels(images) -> torch.Tensor:
    return torch.as_tensor(processor()(images=images, return_tensors="np")["pixel_values"])


def build(name: str, seed: int = 0):
    if name == "vit":
        from hf_calibration.demo import tiny_vit

        return tiny_vit(image_size=IMAGE_SIZE, hidden_size=32, num_layers=1, num_heads=2, seed=seed)
    return make_model(name, seed=seed, num_channels=3, image_size=IMAGE_SIZE)


@functools.cache
def trained(name: str, epochs: int = 15, seed: int = 0):
    """``name``'s tiny model trained with Adam on the digits' training split (eval mode)."""
    data = splits()
    x, y = pixels(data.train_images), torch.as_tensor(data.train_labels)
    model = build(name, seed)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=generator).split(64):
            optimizer.zero_grad()
            out = model(pixel_values=x[batch]) if name != "bare" else model(x[batch])
            logits = out.logits if hasattr(out, "logits") else out
            torch.nn.functional.cross_entropy(logits, y[batch]).backward()
            optimizer.step()
    return model.eval()


def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(pixel_values=x)
    return (out.logits if hasattr(out, "logits") else out).detach()


def accuracy(model, x, y) -> float:
    return float((logits_of(model, x).argmax(1) == torch.as_tensor(y)).float().mean())
