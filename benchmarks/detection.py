"""Train a tiny YOLOS on the drawn shapes, then detection calibration before / after every calibrator (held-out).

Run from the repository root (CPU; the training stops at ``--train-seconds``):

    nice -n 10 python benchmarks/detection.py --train-seconds 420

Data: ``shapes_dataset`` (64 x 64, 1-3 shapes of 3 classes), train / calibration / test = 1500 / 300 / 300 images,
seeds 0 / 1 / 2. Model: YOLOS from a config (hidden 64, 4 layers, patch 8, 20 detection tokens), random init, AdamW
lr 5e-4, batch 16, the model's own Hungarian loss. Detections come from ``predict_detections`` (the model's image
processor and ``post_process_object_detection``), matched at IoU 0.5; calibration and evaluation use the detections
with a raw score >= ``--score-threshold`` (the operating point; each calibrator maps the scores of that set).
Calibrators fitted on the calibration split: Platt, per-class isotonic, temperature on the class logits, box-conditioned
logistic, and netcal's ``LogisticCalibration(detection=True)`` as the peer. mAP@[.5:.95] and mAP@.5 by torchmetrics'
``MeanAveragePrecision`` on the test detections at the threshold. Writes benchmarks/results/detection.{json,md}.
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

from hf_calibration.detection import (
    BoxLogisticCalibration,
    DetectionIsotonic,
    DetectionPlatt,
    DetectionTemperatureScaling,
    d_ece,
    detection_ece,
    laece,
    match_detections,
)
from hf_calibration.io.detection import predict_detections
from hf_calibration.io.shapes import shapes_dataset

OUT = Path(__file__).resolve().parent / "results"


def train_targets(data, processor):
    images = [im.convert("RGB") for im in data["image"]]
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    labels = []
    for objects in data["objects"]:
        xywh = torch.tensor(objects["bbox"], dtype=torch.float32).reshape(-1, 4) / 64
        boxes = torch.cat(
            [xywh[:, :2] + xywh[:, 2:] / 2, xywh[:, 2:]], 1
        )  # normalised (cx, cy, w, h), as DETR's loss takes
        labels.append({"class_labels": torch.tensor(objects["category"], dtype=torch.int64), "boxes": boxes})
    return pixel_values, labels


def mean_ap(preds, target, scores):
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox")
    offset = 0
    batch = []
    for p in preds:
        n = p["scores"].shape[0]
        batch.append(
            {
                "boxes": p["boxes"].float(),
                "scores": torch.as_tensor(scores[offset : offset + n]).float(),
                "labels": p["labels"],
            }
        )
        offset += n
    metric.update(batch, [{"boxes": t["boxes"].float(), "labels": t["labels"]} for t in target])
    out = metric.compute()
    return float(out["map"]), float(out["map_50"])


def thresholded(preds, t):
    out = []
    for p in preds:
        keep = p["scores"] >= t
        out.append({k: v[keep] for k, v in p.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-seconds", type=float, default=420)
    parser.add_argument("--score-threshold", type=float, default=0.3)
    parser.add_argument("--model-dir", help="save the trained detector here, or load it from here when it exists")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 / 20 / 20 images")
    args = parser.parse_args()
    from netcal.scaling import LogisticCalibration
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    start = time.time()
    train, cal, test = (
        shapes_dataset(n, size=64, seed=s)
        for n, s in (((1500, 0), (300, 1), (300, 2)) if not args.quick else ((40, 0), (20, 1), (20, 2)))
    )
    processor = YolosImageProcessor(size={"height": 64, "width": 64}, do_pad=False)
    config = YolosConfig(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=[64, 64],
        patch_size=8,
        num_detection_tokens=20,
        num_labels=3,
        use_mid_position_embeddings=False,
    )
    model = YolosForObjectDetection(config)
    steps, loss = 0, torch.tensor(float("nan"))
    if args.model_dir and Path(args.model_dir, "config.json").exists():
        model = YolosForObjectDetection.from_pretrained(args.model_dir)
        args.train_seconds = 0
    pixel_values, labels = train_targets(train, processor)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=1e-4)
    g = torch.Generator().manual_seed(0)
    t0 = time.time()
    model.train()
    while time.time() - t0 < args.train_seconds:
        idx = torch.randint(0, len(labels), (16,), generator=g).tolist()
        loss = model(pixel_values=pixel_values[idx], labels=[labels[i] for i in idx]).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps += 1
    model.eval()
    if args.model_dir and steps:
        model.save_pretrained(args.model_dir)
    t = args.score_threshold
    cal_p, cal_t, cal_s = predict_detections(model, processor, cal, threshold=0.0, batch_size=50)
    test_p, test_t, test_s = predict_detections(model, processor, test, threshold=0.0, batch_size=50)
    cal_d = match_detections(thresholded(cal_p, t), cal_t, image_sizes=cal_s)
    test_p = thresholded(test_p, t)
    test_d = match_detections(test_p, test_t, image_sizes=test_s)
    calibrators = {
        "Platt": DetectionPlatt(),
        "isotonic (per class)": DetectionIsotonic(3),
        "temperature (class logits)": DetectionTemperatureScaling("softmax"),
        "box logistic (ours)": BoxLogisticCalibration(),
    }

    def row(scores):
        d = test_d.with_scores(scores)
        m, m50 = mean_ap(test_p, test_t, scores)
        return {
            "d_ece": d_ece(d, score_threshold=0.0),
            "detection_ece": detection_ece(d, score_threshold=0.0),
            "laece": laece(d, score_threshold=0.0),
            "map": m,
            "map_50": m50,
        }

    rows = {"uncalibrated": row(test_d.scores)}
    for name, calibrator in calibrators.items():
        rows[name] = row(calibrator.fit(cal_d).calibrate(test_d).scores)
    peer = LogisticCalibration(detection=True).fit(
        np.concatenate([cal_d.scores[:, None], cal_d.features], 1), cal_d.matched.astype(np.int64)
    )
    rows["box logistic (netcal)"] = row(
        np.clip(peer.transform(np.concatenate([test_d.scores[:, None], test_d.features], 1)), 0, 1)
    )
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}",
        "train_steps": steps,
        "final_loss": loss.item(),
        "score_threshold": t,
        "calibration_detections": len(cal_d),
        "test_detections": len(test_d),
        "test_precision": float(test_d.matched.mean()),
        "total_seconds": time.time() - start,
        "rows": rows,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "detection.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Machine: {result['machine']}. Tiny YOLOS, {steps} steps in {args.train_seconds:.0f} s (final loss {result['final_loss']:.3f}); "
        f"score threshold {t}: {len(cal_d)} calibration / {len(test_d)} test detections, test precision {100 * result['test_precision']:.1f} % "
        f"at IoU 0.5.",
        "",
        "| test split | D-ECE % (5-D, 5 bins) | detection ECE % (10 bins) | LaECE % (25 bins) | mAP | mAP@.5 |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {100 * r['d_ece']:.2f} | {100 * r['detection_ece']:.2f} | {100 * r['laece']:.2f} | {100 * r['map']:.2f} | {100 * r['map_50']:.2f} |"
        )
    (OUT / "detection.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
