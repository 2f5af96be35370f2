"""predict_logits against the inference loop a user writes by hand, at the same batch size and worker count.

Run from the repository root (about 3 minutes on 2 shared CPU cores):

    python benchmarks/predict_logits.py                    # 256 JPEG images, a 4-layer ViT-Ti/16 at 224 px
    python benchmarks/predict_logits.py --images 512 --layers 12 --rounds 5

The data: ``--images`` 256x256 JPEGs in an ``imagefolder`` tree (10 classes); the model: a ViT-Ti/16 config
(192 wide, ``--layers`` blocks, 224 px; random init, saved with a ``ViTImageProcessor``). Contenders, timed end to end from
the saved folders (loading the model and the dataset included), alternating order over ``--rounds`` rounds:

* bare loop: ``load_dataset("imagefolder")``, ``with_transform`` running the image processor, a ``DataLoader``
  with the same batch size and workers, ``model(pixel_values)`` under ``torch.inference_mode``;
* ``predict_logits(model_dir, data_dir, batch_size=..., num_workers=...)`` without a cache, and with one
  (a miss: hashing the weights and writing the entry; then a hit);
* model only: ``model(pixel_values)`` on tensors preprocessed beforehand (what the data pipeline costs).

Writes benchmarks/results/predict_logits.md and prints it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics_speed import _machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "predict_logits.md"


def _write_images(root: Path, n: int) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:256]
    for i in range(n):
        label = i % 10
        base = (np.sin(xx / (8 + label)) + np.cos(yy / (5 + i % 7))) * 60 + 128
        pixels = np.clip(base[..., None] + rng.normal(0, 25, (256, 256, 3)), 0, 255).astype(np.uint8)
        path = root / "train" / f"class{label}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, quality=90)
    return root


def _write_model(folder: Path, layers: int) -> Path:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=224,
        patch_size=16,
        hidden_size=192,
        num_hidden_layers=layers,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=10,
    )
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def bare_loop(model_dir: Path, data_dir: Path, batch_size: int, workers: int) -> np.ndarray:
    """What a user writes by hand: the processor as a dataset transform, a DataLoader, the model."""
    import datasets
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    data = datasets.load_dataset("imagefolder", data_dir=str(data_dir), split="train")

    def transform(batch):
        images = [im.convert("RGB") for im in batch["image"]]
        return {"pixel_values": processor(images=images, return_tensors="pt")["pixel_values"], "label": batch["label"]}

    loader = torch.utils.data.DataLoader(data.with_transform(transform), batch_size=batch_size, num_workers=workers)
    out = []
    with torch.inference_mode():
        for batch in loader:
            out.append(model(pixel_values=batch["pixel_values"]).logits)
    return torch.cat(out).numpy()


def model_only(model, pixel_values: torch.Tensor, batch_size: int) -> np.ndarray:
    with torch.inference_mode():
        return torch.cat(
            [
                model(pixel_values=pixel_values[i : i + batch_size]).logits
                for i in range(0, len(pixel_values), batch_size)
            ]
        ).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument(
        "--layers", type=int, default=4, help="transformer blocks of the ViT-Ti/16 (12 in the real one)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import datasets
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_calibration.io import predict_logits

    datasets.disable_progress_bars()
    machine = _machine()
    tmp = Path(tempfile.mkdtemp(prefix="bench_predict_logits_"))
    data_dir, model_dir = _write_images(tmp / "images", args.images), _write_model(tmp / "vit_ti", args.layers)
    b, w = args.batch_size, args.workers
    model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    data = datasets.load_dataset("imagefolder", data_dir=str(data_dir), split="train")  # warm the datasets cache once
    pixel_values = processor(images=[im.convert("RGB") for im in data["image"]], return_tensors="pt")["pixel_values"]

    def ours(cache=None):
        return predict_logits(
            str(model_dir), str(data_dir), batch_size=b, num_workers=w, cache_dir=cache, progress=False
        )[0]

    times: dict[str, list[float]] = {k: [] for k in ("bare", "ours", "ours_cache_miss", "ours_cache_hit", "model_only")}
    outputs = {}
    for r in range(args.rounds):
        cache = tmp / f"cache{r}"
        steps = {
            "bare": lambda: bare_loop(model_dir, data_dir, b, w),
            "ours": ours,
            "ours_cache_miss": lambda: ours(cache),
            "ours_cache_hit": lambda: ours(cache),
            "model_only": lambda: model_only(model, pixel_values, b),
        }
        order = list(steps) if r % 2 == 0 else ["model_only", "ours_cache_miss", "ours_cache_hit", "ours", "bare"]
        for name in order:  # a cache hit always follows its miss
            t0 = time.perf_counter()
            outputs[name] = steps[name]()
            times[name].append(time.perf_counter() - t0)
            print(f"round {r} {name}: {times[name][-1]:.2f} s", flush=True)
    for name, logits in outputs.items():
        np.testing.assert_allclose(logits, outputs["model_only"], rtol=0, atol=1e-4, err_msg=name)

    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(o / bare for o, bare in zip(times["ours"], times["bare"]))
    n = args.images
    import importlib.metadata as md

    rows = [
        ("bare loop (processor transform + DataLoader + model)", "bare"),
        ("predict_logits, no cache", "ours"),
        ("predict_logits, cache miss (hash the weights, write the entry)", "ours_cache_miss"),
        ("predict_logits, cache hit", "ours_cache_hit"),
        ("model only, on preprocessed tensors", "model_only"),
    ]
    lines = [
        "## predict_logits vs a hand-written inference loop (`benchmarks/predict_logits.py`)",
        "",
        f"- machine: {machine}; shared with other engineers' jobs: compare the ratios, measured side by side in this one run",
        f"- versions: torch {md.version('torch')}, transformers {md.version('transformers')}, datasets {md.version('datasets')}; "
        f"torch threads {torch.get_num_threads()}",
        f"- command: `python benchmarks/predict_logits.py --images {n} --layers {args.layers} --batch-size {b} --workers {w} --rounds {args.rounds}`",
        f"- {n} JPEG images (256x256) in an imagefolder; ViT-Ti/16 config with {args.layers} blocks at 224 px "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, random init); batch {b}, "
        f"{w} DataLoader workers for both loops; each time is end to end from the saved folders (model and dataset loading "
        f"included), median of {args.rounds} rounds in alternating order. All five give the same logits (checked, 1e-4).",
        "",
        "| contender | time (s) | images/s | vs bare loop |",
        "|---|---:|---:|---:|",
    ]
    for label, key in rows:
        lines.append(f"| {label} | {med[key]:.2f} | {n / med[key]:.1f} | {med['bare'] / med[key]:.2f}x |")
    lines += [
        "",
        f"Target: predict_logits within 10 % of the bare loop's throughput. Per round, predict_logits' time / the bare "
        f"loop's: median {paired:.3f}. Seconds per round (the spread is the other jobs on the machine): "
        + "; ".join(f"{key} " + ", ".join(f"{t:.1f}" for t in times[key]) for _, key in rows)
        + ".",
    ]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
