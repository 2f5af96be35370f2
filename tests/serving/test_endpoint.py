"""The Inference Endpoints handler: written beside a calibrated model, imported from the saved folder in a fresh
process as the Endpoint does, called on images as bytes, base64 and PIL; its answers equal ``hf_calibration.pipeline``'s.
And the issue's end-to-end case: a ViT fine-tuned and calibrated the README's way (``CalibrationTrainer(calibrate_on_eval
=True, endpoint_handler=True)``), with a conformal predictor, exported to ONNX and served from onnxruntime and from the
handler, both returning the pipeline's probabilities (to 1e-5) and sets. What the Endpoint would fail on is refused
when the files are written: no image processor, an install with no address to put in requirements.txt."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _trained import IMAGE_SIZE, processor, splits

from hf_calibration.serving import write_endpoint_handler

REQUIREMENT = (
    "hf-calibration @ git+https://example.org/hf-calibration@v0.1.0"  # what a user installed from a clone gives
)
REPO = Path(__file__).resolve().parents[2]

# run in a fresh interpreter inside the saved folder, as the Endpoint does: import handler.py from there, build the
# handler, then the pipeline, and answer the same requests with both (the same order: the same random draws)
SCRIPT = r"""
import base64, io, json, sys
sys.path.insert(0, sys.argv[1])
from PIL import Image
from handler import EndpointHandler
import hf_calibration

folder, images_file = sys.argv[1], sys.argv[2]
blobs = [base64.b64decode(b) for b in json.load(open(images_file))]
pil = [Image.open(io.BytesIO(b)) for b in blobs]
handler = EndpointHandler(folder)
answers = {
    "bytes": [handler({"inputs": b}) for b in blobs],
    "base64": handler({"inputs": [base64.b64encode(b).decode() for b in blobs], "parameters": {"top_k": 3}}),
    "pil": [handler({"inputs": im}) for im in pil],
    "data_url": handler({"inputs": "data:image/png;base64," + base64.b64encode(blobs[0]).decode()}),
}
pipe = hf_calibration.pipeline("image-classification", model=folder)
reference = {
    "bytes": [pipe(im) for im in pil],
    "base64": pipe(pil, top_k=3, batch_size=len(pil)),  # the handler batches a list
    "pil": [pipe(im) for im in pil],
    "data_url": pipe(pil[0]),
}
print(json.dumps({"handler": answers, "pipeline": reference}))
"""


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def _serve(folder: Path, images, tmp_path: Path) -> dict:
    images_file = tmp_path / "images.json"
    images_file.write_text(json.dumps([base64.b64encode(_png(im)).decode() for im in images]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), str(images_file)],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A ViT fine-tuned on the digits with ``CalibrationTrainer(calibrate_on_eval=True, endpoint_handler=True)``, saved
    with ``save_model``; a RAPS predictor fitted on held-out logits, behind that calibrator, in ``conformal/`` beside it."""
    from transformers import TrainingArguments

    from hf_calibration import CalibrationTrainer
    from hf_calibration.conformal import ConformalPredictor
    from hf_calibration.demo import PixelDataset, tiny_vit

    data = splits()
    proc = processor()
    train = PixelDataset(data.train_images, data.train_labels, proc)
    calibration = PixelDataset(data.calibration_images[:150], data.calibration_labels[:150], proc)
    folder = tmp_path_factory.mktemp("fine_tuned") / "vit-digits"
    args = TrainingArguments(
        output_dir=str(folder),
        num_train_epochs=15,
        per_device_train_batch_size=64,
        learning_rate=3e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    model = tiny_vit(image_size=IMAGE_SIZE, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    trainer = CalibrationTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=calibration,
        processing_class=proc,  # saved beside the model by save_model: the Endpoint reads images through it
        calibrate_on_eval=True,
        endpoint_handler=REQUIREMENT,
    )
    trainer.train()
    trainer.save_model(str(folder))
    held_out = PixelDataset(data.calibration_images[150:], data.calibration_labels[150:], proc)
    with torch.no_grad():
        z = trainer.model.eval()(pixel_values=held_out.pixel_values).logits
    # behind the calibrator the folder serves: sets on its scores (a folder mixing the two is refused at load)
    predictor = ConformalPredictor("raps").fit(z, held_out.labels, alpha=0.1, calibrator=trainer.calibrator)
    predictor.save_pretrained(folder / "conformal")
    return folder


def test_the_saved_folder_has_the_handler_files(fine_tuned):
    assert (fine_tuned / "handler.py").read_text().startswith("# Written by hf-calibration")
    assert (fine_tuned / "requirements.txt").read_text().splitlines()[-1] == REQUIREMENT
    assert (fine_tuned / "preprocessor_config.json").is_file()
    assert (fine_tuned / "calibrator" / "config.json").is_file() and (
        fine_tuned / "conformal" / "config.json"
    ).is_file()


def test_handler_answers_equal_the_pipeline(fine_tuned, tmp_path):
    images = splits().test_images[:6]
    answers = _serve(fine_tuned, images, tmp_path)
    assert answers["handler"] == answers["pipeline"]
    rows = answers["handler"]["bytes"][0]
    assert (
        all("in_set" in row for row in rows) and abs(sum(r["score"] for r in rows) - 1) < 1
    )  # calibrated scores, sets
    assert len(answers["handler"]["base64"]) == 6 and all(isinstance(r, list) for r in answers["handler"]["base64"])


def test_onnx_and_the_handler_serve_the_pipelines_probabilities_and_sets(fine_tuned, tmp_path):
    """The issue's 'done when': ONNX Runtime and the handler return what hf_calibration.pipeline returns."""
    import onnxruntime

    from hf_calibration import pipeline
    from hf_calibration.conformal import ConformalPredictor
    from hf_calibration.conformal.draws import input_draws
    from hf_calibration.serving import export_onnx

    images = splits().test_images[:40]
    path = tmp_path / "vit-digits.onnx"
    result = export_onnx(fine_tuned, path)
    assert result["outputs"] == ["logits", "probabilities", "prediction_set"] and result["inputs"] == [
        "pixel_values",
        "u",
    ]

    pipe = pipeline("image-classification", model=str(fine_tuned), top_k=10)
    expected = pipe(images)  # one uniform draw per image, derived from its pixel values (draws="input", the default)
    predictor = ConformalPredictor.from_pretrained(fine_tuned / "conformal")
    pixel_values = processor()(images=images, return_tensors="np")["pixel_values"]
    u = input_draws(pixel_values, predictor.seed)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _, probabilities, sets = session.run(None, {"pixel_values": pixel_values, "u": u.numpy()})
    labels = pipe.model.config.id2label
    for i, rows in enumerate(expected):
        by_label = {r["label"]: r for r in rows}
        assert len(by_label) == 10
        for k in range(10):
            assert abs(by_label[labels[k]]["score"] - float(probabilities[i, k])) <= 1e-5
            assert by_label[labels[k]]["in_set"] == bool(sets[i, k])
    assert sets.sum(1).max() > 1 and sets.sum(1).min() >= 1

    answers = _serve(fine_tuned, images[:5], tmp_path)  # the handler, in its own process: the pipeline's answers
    assert answers["handler"] == answers["pipeline"]
    for i, rows in enumerate(answers["handler"]["bytes"]):  # and ONNX's (the same images: the same u)
        for row in rows:
            k = int(pipe.model.config.label2id[row["label"]])
            assert abs(row["score"] - float(probabilities[i, k])) <= 1e-5 and row["in_set"] == bool(sets[i, k])


def test_write_endpoint_handler_never_replaces_a_users_file(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "handler.py").write_text("class EndpointHandler: ...\n")
    with pytest.raises(ValueError, match="did not\nwrite|did not write"):
        write_endpoint_handler(folder)
    assert (folder / "handler.py").read_text() == "class EndpointHandler: ...\n"
    (folder / "handler.py").unlink()
    write_endpoint_handler(folder, requirement="hf-calibration @ git+https://example.org/hf-calibration")
    with pytest.raises(ValueError, match="overwrite=True"):
        write_endpoint_handler(folder)
    write_endpoint_handler(folder, requirement="hf-calibration==0.1.0", overwrite=True)
    assert (folder / "requirements.txt").read_text().splitlines()[-1] == "hf-calibration==0.1.0"
    with pytest.raises(ValueError, match="requirement"):
        write_endpoint_handler(folder, requirement="a\nb", overwrite=True)


def _bare_handler(folder, module_name: str):
    """``(handler, module)``: the written handler.py's ``EndpointHandler``, built without its ``__init__`` (no model
    needed to check the requests), and the module it was loaded as."""
    import importlib.util

    from hf_calibration.serving.endpoint import handler_source

    path = folder / "handler.py"
    path.write_text(handler_source())
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EndpointHandler.__new__(module.EndpointHandler), module


def test_handler_refuses_bad_requests(tmp_path):
    handler, _ = _bare_handler(tmp_path, "written_handler")
    handler.pipeline = lambda images, **kw: [[{"label": "0", "score": 1.0}] for _ in images]
    with pytest.raises(ValueError, match="base64"):
        handler({"inputs": "not base64!"})
    with pytest.raises(ValueError, match="decoded"):
        handler({"inputs": b"not an image"})
    with pytest.raises(ValueError, match="Unexpected parameter"):
        handler({"inputs": b"x", "parameters": {"function_to_apply": "none"}})
    with pytest.raises(TypeError, match="input 0"):
        handler({"inputs": 3})
    with pytest.raises(ValueError, match="inputs"):
        handler({"parameters": {}})
    for top_k in ("2", 1.5, -1, 0, True):  # "2" and 1.5 were TypeErrors inside the pipeline; -1 dropped the last label
        with pytest.raises(ValueError, match="parameter `top_k`"):
            handler({"inputs": b"x", "parameters": {"top_k": top_k}})


def test_a_list_of_images_runs_in_batches(tmp_path):
    """32 images ran one forward each (5x slower than pipeline(batch_size=32))."""
    from PIL import Image

    handler, module = _bare_handler(tmp_path, "written_handler_batches")
    calls = []
    handler.pipeline = lambda images, **kw: calls.append(kw) or [[{"label": "0", "score": 1.0}] for _ in images]
    image = Image.new("RGB", (8, 8))
    assert len(handler({"inputs": [image] * 40})) == 40 and calls[-1]["batch_size"] == module.BATCH_SIZE == 32
    assert len(handler({"inputs": [image] * 3, "parameters": {"top_k": 2}})) == 3
    assert calls[-1] == {"batch_size": 3, "top_k": 2}


def test_what_the_endpoint_would_fail_on_is_refused_when_the_files_are_written(tmp_path, monkeypatch):
    """A model saved without its image processor made the Endpoint crash at start ("Found no image processor"); the
    default requirement pinned a version no index serves for an install from a clone."""
    from importlib import metadata

    from transformers import TrainingArguments

    from hf_calibration import CalibrationTrainer
    from hf_calibration.demo import PixelDataset, tiny_vit

    model = tiny_vit(image_size=IMAGE_SIZE, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    with pytest.raises(ValueError, match="image processor.*preprocessor_config.json"):
        write_endpoint_handler(folder, requirement=REQUIREMENT)
    assert not (folder / "handler.py").exists()
    processor().save_pretrained(folder)
    write_endpoint_handler(folder, requirement=REQUIREMENT)

    data = splits()
    dataset = PixelDataset(data.calibration_images[:20], data.calibration_labels[:20], processor())
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    common = {
        "model": model,
        "args": args,
        "train_dataset": dataset,
        "eval_dataset": dataset,
        "calibrate_on_eval": True,
    }
    with pytest.raises(ValueError, match="`processing_class`.*`endpoint_handler`"):
        CalibrationTrainer(**common, endpoint_handler=REQUIREMENT)

    class _LocalInstall:  # what pip records for `pip install -e .` from a clone
        version = "0.1.0"

        def read_text(self, name):
            return json.dumps({"url": "file:///home/me/hf-calibration", "dir_info": {"editable": True}})

    monkeypatch.setattr(metadata, "distribution", lambda name: _LocalInstall())
    with pytest.raises(ValueError, match="installed from the local folder file:///home/me/hf-calibration"):
        CalibrationTrainer(**common, processing_class=processor(), endpoint_handler=True)  # before training, not after
    with pytest.raises(ValueError, match="pass the requirement explicitly"):
        write_endpoint_handler(folder, overwrite=True)
