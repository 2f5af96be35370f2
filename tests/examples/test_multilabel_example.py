"""examples/multilabel.py at tiny size: a multi-label fine-tune calibrated, its calibrator pushed beside it (the Hub
mocked), and a pipeline returning each label's calibrated probability (checked against sigmoid(calibrator(z)))."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load():
    spec = importlib.util.spec_from_file_location("example_multilabel", EXAMPLES / "multilabel.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_multilabel_example(tmp_path, monkeypatch, capsys):
    import huggingface_hub
    import transformers

    torch.set_num_threads(1)
    uploads, model_pushes = [], []

    class Repo:
        repo_id = "me/vit-digit-tags"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, **kw: Repo())
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "upload_folder",
        lambda self, **kw: (
            uploads.append((kw["path_in_repo"], sorted(p.name for p in Path(kw["folder_path"]).iterdir())))
            or "https://huggingface.co/me/vit-digit-tags/commit/1"
        ),
    )
    monkeypatch.setattr(
        transformers.PreTrainedModel, "push_to_hub", lambda self, repo, **kw: model_pushes.append(repo) or "model-url"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    example = _load()
    out = example.main(
        [
            "--output_dir",
            str(tmp_path / "out"),
            "--num_train_epochs",
            "2",
            "--train_size",
            "300",
            "--calibration_size",
            "200",
            "--test_size",
            "150",
            "--disable_tqdm",
            "true",
            "--push_to_hub_repo",
            "me/vit-digit-tags",
            "--no_dry_run",
            "--calibrator",
            "platt",
        ]
    )
    assert model_pushes == ["me/vit-digit-tags"]
    assert (
        uploads
        and uploads[0][0] == "calibrator"
        and {"config.json", "model.safetensors", "README.md"} <= set(uploads[0][1])
    )
    calibrator = out["calibrator"]
    assert calibrator.kind == "platt" and calibrator.fit_info_["task"] == "multilabel"
    assert out["reports"]["platt"].task == "multilabel"
    # the pipeline's scores: the calibrated sigmoid of the model's logits, one per label
    from transformers import AutoImageProcessor

    from hf_calibration import load_calibrated_model

    folder = out["folder"]
    model = load_calibrated_model(folder)  # calibrated logits
    images = out["pipeline_results"]
    assert len(images) == 3 and all(len(rows) == 3 for rows in images)
    from hf_calibration.demo import digits_splits

    split = digits_splits(42, calibration_size=200, test_size=150, train_size=300)  # TrainingArguments' default seed
    pixels = AutoImageProcessor.from_pretrained(folder)(images=split.test_images[:3], return_tensors="pt")[
        "pixel_values"
    ]
    with torch.no_grad():
        expected = torch.sigmoid(model(pixel_values=pixels).logits).numpy()
    for i, rows in enumerate(images):
        scores = {r["label"]: r["score"] for r in rows}
        assert [scores[t] for t in example.TAGS] == pytest.approx(expected[i].tolist(), abs=1e-5)
    text = capsys.readouterr().out
    assert "Multi-label: macro" in text and "pooled (micro)" in text
