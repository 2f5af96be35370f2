"""Train a tiny YOLOS on the drawn shapes, then detection calibration before / after every calibrator (held-out).

Run from the repository root (CPU; the training stops at ``--train-seconds``):

    python benchmarks/detection.py --train-seconds 600 --score-threshold 0.05 --seed 0 --model-dir <folder>

(one run a seed; ``--model-dir`` keeps the trained detector and resumes from it; each run writes
``results/detection/seed<N>.json`` and rebuilds ``results/detection.md``, mean ± std over the seeds written so far)

Data: ``shapes_dataset`` (64 x 64, 1-3 shapes of 3 classes), train / calibration / test = 1500 / 300 / 300 images,
data seeds 0 / 1 / 2 (``--seed`` seeds the detector's initialisation and batch order). Model: YOLOS from a config
(hidden 64, 4 layers, patch 8, 20 detection tokens), random init, AdamW lr 5e-4, batch 16, the model's own Hungarian
loss. Detections come from ``predict_detections`` (the model's image
processor and ``post_process_object_detection``), matched at IoU 0.5; calibration and evaluation use the detections
with a raw score >= ``--score-threshold`` (the operating point; each calibrator maps the scores of that set).
Calibrators fitted on the calibration split: Platt, per-class isotonic, temperature on the class logits, box-conditioned
logistic, and netcal's ``LogisticCalibration(detection=True)`` as the peer. mAP@[.5:.95] and mAP@.5 by torchmetrics'
``MeanAveragePrecision`` on the test detections at the threshold; the ranking AP (``ranking_ap``) of the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
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
    ranking_ap,
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
    parser.add_argument("--seed", type=int, default=0, help="seeds the detector's initialisation and batch order")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from netcal.scaling import LogisticCalibration
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(args.seed)
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
    trained = Path(args.model_dir or "", "training.json")
    if args.model_dir and trained.exists():  # resume: the detector this seed trained before
        model = YolosForObjectDetection.from_pretrained(args.model_dir)
        training = json.loads(trained.read_text())
    else:
        pixel_values, labels = train_targets(train, processor)
        opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=1e-4)
        g = torch.Generator().manual_seed(args.seed)
        t0, steps, loss = time.time(), 0, torch.tensor(float("nan"))
        model.train()
        while time.time() - t0 < args.train_seconds:
            idx = torch.randint(0, len(labels), (16,), generator=g).tolist()
            loss = model(pixel_values=pixel_values[idx], labels=[labels[i] for i in idx]).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps += 1
        training = {
            "train_steps": steps,
            "train_seconds": args.train_seconds,
            "final_loss": loss.item(),
            "load_while_training": os.getloadavg()[0],
        }
        if args.model_dir:
            model.save_pretrained(args.model_dir)
            trained.write_text(json.dumps(training))
    model.eval()
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
            "ranking_ap": ranking_ap(d, score_threshold=0.0),
            "map": m,
            "map_50": m50,
        }

    rows = {"uncalibrated": row(test_d.scores)}
    for name, calibrator in calibrators.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            calibrator.fit(cal_d)
        rows[name] = row(calibrator.calibrate(test_d).scores)
        rows[name]["fit_warned_re_ranking"] = any("re-ranks" in str(w.message) for w in caught)
    peer = LogisticCalibration(detection=True).fit(
        np.concatenate([cal_d.scores[:, None], cal_d.features], 1), cal_d.matched.astype(np.int64)
    )
    rows["box logistic (netcal)"] = row(
        np.clip(peer.transform(np.concatenate([test_d.scores[:, None], test_d.features], 1)), 0, 1)
    )
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}",
        "seed": args.seed,
        **training,
        "score_threshold": t,
        "calibration_detections": len(cal_d),
        "test_detections": len(test_d),
        "test_precision": float(test_d.matched.mean()),
        "total_seconds": time.time() - start,
        "rows": rows,
    }
    if args.quick:  # a smoke run: nothing written
        print(json.dumps(result["rows"], indent=1))
        return
    runs = OUT / "detection"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"seed{args.seed}.json").write_text(json.dumps(result, indent=1))
    summarise(sorted(runs.glob("seed*.json")))


def summarise(files: list[Path]) -> None:
    """detection.md: every row as mean ± std over the seeds' JSON files."""
    runs = [json.loads(f.read_text()) for f in files]
    columns = ("d_ece", "detection_ece", "laece", "ranking_ap", "map", "map_50")

    def cell(name, key):
        v = 100 * np.array([r["rows"][name][key] for r in runs])
        return f"{v.mean():.2f} ± {v.std(ddof=1) if len(v) > 1 else 0:.2f}"

    def delta(name):
        v = 100 * np.array([r["rows"][name]["map"] - r["rows"]["uncalibrated"]["map"] for r in runs])
        return f"{v.mean():+.2f} ({v.min():+.2f} .. {v.max():+.2f})"

    lines = [
        f"Machine: {runs[0]['machine']}. Tiny YOLOS, seeds {', '.join(str(r['seed']) for r in runs)} "
        f"(train steps {', '.join(str(r['train_steps']) for r in runs)} in {runs[0]['train_seconds']:.0f} s each); "
        f"score threshold {runs[0]['score_threshold']}: test detections "
        f"{', '.join(str(r['test_detections']) for r in runs)}, test precision "
        f"{', '.join(format(100 * r['test_precision'], '.1f') for r in runs)} % at IoU 0.5. Mean ± std over the "
        "seeds, in %.",
        "",
        "| test split | D-ECE (5-D, 5 bins) | detection ECE (10 bins) | LaECE (25 bins) | ranking AP | mAP | mAP@.5 "
        "| mAP change (min .. max) | fit warned of re-ranking |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in runs[0]["rows"]:
        warned = sum(r["rows"][name].get("fit_warned_re_ranking", False) for r in runs)
        lines.append(
            f"| {name} | "
            + " | ".join(cell(name, k) for k in columns)
            + f" | {delta(name)} | {warned} of {len(runs)} |"
        )
    (OUT / "detection.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
