"""What calibrated serving costs: latency per image and throughput of a plain model, the calibrated PyTorch model and
the calibrated ONNX model (onnxruntime), at batch 1 and 32, and the calibrator's share of the time.

Models are built from configs with random weights (no download); their speed does not depend on the weights. The
calibrator and the conformal predictor are fitted on the model's logits of random images (their cost does not depend
on what they learned either; histogram binning's table size does, and is printed). Per model, in one process:

* plain (PyTorch):   ``model(pixel_values).logits``, no calibrator;
* calibrated (PyTorch): the same model with the calibrator attached, plus ``predictor.predict_sets`` on its own logits
  (what ``hf_calibration.pipeline`` runs besides preprocessing);
* plain (ONNX) and calibrated (ONNX): ``export_onnx`` without / with calibrator and conformal set, run by onnxruntime.

The calibrator's share is (calibrated - plain) / calibrated, for each engine. Each engine is timed in its own phase,
its plain and calibrated paths alternating round by round (an engine's worker threads still busy from its last call
slowed whichever path of the other engine came next: the plain PyTorch model, run right after onnxruntime, measured
66 % slower than the calibrated one at batch 1); onnxruntime's threads do not spin between calls. The median of the
rounds is reported. Writes ``benchmarks/results/serving.json`` (resumable: done rows are kept) and ``serving.md``.

    python benchmarks/serving.py                 # the reported sizes
    python benchmarks/serving.py --models vit-tiny --calibrators temperature_scaling --rounds 5   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT_JSON = HERE / "results" / "serving.json"
OUT_MD = HERE / "results" / "serving.md"
BATCHES = (1, 32)


def build(name: str):
    """A random-init classifier from a config: ``vit-small`` (ViT-S/16, 224 px, ImageNet's 1,000 classes) or
    ``vit-tiny`` (the demo's digits ViT, 16 px, 10 classes)."""
    from transformers import ViTConfig, ViTForImageClassification

    if name == "vit-small":
        config = ViTConfig(
            image_size=224,
            patch_size=16,
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            intermediate_size=1536,
            num_labels=1000,
        )
    elif name == "vit-tiny":
        config = ViTConfig(
            image_size=16,
            patch_size=4,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=10,
        )
    else:
        raise ValueError(f"unknown model {name!r}")
    torch.manual_seed(0)
    return ViTForImageClassification(config).eval(), config.image_size


def fitted(model, size: int, kind: str, method: str):
    from hf_calibration.calibrators import create_calibrator
    from hf_calibration.conformal import ConformalPredictor

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 3, size, size, generator=generator)
    with torch.no_grad():
        z = torch.cat([model(pixel_values=b).logits for b in x.split(64)]) * 20  # spread, as trained logits are
    y = z.argmax(1)
    flip = torch.rand(len(y), generator=generator) < 0.3  # 70 % accurate labels
    y[flip] = torch.randint(0, z.shape[1], (int(flip.sum()),), generator=generator)
    calibrator = create_calibrator(kind).fit(z[:128], y[:128], progress_bar=False)
    predictor = ConformalPredictor(method).fit(z[128:], y[128:], alpha=0.1)
    return calibrator, predictor


def median_time(fn, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def run_one(name: str, kind: str, method: str, rounds: int, threads: int) -> list[dict]:
    import onnxruntime

    from hf_calibration.serving import export_onnx

    torch.set_num_threads(threads)
    model, size = build(name)
    calibrator, predictor = fitted(model, size, kind, method)
    folder = Path(tempfile.mkdtemp(prefix="hf_calibration_serving_"))
    example = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(2))
    export_onnx(model, folder / "plain.onnx", calibrator=None, conformal=None, example_inputs=example, verify=False)
    export_onnx(model, folder / "calibrated.onnx", calibrator=calibrator, conformal=predictor, example_inputs=example)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    # no spin-waiting after a run: two sessions (plain, calibrated) alternate here, and a pool spinning on the 2 cores
    # would slow the other session's run
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {
        key: onnxruntime.InferenceSession(str(folder / f"{key}.onnx"), options, providers=["CPUExecutionProvider"])
        for key in ("plain", "calibrated")
    }
    shutil.rmtree(folder, ignore_errors=True)  # the sessions hold the graphs; 170 MB a model otherwise left behind
    rows = []
    for batch in BATCHES:
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(3))
        feed = {"pixel_values": x.numpy()}
        u = predictor.draw_uniforms(batch, generator=0)

        def plain_torch():
            with torch.no_grad():
                model(pixel_values=x)

        def calibrated_torch():
            with torch.no_grad():
                raw = []
                remove = calibrator_observe(model, raw)
                try:
                    model(pixel_values=x)
                finally:
                    remove()
                predictor.predict_sets(raw[0], from_logits=True, generator=0)

        def plain_onnx():
            sessions["plain"].run(None, feed)

        calibrated_feed = {**feed, **({"u": u.numpy()} if predictor.randomized else {})}

        def calibrated_onnx():
            sessions["calibrated"].run(None, calibrated_feed)

        paths = {
            "plain_torch": plain_torch,
            "calibrated_torch": calibrated_torch,
            "plain_onnx": plain_onnx,
            "calibrated_onnx": calibrated_onnx,
        }
        calibrator.attach(model)
        try:
            for fn in paths.values():  # warm-up
                fn()
            samples = {key: [] for key in paths}
            for engine in ("torch", "onnx"):  # one engine at a time; its two paths alternate
                for _ in range(rounds):
                    for key in (f"plain_{engine}", f"calibrated_{engine}"):
                        plain = key.startswith("plain")
                        if plain:
                            calibrator.detach()
                        samples[key] += median_time(paths[key], 1)
                        if plain:
                            calibrator.attach(model)
        finally:
            calibrator.detach()
        med = {key: statistics.median(v) for key, v in samples.items()}
        spread = {key: _iqr(v) for key, v in samples.items()}
        row = {
            "model": name,
            "calibrator": kind,
            "conformal": method,
            "batch": batch,
            "rounds": rounds,
            "threads": threads,
            **{f"{key}_s": value for key, value in med.items()},
            **{f"{key}_iqr_s": value for key, value in spread.items()},
            "samples_s": samples,
        }
        for engine in ("torch", "onnx"):
            plain, calibrated = med[f"plain_{engine}"], med[f"calibrated_{engine}"]
            row[f"share_{engine}"] = (calibrated - plain) / calibrated
            # the difference is read as a share only beyond the rounds' own spread (the larger interquartile range)
            row[f"noise_{engine}"] = max(spread[f"plain_{engine}"], spread[f"calibrated_{engine}"]) / calibrated
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def _share(row: dict, engine: str) -> str:
    """The calibrator's share of the time, or "within noise" when the difference is inside the rounds' spread. A
    negative share beyond the spread is printed as measured and flagged: the calibrated path does strictly more work,
    so it means the measurement favoured it."""
    share, noise = row[f"share_{engine}"], row.get(f"noise_{engine}")
    if noise is None:  # a result written before the spread was recorded
        return f"{100 * share:.1f} %" if share >= 0 else "within noise"
    if abs(share) <= noise:
        return f"within noise (±{100 * noise:.0f} %)"
    if share < 0:
        return f"{100 * share:.1f} % (±{100 * noise:.0f} %): plain slower, a measurement artefact"
    return f"{100 * share:.1f} %"


def calibrator_observe(model, sink: list):
    """Keep the model's own logits of the next forward (the sets are computed from them, as the pipeline does)."""
    from hf_calibration.calibrators.attach import observe_uncalibrated

    return observe_uncalibrated(model, lambda output: sink.append(output.logits))


def load_avg() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def write_markdown(rows: list[dict], meta: dict) -> None:
    lines = [
        "## Serving cost: `serving.py`",
        "",
        "Latency per image (ms) and throughput (images / s) of a plain model, the calibrated PyTorch model (calibrator "
        "attached, plus the conformal sets from the model's own logits) and the calibrated ONNX graph "
        "(`export_onnx`: calibrator and set inside) in onnxruntime; the calibrator's share is (calibrated - plain) / "
        "calibrated for each engine (plain ONNX: the same export without calibrator and set), shown only where the "
        'difference exceeds the rounds\' own spread (the larger interquartile range of the two), else "within noise". '
        "Random-init models from configs; each engine timed in its own phase, its plain and calibrated paths "
        "alternating; onnxruntime without spin-waiting; median of the rounds.",
        "",
        f"Machine: {meta['machine']}; {meta['threads']} threads for torch and onnxruntime; torch {meta['torch']}, "
        f"onnxruntime {meta['onnxruntime']}. Load average (1 / 5 / 15 min) before: {meta['load_before']}, after: "
        f"{meta['load_after']}."
        + (" **Provisional: taken at load > 2.5; re-run on an idle host.**" if meta["busy"] else ""),
        "",
        f"Command: `{meta['command']}`",
        "",
        "| model | calibrator + set | batch | plain torch ms/img | calibrated torch ms/img | calibrated ONNX ms/img | "
        "img/s torch plain / calibrated / ONNX calibrated | calibrator share torch | calibrator share ONNX |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = r["batch"]
        ms = {k: 1000 * r[f"{k}_s"] / b for k in ("plain_torch", "calibrated_torch", "calibrated_onnx", "plain_onnx")}
        lines.append(
            f"| {r['model']} | {r['calibrator']} + {r['conformal']} | {b} | {ms['plain_torch']:.2f} | {ms['calibrated_torch']:.2f} | "
            f"{ms['calibrated_onnx']:.2f} | {b / r['plain_torch_s']:.0f} / {b / r['calibrated_torch_s']:.0f} / "
            f"{b / r['calibrated_onnx_s']:.0f} | {_share(r, 'torch')} | {_share(r, 'onnx')} |"
        )
    OUT_MD.write_text("\n".join(lines) + "\n")
    print(OUT_MD.read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit-small,vit-tiny")
    parser.add_argument("--calibrators", default="temperature_scaling,histogram_binning")
    parser.add_argument("--conformal", default="raps")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fresh", action="store_true", help="discard the rows already in serving.json")
    args = parser.parse_args(argv)
    import onnxruntime

    done = [] if args.fresh or not OUT_JSON.exists() else json.loads(OUT_JSON.read_text())["rows"]
    load_before = load_avg()
    for name in args.models.split(","):
        for kind in args.calibrators.split(","):
            if any(r["model"] == name and r["calibrator"] == kind and r["conformal"] == args.conformal for r in done):
                continue
            done += run_one(name, kind, args.conformal, args.rounds, args.threads)
            OUT_JSON.write_text(json.dumps({"rows": done}, indent=2))
    load_after = load_avg()
    busy = any(float(v) > 2.5 for v in (load_before.split(" / ")[0], load_after.split(" / ")[0]) if v != "n/a")
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "threads": args.threads,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "load_before": load_before,
        "load_after": load_after,
        "busy": busy,
        "command": "python benchmarks/serving.py " + " ".join(sys.argv[1:]),
    }
    OUT_JSON.write_text(json.dumps({"rows": done, "meta": meta}, indent=2))
    write_markdown(done, meta)


if __name__ == "__main__":
    main()
