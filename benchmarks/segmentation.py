"""Train a tiny SegFormer on the drawn shapes, then pixel calibration before / after TS and LTS on a held-out split.

Run from the repository root (CPU; the training stops at ``--train-seconds``):

    nice -n 10 python benchmarks/segmentation.py --train-seconds 360

Data: ``shapes_dataset`` (64 x 64; masks 0 background, 1-3 shapes, 255 a void band on outlines), train / calibration /
test = 1200 / 200 / 300 images, seeds 0 / 1 / 2. Model: SegFormer from a config (2 stages, hidden 16 / 32), random
init, AdamW lr 2e-3, batch 16, cross-entropy with ignore_index 255 at the label resolution. Calibrators fitted on the
calibration split: temperature scaling on 2e5 sampled pixels (``pixel_rows``), Local Temperature Scaling (logits +
image, 150 Adam steps). Metrics on the test split with ``PixelCalibrationAccumulator`` (15 bins, boundary width 2).
Writes benchmarks/results/segmentation.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from torch import nn

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.io.shapes import shapes_dataset
from hf_calibration.segmentation import (
    LocalTemperatureScaling,
    PixelCalibrationAccumulator,
    calibrate_pixels,
    pixel_rows,
)

OUT = Path(__file__).resolve().parent / "results"


def tensors(data):
    images = torch.stack(
        [torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).float() / 255 for im in data["image"]]
    )
    masks = torch.stack([torch.from_numpy(np.array(m)).long() for m in data["mask"]])
    return (images - 0.5) / 0.25, masks


def logits_of(model, images, size):
    out = []
    with torch.no_grad():
        for i in range(0, len(images), 50):
            z = model(pixel_values=images[i : i + 50]).logits
            out.append(nn.functional.interpolate(z, size=size, mode="bilinear", align_corners=False))
    return torch.cat(out)


def metrics(z, masks):
    acc = PixelCalibrationAccumulator(4, n_bins=15, boundary_width=2)
    for i in range(0, len(z), 50):
        acc.update(z[i : i + 50], masks[i : i + 50])
    out = acc.compute()
    out["nll"] = nn.functional.cross_entropy(z.double(), masks, ignore_index=255).item()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-seconds", type=float, default=360)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 / 20 / 20 images")
    args = parser.parse_args()
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    torch.manual_seed(0)
    start = time.time()
    train, cal, test = (
        tensors(shapes_dataset(n, size=64, seed=s))
        for n, s in (((1200, 0), (200, 1), (300, 2)) if not args.quick else ((40, 0), (20, 1), (20, 2)))
    )
    config = SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        num_attention_heads=[1, 2],
        patch_sizes=[3, 3],
        strides=[2, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        num_labels=4,
    )
    model = SegformerForSemanticSegmentation(config)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    steps, t0 = 0, time.time()
    g = torch.Generator().manual_seed(0)
    while time.time() - t0 < args.train_seconds:
        idx = torch.randint(0, len(train[0]), (16,), generator=g)
        z = nn.functional.interpolate(
            model(pixel_values=train[0][idx]).logits, size=(64, 64), mode="bilinear", align_corners=False
        )
        loss = nn.functional.cross_entropy(z, train[1][idx], ignore_index=255)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    model.eval()
    z_cal, z_test = logits_of(model, cal[0], (64, 64)), logits_of(model, test[0], (64, 64))
    ts = TemperatureScaling().fit(*pixel_rows(z_cal, cal[1], max_pixels=200_000))
    lts = LocalTemperatureScaling(4, image_channels=3).fit(z_cal, cal[1], cal[0], steps=150)
    with torch.no_grad():
        rows = {
            "uncalibrated": metrics(z_test, test[1]),
            "temperature scaling": metrics(calibrate_pixels(ts, z_test).float(), test[1]),
            "local temperature scaling": metrics(lts(z_test, test[0]), test[1]),
        }
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}",
        "train_steps": steps,
        "train_seconds": args.train_seconds,
        "final_loss": loss.item(),
        "total_seconds": time.time() - start,
        "rows": rows,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "segmentation.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Machine: {result['machine']}. Tiny SegFormer, {steps} steps in {args.train_seconds:.0f} s (final loss {result['final_loss']:.3f}); "
        f"test split {len(test[0])} images x 64 x 64 (void band excluded).",
        "",
        "| test split | pixel acc % | ECE % | AdaECE % | classwise ECE % | boundary ECE % (k=2) | NLL |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {100 * r['accuracy']:.2f} | {100 * r['ece']:.2f} | {100 * r['adaece']:.2f} | {100 * r['classwise_ece']:.2f} | "
            f"{100 * r['boundary_ece']:.2f} | {r['nll']:.4f} |"
        )
    (OUT / "segmentation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
