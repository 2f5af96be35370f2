"""A model after MaC-Cal saves a config that names its head; every usual way of loading it rebuilds that head or refuses.

The reference is always the model that was saved: its logits (bit for bit) and its head's weights; the pipeline's
scores are recomputed by hand from the frozen features through the bottleneck.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _models import HEAD_PATHS, digits, digits_dataset, head_input, make_model
from transformers import AutoConfig, AutoModelForImageClassification, ViTImageProcessor, pipeline

from hf_calibration.maccal import MaCCalConfig, MaskedBottleneckHead, load_maccal_model, maccal_stage
from hf_calibration.maccal.persistence import MODEL_TYPE

torch.set_num_threads(1)
FAST = dict(epochs=3, batch_size=64, progress=False)
REPO = Path(__file__).resolve().parents[2]


def _maccal_model(train_briefly, name="vit", **model_kwargs):
    x, y = digits(slice(0, 128), **model_kwargs)
    model = train_briefly(make_model(name, seed=0, **model_kwargs), x, y, steps=10)
    maccal_stage(model, digits_dataset(slice(0, 128), **model_kwargs), MaCCalConfig(**FAST))
    return model.eval(), x


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory, train_briefly):
    """A 3-channel MaC-Cal ViT saved with its image processor (what a pipeline needs), and its logits on 16 images."""
    folder = tmp_path_factory.mktemp("vit-maccal")
    model, x = _maccal_model(train_briefly, num_channels=3)
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 8, "width": 8}, do_normalize=False).save_pretrained(folder)
    with torch.no_grad():
        logits = model(pixel_values=x[:16]).logits
    torch.save({"pixel_values": x[:16], "logits": logits}, folder / "expected.pt")
    return folder, model


def test_config_names_the_head_and_the_backbone(vit_folder):
    folder, model = vit_folder
    saved = json.loads((folder / "config.json").read_text())
    assert saved["model_type"] == MODEL_TYPE
    assert saved["maccal_head"] == {
        "path": "classifier",
        "in_features": 16,
        "hidden": 20,
        "num_labels": 10,
        "base_model_type": "vit",
    }
    # in memory the config is still the backbone's own class (the ViT reads its fields as before)
    from transformers import ViTConfig

    assert isinstance(model.config, ViTConfig) and model.config.model_type == MODEL_TYPE
    # it survives pickling and copying
    for clone in (pickle.loads(pickle.dumps(model.config)), copy.deepcopy(model.config)):
        assert type(clone) is type(model.config) and clone.to_dict() == model.config.to_dict()


@pytest.mark.parametrize("name", ["vit", "swin", "resnet", "timm"])
def test_from_pretrained_and_load_maccal_model_rebuild_the_head(name, tmp_path, train_briefly):
    model, x = _maccal_model(train_briefly, name)
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        expected = model(pixel_values=x).logits
    for loaded in (AutoModelForImageClassification.from_pretrained(tmp_path), load_maccal_model(tmp_path)):
        head = loaded.get_submodule(HEAD_PATHS[name])
        assert type(head) is MaskedBottleneckHead and not loaded.training
        assert type(loaded) is type(model)  # the backbone's own classifier class, as transformers users expect
        with torch.no_grad():
            assert torch.equal(loaded(pixel_values=x).logits, expected)
        # saved again, it loads again (the loaded config still names the head)
        again = tmp_path / f"again-{id(loaded)}"
        loaded.save_pretrained(again)
        with torch.no_grad():
            assert torch.equal(AutoModelForImageClassification.from_pretrained(again)(pixel_values=x).logits, expected)


def test_pipeline_from_the_folder_uses_the_bottleneck(vit_folder):
    from PIL import Image

    folder, _ = vit_folder
    x, _ = digits(slice(0, 1), num_channels=3)
    image = Image.fromarray((x[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    for clf in (
        pipeline("image-classification", model=str(folder)),
        pipeline(
            "image-classification",
            model=load_maccal_model(folder),
            image_processor=ViTImageProcessor.from_pretrained(folder),
        ),
    ):
        model = clf.model
        assert type(model.classifier) is MaskedBottleneckHead
        top = clf(image, top_k=3)
        # by hand: processor output → frozen features → bottleneck → softmax
        pixels = ViTImageProcessor.from_pretrained(folder)(image, return_tensors="pt")["pixel_values"]
        f = head_input("vit", model, pixels)
        h = model.classifier
        with torch.no_grad():
            probs = torch.softmax(torch.relu(f @ h.fc1.weight.T + h.fc1.bias) @ h.fc2.weight.T + h.fc2.bias, -1)[0]
        best = torch.topk(probs, 3)
        assert [d["label"] for d in top] == [model.config.id2label[int(i)] for i in best.indices]
        np.testing.assert_allclose([d["score"] for d in top], best.values.numpy(), rtol=1e-5)


def test_from_config_builds_a_fresh_bottleneck(vit_folder):
    folder, model = vit_folder
    fresh = AutoModelForImageClassification.from_config(AutoConfig.from_pretrained(folder))
    assert type(fresh.classifier) is MaskedBottleneckHead
    assert fresh.classifier.fc1.weight.shape == model.classifier.fc1.weight.shape


def _run(code: str, *, with_package: bool) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (nothing imported yet), with or without this checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    cwd = REPO if with_package else Path(__file__).parent  # from the tests folder, `hf_calibration` is not importable
    if with_package:
        env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_without_hf_calibration_transformers_refuses_instead_of_a_random_head(vit_folder):
    folder, _ = vit_folder
    code = f"""
from transformers import AutoModelForImageClassification, pipeline
for load in (lambda: AutoModelForImageClassification.from_pretrained({str(folder)!r}),
             lambda: pipeline("image-classification", model={str(folder)!r})):
    try:
        model = load()
    except ValueError as err:
        print("refused:", str(err).splitlines()[0])
    else:
        print("loaded:", type(getattr(model, "model", model).classifier).__name__)
import sys
print("hf_calibration imported:", "hf_calibration" in sys.modules)
"""
    out = _run(code, with_package=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "hf_calibration imported: False"
    assert len(lines) == 3 and all(line.startswith("refused:") and f"`{MODEL_TYPE}`" in line for line in lines[:2]), (
        out.stdout
    )


def test_importing_hf_calibration_first_is_enough(vit_folder):
    """`import hf_calibration` before transformers: the model type is registered when transformers loads its Auto classes."""
    folder, _ = vit_folder
    code = f"""
import sys, torch
import hf_calibration
assert "transformers" not in sys.modules  # the import stayed light
from transformers import AutoModelForImageClassification, pipeline
torch.set_num_threads(1)  # as the expected logits were computed
model = AutoModelForImageClassification.from_pretrained({str(folder)!r})
expected = torch.load({str(folder / "expected.pt")!r})
with torch.no_grad():
    print(type(model.classifier).__name__, torch.equal(model(pixel_values=expected["pixel_values"]).logits, expected["logits"]))
print(type(pipeline("image-classification", model={str(folder)!r}).model.classifier).__name__)
"""
    out = _run(code, with_package=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["MaskedBottleneckHead", "True", "MaskedBottleneckHead"]


def test_a_checkpoint_of_the_earlier_format_still_loads(tmp_path, train_briefly):
    """Saved before the config named its head: the backbone's model_type plus a `maccal_head` entry."""
    model, x = _maccal_model(train_briefly)
    base = type(model.config).maccal_base
    old = copy.deepcopy(model)
    old.config.__class__ = base
    del old.config.maccal_head["base_model_type"]
    old.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vit"
    loaded = load_maccal_model(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(pixel_values=x).logits, model(pixel_values=x).logits)


def test_loader_rejects_a_plain_checkpoint(tmp_path):
    make_model("vit", seed=0).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="maccal_head"):
        load_maccal_model(tmp_path)
    with pytest.raises(ValueError, match="`path`"):
        load_maccal_model(tmp_path / "missing")
    with pytest.raises(TypeError, match="`path`"):
        load_maccal_model(3)


def test_non_finite_head_weights_are_refused(vit_folder, tmp_path):
    # issue 23 item 12: NaN MaC-Cal head weights loaded without complaint
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _ = vit_folder
    head = json.loads((folder / "config.json").read_text())["maccal_head"]["path"]
    for value in (float("nan"), float("inf")):
        bad = tmp_path / f"bad-{value}"
        shutil.copytree(folder, bad)
        tensors = load_file(bad / "model.safetensors")
        name = next(k for k in sorted(tensors) if k.startswith(head + ".") and tensors[k].is_floating_point())
        tensors[name].view(-1)[0] = value
        save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
        for load in (load_maccal_model, AutoModelForImageClassification.from_pretrained):
            with pytest.raises(ValueError, match=r"is corrupted: the MaC-Cal head's .* holds NaN or inf"):
                load(bad)
