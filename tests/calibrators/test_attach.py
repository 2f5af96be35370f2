"""attach / detach on transformers and timm classifiers, and through an image-classification pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident  # noqa: F401  (puts tests/ on sys.path for _models)
from _models import MODEL_NAMES, digits, make_model

from hf_calibration.calibrators import SMARTCalibrator, TemperatureScaling, attached_calibrator


def _fitted(kind: str, num_labels: int = 10):
    rng = np.random.default_rng(0)
    y = rng.integers(0, num_labels, 300)
    z = (3 * (rng.normal(size=(300, num_labels)) + 2 * np.eye(num_labels)[y])).astype(np.float32)
    if kind == "ts":
        return TemperatureScaling().fit(z, y, progress_bar=False)
    return SMARTCalibrator(max_steps=100).fit(z, y, progress_bar=False)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("kind", ["ts", "smart"])
def test_attach_calibrates_and_detach_restores_bit_for_bit(name, kind):
    model = make_model(name).eval()
    x, _ = digits(slice(0, 16))
    with torch.no_grad():
        before = model(pixel_values=x).logits.clone()
        cal = _fitted(kind)
        assert cal.attach(model) is model and attached_calibrator(model) is cal
        during = model(pixel_values=x)
        tuple_out = model(pixel_values=x, return_dict=False)
        with_loss = model(pixel_values=x, labels=torch.zeros(16, dtype=torch.long))
    expected = before / cal.temperature(before)[:, None]
    # float32 arithmetic at the logits' scale: a few ulps of max|z| (the calibrator shifts rows by their max)
    tol = dict(rtol=1e-6, atol=8 * torch.finfo(torch.float32).eps * float(before.abs().max()))
    torch.testing.assert_close(during.logits, expected, **tol)
    assert torch.equal(during["logits"], during.logits)  # dict view and attribute agree
    torch.testing.assert_close(tuple_out[0], expected, **tol)
    torch.testing.assert_close(with_loss.logits, expected, **tol)
    assert torch.equal(during.logits.argmax(1), before.argmax(1))
    assert not any(
        k.startswith("_hf") or "calibr" in k for k in model.state_dict()
    )  # the model's checkpoint is unchanged
    assert cal.detach() is model and attached_calibrator(model) is None
    with torch.no_grad():
        after = model(pixel_values=x).logits
    assert torch.equal(after, before)


def test_attach_twice_and_detach_twice_are_clear():
    model = make_model("resnet").eval()
    cal, other = _fitted("ts"), _fitted("ts")
    cal.attach(model)
    with pytest.raises(RuntimeError, match="already attached"):
        cal.attach(make_model("vit"))
    with pytest.raises(ValueError, match="detach it first"):
        other.attach(model)
    cal.detach()
    with pytest.raises(RuntimeError, match="not attached"):
        cal.detach()
    with pytest.raises(TypeError, match="model"):
        cal.attach("resnet")


def test_attach_on_a_bare_timm_module_returning_a_tensor():
    model = make_model("timm").timm_model.eval()
    x, _ = digits(slice(0, 8))
    with torch.no_grad():
        before = model(x).clone()
        cal = _fitted("smart")
        cal.attach(model)
        out = model(x)
        cal.detach()
        assert torch.equal(model(x), before)
    torch.testing.assert_close(out, before / cal.temperature(before)[:, None], rtol=1e-6, atol=0)


def test_pipeline_scores_are_calibrated():
    from PIL import Image
    from transformers import ViTImageProcessor, pipeline

    model = make_model("vit", num_channels=3, image_size=8).eval()
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    x, _ = digits(slice(0, 4))
    images = [Image.fromarray((255 * x[i, 0].numpy()).astype(np.uint8)).convert("RGB") for i in range(4)]
    clf = pipeline("image-classification", model=model, image_processor=processor, device="cpu")
    plain = clf(images, top_k=10)
    cal = _fitted("smart")
    cal.attach(model)
    calibrated = clf(images, top_k=10)
    # expected: the model's own logits on the processed images, calibrated, softmaxed
    with torch.no_grad():
        logits = model.__class__.forward(
            model, pixel_values=processor(images, return_tensors="pt")["pixel_values"]
        ).logits
    expected = torch.softmax(cal(logits), 1)
    for i in range(4):
        got = {d["label"]: d["score"] for d in calibrated[i]}
        for k in range(10):
            assert got[model.config.id2label[k]] == pytest.approx(expected[i, k].item(), abs=1e-5)
        assert plain[i][0]["label"] == calibrated[i][0]["label"]  # same top class
        assert plain[i][0]["score"] != pytest.approx(calibrated[i][0]["score"], abs=1e-6)
    cal.detach()
    again = clf(images, top_k=10)
    assert again == plain


def test_attach_accepts_a_pipeline_object():
    from transformers import ViTImageProcessor, pipeline

    model = make_model("vit", num_channels=3, image_size=8).eval()
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    clf = pipeline("image-classification", model=model, image_processor=processor, device="cpu")
    cal = _fitted("ts")
    assert cal.attach(clf) is clf and attached_calibrator(model) is cal  # used to raise TypeError
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        calibrated = model(pixel_values=x).logits
        assert cal.detach() is model
        plain = model(pixel_values=x).logits
    torch.testing.assert_close(calibrated, plain / cal.fitted_temperature, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="torch.nn.Module or a transformers pipeline"):
        cal.attach(object())


def test_attach_warns_when_predictions_may_change(caplog):
    import logging

    class Permuting(TemperatureScaling):  # not registered: a stand-in for vector/matrix scaling
        kind = "test_permuting"
        preserves_argmax = False

    cal = Permuting()
    cal.load_state_dict(_fitted("ts").state_dict())
    cal.fit_info_ = {"num_classes": 10}
    model = make_model("resnet").eval()
    with caplog.at_level(logging.WARNING):
        cal.attach(model)
    assert caplog.text.count("may change the predicted class") == 1 and "preserves_argmax=False" in caplog.text
    cal.detach()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _fitted("ts").attach(model)
    assert "predicted class" not in caplog.text
