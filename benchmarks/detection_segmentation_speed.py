"""Speed of the detection and segmentation calibration metrics (issue 56 targets).

Run from the repository root:

    python benchmarks/detection_segmentation_speed.py                 # both parts, writes JSON + markdown
    python benchmarks/detection_segmentation_speed.py --images 20     # fewer 512 x 512 x 150 images

Detection: detection ECE (10 bins) and D-ECE over (confidence, cx, cy, w, h) (5 bins a dimension) on 1e5 matched
detections against netcal 1.4's ``ECE(detection=True)`` on the same arrays, side by side in one process, median
of ``--repeats`` calls each (the ratio is what to read on a shared machine); plus ``match_detections`` on 1,000
images x 100 detections. Segmentation: ``PixelCalibrationAccumulator`` over ``--images`` images of 512 x 512 x 150
float32 logits in batches of 2 (one batch, fed repeatedly), top-label only and with the classwise sums and boundary
ECE; peak memory is this process's high-water mark (``ru_maxrss``) above the resident size after the batch exists.
Writes benchmarks/results/detection_segmentation_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from hf_calibration.detection import Detections, d_ece, detection_ece, match_detections
from hf_calibration.segmentation import PixelCalibrationAccumulator

OUT = Path(__file__).resolve().parent / "results"


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), value


def detection_part(repeats: int) -> dict:
    from netcal.metrics import ECE

    rng = np.random.default_rng(0)
    n = 100_000
    scores = rng.uniform(0.05, 0.99, n)
    features = rng.uniform(0.01, 0.99, (n, 4))
    matched = rng.random(n) < scores**1.5
    d = Detections(
        scores=scores,
        labels=np.zeros(n, int),
        matched=matched,
        iou=np.where(matched, 0.7, 0.0),
        image=np.zeros(n, int),
        features=features,
        logits=None,
        iou_threshold=0.5,
        num_ground_truth=int(matched.sum()),
    )
    y = matched.astype(np.int64)
    x5 = np.concatenate([scores[:, None], features], 1)
    rows = {}
    for name, ours, theirs in [
        (
            "detection ECE (10 bins)",
            lambda: detection_ece(d, score_threshold=0.0),
            lambda: ECE(bins=10, detection=True).measure(scores, y),
        ),
        (
            "D-ECE (conf, cx, cy, w, h; 5 bins each)",
            lambda: d_ece(d, score_threshold=0.0),
            lambda: ECE(bins=5, detection=True).measure(x5, y),
        ),
    ]:
        ours()  # warm-up (numba's cached kernels load on the first call)
        t_ours, v_ours = _median_time(ours, repeats)
        t_net, v_net = _median_time(theirs, repeats)
        rows[name] = {"ours_s": t_ours, "netcal_s": t_net, "speedup": t_net / t_ours, "abs_diff": abs(v_ours - v_net)}
    preds, target = [], []
    for _ in range(1000):
        xy = rng.uniform(0, 500, (100, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(5, 100, (100, 2))], 1)
        preds.append({"boxes": boxes, "scores": rng.uniform(0, 1, 100), "labels": rng.integers(0, 10, 100)})
        target.append({"boxes": boxes[:20] + rng.normal(0, 5, (20, 4)).clip(-2, 2), "labels": preds[-1]["labels"][:20]})
    match_detections(preds[:2], target[:2])
    t_match, _ = _median_time(
        lambda: match_detections(preds, target, image_sizes=[(600, 600)] * 1000), max(1, repeats // 3)
    )
    return {"n": n, "rows": rows, "match_1000x100_s": t_match}


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def segmentation_part(images: int, classwise_images: int) -> dict:
    from torchmetrics.classification import MulticlassCalibrationError

    torch.manual_seed(0)
    z = torch.randn(2, 150, 512, 512) * 3
    y = torch.randint(0, 150, (2, 512, 512))
    y[:, :, :16] = 255
    out = {}
    for name, kw, n_images in [
        ("top-label ECE + AdaECE", dict(classwise=False), images),
        ("+ classwise + boundary (k=2)", dict(classwise=True, boundary_width=2), classwise_images),
    ]:
        acc = PixelCalibrationAccumulator(150, from_logits=True, **kw)
        acc.update(z[:1, :, :8], y[:1, :8])  # warm-up
        acc.reset()
        base = _rss_kb()
        t = time.perf_counter()
        for _ in range(n_images // 2):
            acc.update(z, y)
        seconds = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out[name] = {
            "images": n_images,
            "seconds": seconds,
            "per_image_s": seconds / n_images,
            "peak_above_batch_mb": max(0, peak - base) / 1024,
            "ece": acc.compute()["ece"],
        }
    # The peer, after the memory rows (its update keeps every pixel): torchmetrics' top-label ECE on the same
    # batches, interleaved batch by batch with ours so both see the same load.
    ours = PixelCalibrationAccumulator(150, from_logits=True, classwise=False)
    peer = MulticlassCalibrationError(150, n_bins=15, norm="l1", ignore_index=255)
    times = {"ours": 0.0, "torchmetrics": 0.0}
    for _ in range(images // 2):
        for side, metric in (("ours", ours), ("torchmetrics", peer)):
            t = time.perf_counter()
            metric.update(z, y)
            times[side] += time.perf_counter() - t
    t = time.perf_counter()
    peer_ece = float(peer.compute())
    times["torchmetrics"] += time.perf_counter() - t
    out["side by side, top-label ECE"] = {
        "images": images,
        "ours_s": times["ours"],
        "torchmetrics_s": times["torchmetrics"],
        "ours_ece": ours.compute()["ece"],
        "torchmetrics_ece": peer_ece,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--classwise-images", type=int, default=10, help="images for the classwise + boundary row")
    parser.add_argument("--skip-segmentation", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f} at the start",
        "detection": detection_part(args.repeats),
    }
    if not args.skip_segmentation:
        result["segmentation"] = segmentation_part(args.images, args.classwise_images)
    elif (OUT / "detection_segmentation_speed.json").exists():  # keep the last run's segmentation part
        earlier = json.loads((OUT / "detection_segmentation_speed.json").read_text())
        if "segmentation" in earlier:
            result["segmentation"] = earlier["segmentation"]
            result["segmentation_machine"] = earlier["machine"]
    (OUT / "detection_segmentation_speed.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Machine: {result['machine']}.",
        "",
        "| metric (1e5 detections) | ours (ms) | netcal (ms) | netcal / ours | |ours - netcal| |",
        "|---|---|---|---|---|",
    ]
    for name, r in result["detection"]["rows"].items():
        lines.append(
            f"| {name} | {1e3 * r['ours_s']:.1f} | {1e3 * r['netcal_s']:.1f} | {r['speedup']:.0f}x | {r['abs_diff']:.1e} |"
        )
    lines += [
        "",
        f"`match_detections`, 1,000 images x 100 detections (20 ground truth each): {result['detection']['match_1000x100_s']:.2f} s.",
    ]
    if "segmentation" in result:
        lines += [
            "",
            "| pixel metrics, 512 x 512 x 150 float32 logits | images | seconds | s / image | peak above the batch (MB) |",
            "|---|---|---|---|---|",
        ]
        side = result["segmentation"].pop("side by side, top-label ECE", None)
        for name, r in result["segmentation"].items():
            lines.append(
                f"| {name} | {r['images']} | {r['seconds']:.1f} | {r['per_image_s']:.2f} | {r['peak_above_batch_mb']:.0f} |"
            )
        if side:
            lines += [
                "",
                f"Side by side on the same {side['images']} images (interleaved batch by batch): ours {side['ours_s']:.1f} s, "
                f"torchmetrics' `MulticlassCalibrationError` {side['torchmetrics_s']:.1f} s "
                f"({side['torchmetrics_s'] / side['ours_s']:.1f}x); ECE {side['ours_ece']:.6f} against {side['torchmetrics_ece']:.6f}.",
            ]
    (OUT / "detection_segmentation_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
