"""The task is read from the model's config, not assumed (issue 54, item 1): a BERT and a wav2vec2 folder with a
calibrator saved beside them load with ``load_calibrated_model(folder)`` and ``hf_calibration.pipeline(model=folder)``
without ``task=``, serve softmax(calibrator(logits)) (computed here from the temperature and the plain model's
logits), refuse a task that contradicts the config, and carry a calibrator card for their own modality."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models import tiny_bert, tiny_wav2vec2

import hf_calibration
from hf_calibration import load_calibrated_model
from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.calibrators.attach import attached_calibrator

torch.set_num_threads(1)
K = 3
TEXTS = ["good movie", "the plot was awful awful and long", "a great film", "bad", "short film", "long bad plot"]


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _saved(folder, model, processor):
    """The model, its processor and a temperature fitted on shifted logits (T well above 1) in ``calibrator/``."""
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)
        model.classifier.bias.copy_(torch.tensor([-1.0, 0.0, 1.0]))
    model.eval().save_pretrained(folder)
    processor.save_pretrained(folder)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, K, (400,), generator=g)
    z = 4 * torch.randn(400, K, generator=g) + 2 * torch.nn.functional.one_hot(y, K)
    calibrator = TemperatureScaling().fit(z, y, progress_bar=False)
    calibrator.save_pretrained(folder / "calibrator")
    temperature = float(calibrator.log_temperature.detach().double().exp())
    assert temperature > 1.3
    return temperature


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    model, tokenizer = tiny_bert(num_labels=K, seed=0)
    folder = tmp_path_factory.mktemp("bert") / "model"
    temperature = _saved(folder, model, tokenizer)
    with torch.no_grad():
        plain = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.double().numpy()
    return folder, temperature, plain


def test_a_bert_folder_loads_calibrated_without_task(bert_folder):
    folder, temperature, plain = bert_folder
    model = load_calibrated_model(folder)
    assert type(model).__name__ == "BertForSequenceClassification" and attached_calibrator(model) is not None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        got = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.double().numpy()
    np.testing.assert_allclose(got, plain / temperature, rtol=0, atol=1e-6)


def test_the_pipeline_serves_the_calibrated_softmax_without_task(bert_folder):
    folder, temperature, plain = bert_folder
    classify = hf_calibration.pipeline(model=folder, top_k=None)
    assert classify.task == "text-classification"
    scores = np.zeros((len(TEXTS), K))
    for i, rows in enumerate(classify(TEXTS)):
        for row in rows:
            scores[i, int(row["label"].split("_")[-1])] = row["score"]
    want = _softmax(plain / temperature)
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-6)
    assert np.abs(_softmax(plain) - want).max() > 0.05  # the uncalibrated scores are far from these


def test_a_task_that_contradicts_the_config_is_a_clear_error(bert_folder, capsys):
    folder, *_ = bert_folder
    message = r"task='image-classification' for a text-classification model \(config.architectures=\['BertForSequenceClassification'\]"
    with pytest.raises(ValueError, match=message):
        load_calibrated_model(folder, task="image-classification")
    with pytest.raises(ValueError, match=message):
        hf_calibration.pipeline("image-classification", model=folder)
    assert type(load_calibrated_model(folder, task="text-classification")).__name__ == "BertForSequenceClassification"
    with pytest.raises(ValueError, match="Expected argument `task` to be one of"):
        load_calibrated_model(folder, task="token-classification")
    from hf_calibration.cli import main

    with pytest.raises(ValueError, match="Expected an image classifier.*`model` is a text-classification model"):
        hf_calibration.io.model_loading.load_image_classifier(folder)  # what the shift tools load: they perturb images
    argv = ["shift", "--model", str(folder), "--dataset", str(folder), "--severities", "1"]
    assert main(argv) == 1  # the CLI says the same, naming --model (not a task the user never gave)
    assert "--model is a text-classification model" in capsys.readouterr().err


def test_the_bert_calibrators_card_is_a_text_classifiers(bert_folder):
    folder, *_ = bert_folder
    card = (folder / "calibrator" / "README.md").read_text()
    head = card.split("---")[1]
    assert "- text-classification" in head and "image-classification" not in card
    assert "A post-hoc calibrator for a text classifier" in card
    assert "AutoModelForSequenceClassification.from_pretrained(" in card
    assert 'pipeline("text-classification", model=model, tokenizer=' in card
    assert "AutoModelForImageClassification" not in card and "image classifier" not in card


def test_a_wav2vec2_folder_loads_and_serves_audio_without_task(tmp_path):
    model, extractor = tiny_wav2vec2(num_labels=K, seed=0)
    folder = tmp_path / "w2v"
    temperature = _saved(folder, model, extractor)
    rng = np.random.default_rng(0)
    waves = [rng.normal(size=n).astype(np.float32) for n in (3200, 2400)]
    with torch.no_grad():
        plain = np.stack(
            [model(**extractor(w, sampling_rate=16000, return_tensors="pt")).logits.double().numpy()[0] for w in waves]
        )
    loaded = load_calibrated_model(folder)
    assert type(loaded).__name__ == "Wav2Vec2ForSequenceClassification"
    classify = hf_calibration.pipeline(model=folder, top_k=None)
    assert classify.task == "audio-classification"
    scores = np.zeros((len(waves), K))
    for i, w in enumerate(waves):
        for row in classify(w):
            scores[i, int(row["label"].split("_")[-1])] = row["score"]
    np.testing.assert_allclose(scores, _softmax(plain / temperature), rtol=0, atol=1e-6)
    card = (folder / "calibrator" / "README.md").read_text()
    assert "- audio-classification" in card and "AutoModelForAudioClassification.from_pretrained(" in card
    assert 'pipeline("audio-classification", model=model, feature_extractor=' in card
    assert "an audio classifier" in card


def test_a_card_says_the_task_it_is_given_and_stays_generic_without_one(tmp_path):
    z = torch.randn(50, K, generator=torch.Generator().manual_seed(1))
    calibrator = TemperatureScaling().fit(z, z.argmax(1), progress_bar=False)
    calibrator.save_pretrained(tmp_path / "video", model_card_kwargs={"pipeline_task": "video-classification"})
    card = (tmp_path / "video" / "README.md").read_text()
    assert "AutoModelForVideoClassification" in card and "- video-classification" in card
    calibrator.save_pretrained(tmp_path / "alone")
    card = (tmp_path / "alone" / "README.md").read_text()
    assert "-classification" not in card.split("---")[1] and "a classifier" in card
    assert "load_classifier(" in card  # the Auto class its config names, whatever the modality
    with pytest.raises(ValueError, match=r"model_card_kwargs\['pipeline_task'\]"):
        calibrator.save_pretrained(tmp_path / "bad", model_card_kwargs={"pipeline_task": "vision"})
    assert not (tmp_path / "bad").exists()
