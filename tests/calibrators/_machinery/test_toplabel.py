"""The top-label adaptor: hand-worked rescaling, the argmax clamp, extreme logits, and attach / pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from _models import digits, make_model
from _toplabel_reference import CAP, expected_top, top_label_view
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hf_calibration.calibrators import IsotonicRegression
from hf_calibration.calibrators._machinery.toplabel import TopLabelCalibrator, rescale_top_label, top_label


class ConstantTop(TopLabelCalibrator):
    """Every top-label confidence becomes ``value`` (a stand-in for a fitted map)."""

    default_objective = "constant"
    criterion = "nothing"

    def __init__(self, value: float = 0.3):
        super().__init__()
        self.value = value

    def _fit_confidence(self, confidence, correct, top, num_classes):
        return {}

    def _map_confidence(self, confidence, top):
        return np.full_like(confidence, self.value)


def _probs(log_p) -> np.ndarray:
    return torch.softmax(torch.as_tensor(log_p).double(), 1).numpy()


def test_hand_worked_rescaling():
    z = np.log([[0.5, 0.4, 0.1]])
    parts = top_label(z)
    assert parts.confidence[0] == pytest.approx(0.5, abs=1e-15)
    assert parts.floor[0] == pytest.approx(0.4 / 0.9, abs=1e-15)  # p_2 / (1 - p_1 + p_2)
    # p' = 0.7: the others share 0.3 in proportion 4 : 1
    np.testing.assert_allclose(
        _probs(rescale_top_label(parts, np.array([0.7]))), [[0.7, 0.24, 0.06]], rtol=0, atol=1e-15
    )
    # p' = 0.3 would give [0.3, 0.56, 0.14] and promote class 1: clamped to the tie 4/9, 4/9, 1/9
    clamped = rescale_top_label(parts, np.array([0.3]))
    np.testing.assert_allclose(_probs(clamped), [[4 / 9, 4 / 9, 1 / 9]], rtol=0, atol=1e-15)
    assert clamped[0, 0] >= clamped[0, 1]


def test_two_classes_floor_is_one_half():
    parts = top_label(np.array([[2.0, -1.0], [-3.0, 4.0]]))
    np.testing.assert_allclose(parts.floor, [0.5, 0.5], rtol=0, atol=0)
    out = _probs(rescale_top_label(parts, np.array([0.1, 0.99])))
    np.testing.assert_allclose(out, [[0.5, 0.5], [0.01, 0.99]], rtol=0, atol=1e-15)


def test_argmax_kept_when_the_floor_ties_a_later_class():
    # top at index 2, runner-up at index 1: at the tie, argmax would pick index 1 without the base class's guard
    z, y = overconfident(200, 3, seed=0)
    cal = ConstantTop(0.3).fit(z, y)
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.5], [0.05, 0.15, 0.8]]))
    out = cal(logits)
    assert torch.equal(out.argmax(1), torch.tensor([2, 2]))
    np.testing.assert_allclose(_probs(out)[0], [1 / 9, 4 / 9, 4 / 9], rtol=0, atol=1e-6)
    np.testing.assert_allclose(
        _probs(out)[1], [1 / 7, 3 / 7, 3 / 7], rtol=0, atol=1e-6
    )  # floor 0.15 / 0.35 = 3/7 > 0.3


@settings(max_examples=60, deadline=None)
@given(
    z=arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(2, 7)), elements=st.floats(-60, 60)),
    p_new=st.floats(0.0, 1.0),
)
def test_rescaling_matches_the_formula(z, p_new):
    """Against ``q_top = clamp(p')``, ``q_k = p_k (1 - q_top) / (1 - p_1)`` from scipy's softmax."""
    p, top, conf, floor = top_label_view(z)
    q_top = expected_top(np.full(len(z), p_new), floor)
    rows = np.arange(len(z))
    rest = p.copy()
    rest[rows, top] = 0.0
    expected = rest / rest.sum(1, keepdims=True) * (1 - q_top)[:, None]
    expected[rows, top] = q_top
    got = _probs(rescale_top_label(top_label(z), np.full(len(z), p_new)))
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-15)
    assert (got.argmax(1) == top).all() or np.isclose(got.max(1), got[rows, top], rtol=1e-12).all()


def test_extreme_margins_keep_the_others_in_proportion():
    # p_1 rounds to 1 in float64 (margin 60), so 1 - p_1 cannot be formed: the log-space form still is exact
    z = torch.tensor([[60.0, 0.0, -1.0, -3.0]], dtype=torch.float64)
    cal = ConstantTop(0.9).fit(*overconfident(100, 4, seed=1))
    out = cal(z)
    probs = _probs(out)[0]
    assert probs[0] == pytest.approx(0.9, abs=1e-15)
    others = np.exp(np.array([0.0, -1.0, -3.0]))
    np.testing.assert_allclose(probs[1:], 0.1 * others / others.sum(), rtol=1e-12)
    # a map at 1 is capped so that every class keeps a finite log-probability
    out = ConstantTop(1.0).fit(*overconfident(100, 4, seed=1))(z)
    assert torch.isfinite(out).all() and _probs(out)[0, 0] == pytest.approx(CAP, abs=1e-15)


def test_attach_and_pipeline_scores_are_the_adaptor_of_the_isotonic_map():
    from PIL import Image
    from sklearn.isotonic import IsotonicRegression as SklearnIsotonic
    from transformers import ViTImageProcessor, pipeline

    z, y = overconfident(1000, 10, seed=4)
    iso = IsotonicRegression().fit(z, y, progress_bar=False)
    _, top, conf, _ = top_label_view(z)
    reference = SklearnIsotonic(y_min=0, y_max=1, out_of_bounds="clip").fit(conf, top == y)

    model = make_model("vit", num_channels=3, image_size=8).eval()
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    x, _ = digits(slice(0, 4))
    images = [Image.fromarray((255 * x[i, 0].numpy()).astype(np.uint8)).convert("RGB") for i in range(4)]
    clf = pipeline("image-classification", model=model, image_processor=processor, device="cpu")
    plain = clf(images, top_k=10)
    with torch.no_grad():
        logits = model(pixel_values=processor(images, return_tensors="pt")["pixel_values"]).logits.double().numpy()
    iso.attach(model)
    calibrated = clf(images, top_k=10)
    iso.detach()
    assert clf(images, top_k=10) == plain

    p, t, c, floor = top_label_view(logits)
    q_top = expected_top(reference.predict(c), floor)
    for i in range(4):
        got = {d["label"]: d["score"] for d in calibrated[i]}
        for k in range(10):
            want = q_top[i] if k == t[i] else p[i, k] * (1 - q_top[i]) / (1 - c[i])
            assert got[model.config.id2label[k]] == pytest.approx(want, abs=1e-6)
        assert calibrated[i][0]["label"] == plain[i][0]["label"]
