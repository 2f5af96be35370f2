"""attach(pipeline): every image-classification result carries its prediction set; detach restores the pipeline."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from _conformal_data import synthetic
from _models import digits, make_model

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.conformal import ConformalPredictor


def _pipeline(name="vit", pixels=False, **kwargs):
    from PIL import Image
    from transformers import ViTImageProcessor, pipeline

    model = make_model(name, num_channels=3, image_size=8).eval()
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    x, _ = digits(slice(0, 6))
    images = [Image.fromarray((255 * x[i, 0].numpy()).astype(np.uint8)).convert("RGB") for i in range(6)]
    pipe = pipeline("image-classification", model=model, image_processor=processor, device="cpu", **kwargs)
    pixel_values = processor(images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():  # the model's own logits on the processed images, computed without the pipeline
        logits = model(pixel_values=pixel_values).logits
    return (pipe, images, logits, pixel_values) if pixels else (pipe, images, logits)


def _fit_data():
    """Logits as flat as the random tiny models' and labels at random: the sets hold most classes."""
    rng = np.random.default_rng(2)
    return rng.normal(scale=0.05, size=(1000, 10)).astype(np.float32), rng.integers(0, 10, 1000)


def _predictor(method="raps", **kwargs):
    return ConformalPredictor(method, allow_empty=True, **kwargs).fit(*_fit_data(), alpha=0.4)


@pytest.mark.parametrize("name", ["vit", "resnet"])
def test_results_carry_the_prediction_set(name):
    pipe, images, logits, pixel_values = _pipeline(name, pixels=True)
    plain = pipe(images, top_k=3)
    predictor = _predictor()
    assert predictor.attach(pipe) is pipe
    results = pipe(images, top_k=3)
    expected = predictor.predict_sets(logits, draws_from=pixel_values)  # each image's draw comes from its pixels
    labels = pipe.model.config.id2label
    for i, rows in enumerate(results):
        got = {r["label"] for r in rows if r["in_set"]}
        assert got == {labels[k] for k in np.flatnonzero(expected[i].numpy())}
        assert [r["label"] for r in rows[:3]] == [r["label"] for r in plain[i]]  # the top 3 rows as before
        assert all(r["in_set"] for r in rows[3:])  # more rows only for set members beyond top_k
        assert [r["score"] for r in rows[:3]] == [r["score"] for r in plain[i]]
    assert any(len(rows) > 3 for rows in results)  # some set is larger than top_k
    assert predictor.detach() is pipe
    assert pipe(images, top_k=3) == plain


def test_batched_pipeline_and_one_image():
    pipe, images, logits = _pipeline(batch_size=4)
    predictor = _predictor("thr")
    predictor.attach(pipe)
    expected = predictor.predict_sets(logits)  # THR is not randomised
    results = pipe(images)
    single = pipe(images[0])
    for i, rows in enumerate(results):
        assert {r["label"] for r in rows if r["in_set"]} == {
            pipe.model.config.id2label[k] for k in np.flatnonzero(expected[i].numpy())
        }
    assert single == results[0]
    predictor.detach()


def test_sets_come_from_the_models_own_logits_when_a_calibrator_is_attached(caplog):
    pipe, images, logits = _pipeline()
    z, y = _fit_data()
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    predictor = _predictor("thr")
    ts.attach(pipe.model)
    with caplog.at_level(logging.WARNING, logger="hf_calibration"):
        predictor.attach(pipe)
    assert "not the one the prediction sets were fitted behind" in caplog.text  # sets and printed scores differ
    results = pipe(images, top_k=10)
    expected = predictor.predict_sets(logits)
    calibrated = torch.softmax(ts(logits), 1)
    for i, rows in enumerate(results):
        assert {r["label"] for r in rows if r["in_set"]} == {
            pipe.model.config.id2label[k] for k in np.flatnonzero(expected[i].numpy())
        }
        for r in rows:  # the printed scores are the calibrated ones
            k = int(pipe.model.config.label2id[r["label"]])
            assert r["score"] == pytest.approx(calibrated[i, k].item(), abs=1e-5)
    predictor.detach()
    ts.detach()


def test_attach_refusals():
    pipe, _, _ = _pipeline()
    with pytest.raises(TypeError, match="classification transformers pipeline"):
        _predictor().attach(pipe.model)
    z, y = synthetic(500, 4, seed=1)
    with pytest.raises(ValueError, match="4 classes"):
        ConformalPredictor("thr").fit(z, y).attach(pipe)
    with pytest.raises(Exception, match="not fitted"):
        ConformalPredictor("thr").attach(pipe)
    predictor = _predictor()
    predictor.attach(pipe)
    with pytest.raises(RuntimeError, match="already attached"):
        predictor.attach(pipe)
    with pytest.raises(ValueError, match="one is; detach it first"):
        _predictor().attach(pipe)
    predictor.detach()
    with pytest.raises(RuntimeError, match="not attached"):
        predictor.detach()


def _draws_by_hand(pixel_values: torch.Tensor, seed: int) -> np.ndarray:
    """Each image's draw: the first 53 bits of the keyed BLAKE2b hash of its float32 pixel bytes (hashlib directly)."""
    import hashlib

    key = seed.to_bytes(8, "little")
    return np.array(
        [
            (int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=8, key=key).digest(), "little") >> 11)
            / 2**53
            for row in pixel_values
        ]
    )


@pytest.mark.parametrize("method", ["aps", "raps"])
def test_one_image_gets_one_set_alone_in_a_batch_and_call_after_call(method):
    """Issue 29 item 6: randomised sets drawn from the predictor's stream gave 3-6 of 20 images another set on the
    next call; by default the draw is derived from the image, so the same image gets the same set every time."""
    from hf_calibration.conformal.scores import conformity_scores, sets_from_scores

    pipe, images, logits, pixel_values = _pipeline(pixels=True)
    batched, _, _ = _pipeline(batch_size=4)
    predictor = _predictor(method, seed=5)
    predictor.attach(pipe)
    other = _predictor(method, seed=5)
    other.attach(batched)

    def sets(results):
        return [{r["label"] for r in rows if r["in_set"]} for rows in results]

    first, second = sets(pipe(images, top_k=1)), sets(pipe(images, top_k=1))
    alone = [sets([pipe(image, top_k=1)])[0] for image in images]
    assert first == second == alone == sets(batched(images, top_k=1))
    # the sets are those of the randomised score with the hand-hashed draws (an independent computation)
    u = torch.from_numpy(_draws_by_hand(pixel_values, seed=5))
    params = predictor._params()
    expected = sets_from_scores(
        conformity_scores(torch.softmax(logits.double(), 1), method, u, **params),
        float(predictor.q_hat),
        allow_empty=True,
    )
    labels = pipe.model.config.id2label
    assert first == [{labels[k] for k in np.flatnonzero(row.numpy())} for row in expected]
    predictor.detach()
    other.detach()


def test_stream_draws_stay_available_on_request():
    pipe, images, logits = _pipeline()
    predictor = _predictor("aps", seed=5)
    predictor.attach(pipe, draws="stream")
    results = pipe(images, top_k=1)
    predictor.fit(*_fit_data(), alpha=0.4)  # restarts the stream: the same draws as the pipeline's first call
    expected = predictor.predict_sets(logits)
    labels = pipe.model.config.id2label
    assert [{r["label"] for r in rows if r["in_set"]} for rows in results] == [
        {labels[k] for k in np.flatnonzero(row.numpy())} for row in expected
    ]
    predictor.detach()
    with pytest.raises(ValueError, match="`draws`"):
        predictor.attach(pipe, draws="hash")


def test_no_calibrator_notice_for_an_identity_calibrator(caplog):
    """Issue 29 item 14: a calibrator that leaves the model as it is (T = 1, chosen when nothing helped) changes no
    score, so attaching the predictor says nothing about it."""
    from hf_calibration.calibrators.selection.auto import identity_calibrator

    pipe, _, _ = _pipeline()
    z, y = _fit_data()
    with pytest.warns(UserWarning, match="left as it is"):
        identity = identity_calibrator(z, y, None, "left as it is", who="test")
    assert identity.is_identity and identity.fitted_temperature == 1.0
    identity.attach(pipe.model)
    with caplog.at_level(logging.WARNING, logger="hf_calibration"):
        _predictor("thr").attach(pipe)
    assert "calibrator is attached" not in caplog.text
    identity.detach()


def test_no_warning_when_the_sets_were_fitted_behind_the_attached_calibrator(caplog):
    pipe, images, logits = _pipeline()
    z, y = _fit_data()
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    predictor = ConformalPredictor("thr").fit(z, y, calibrator=ts)
    ts.attach(pipe.model)
    with caplog.at_level(logging.WARNING, logger="hf_calibration"):
        predictor.attach(pipe)
    assert "fitted behind" not in caplog.text
    calibrated = torch.softmax(ts(logits).double(), 1).numpy()
    for i, rows in enumerate(pipe(images, top_k=10)):  # a class is in the set iff its printed score passes 1 - q_hat
        for r in rows:
            k = int(pipe.model.config.label2id[r["label"]])
            assert r["in_set"] == bool(calibrated[i, k] >= 1 - float(predictor.q_hat)) or calibrated[i].argmax() == k
    predictor.detach()
    ts.detach()
