"""``predict_logits`` for text and audio classifiers (issue 54, item 2): a tiny BERT (word-level tokenizer built here)
and a tiny wav2vec2, each trained a few steps with fixed seeds; the logits are checked against the model's own forward
on a batch tokenized / featurized here with transformers alone."""

from __future__ import annotations

import io
import wave

import datasets
import numpy as np
import pytest
import torch
from _models import tiny_bert, tiny_wav2vec2

from hf_calibration.io import predict_logits
from hf_calibration.io.modality import find_input_columns, prepare_dataset

torch.set_num_threads(1)
TEXTS = ["good movie", "the plot was awful awful and long", "a great film", "bad", "short film", "long bad plot"] * 3
LABELS = [0, 1, 2, 1, 0, 2] * 3


def _train(model, batches, steps: int = 5):
    """A few real optimiser steps (fixed seed): the logits come from trained, not initial, weights."""
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        loss = model(**batches[step % len(batches)]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def bert():
    model, tokenizer = tiny_bert(num_labels=3, seed=0)
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"), labels=torch.tensor(LABELS))
    return _train(model, [batch]), tokenizer


def _text_dataset(**columns):
    features = {name: datasets.Value("string") for name in columns}
    features["label"] = datasets.ClassLabel(names=["neg", "neu", "pos"])
    return datasets.Dataset.from_dict(
        {**columns, "label": LABELS[: len(next(iter(columns.values())))]}, features=datasets.Features(features)
    )


def _forward(model, features) -> np.ndarray:
    with torch.no_grad():
        return model(**features).logits.numpy()


def test_text_logits_are_the_models_forward_on_the_tokenized_batch(bert):
    model, tokenizer = bert
    data = _text_dataset(text=TEXTS)
    logits, labels = predict_logits(model, data, tokenizer, batch_size=len(TEXTS), num_workers=0, progress=False)
    want = _forward(model, tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt"))
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, LABELS)
    assert np.abs(want - want.mean(0)).max() > 0.1  # the rows differ: a broken batch would show


def test_batches_of_other_lengths_and_a_saved_folder_give_the_same_logits(bert, tmp_path):
    """Batches padded to other lengths (attention-masked) and the model and tokenizer read from a folder, no processor
    given: the model's config says text-classification, its folder holds the tokenizer."""
    model, tokenizer = bert
    model.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    data = _text_dataset(sentence=TEXTS)
    logits, _ = predict_logits(str(tmp_path / "bert"), data, batch_size=4, num_workers=0, progress=False, device="cpu")
    want = _forward(model, tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt"))
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("pair", [("premise", "hypothesis"), ("sentence1", "sentence2"), ("question", "sentence")])
def test_sentence_pairs_are_tokenized_as_pairs(bert, pair):
    model, tokenizer = bert
    first, second = TEXTS[:6], TEXTS[6:12][::-1]
    data = _text_dataset(**{pair[0]: first, pair[1]: second})
    logits, _ = predict_logits(model, data, tokenizer, num_workers=0, progress=False)
    want = _forward(model, tokenizer(first, second, padding=True, truncation=True, return_tensors="pt"))
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-6)
    single = _forward(model, tokenizer(first, padding=True, return_tensors="pt"))
    assert np.abs(single - want).max() > 1e-3  # the second sentence is read


def test_long_text_is_truncated_to_the_tokenizers_length(bert):
    model, tokenizer = bert
    texts = ["good " * 40, "bad film"]
    logits, _ = predict_logits(model, _text_dataset(text=texts), tokenizer, num_workers=0, progress=False)
    encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    assert encoded["input_ids"].shape[1] == tokenizer.model_max_length == 16
    np.testing.assert_allclose(logits, _forward(model, encoded), rtol=0, atol=1e-6)


def test_a_dataset_without_text_names_its_columns(bert):
    model, tokenizer = bert
    data = datasets.Dataset.from_dict({"x": [1.0, 2.0], "y": [3.0, 4.0], "label": [0, 1]})
    with pytest.raises(ValueError, match=r"text column .*columns are x \(Value\), y \(Value\), label \(Value\)"):
        predict_logits(model, data, tokenizer, num_workers=0, progress=False)
    with pytest.raises(ValueError, match="`input_column` to name a column of text"):
        predict_logits(model, data, tokenizer, input_column="x", progress=False)


def test_a_processor_of_another_kind_is_refused(bert):
    model, _ = bert
    _, extractor = tiny_wav2vec2(seed=0)
    with pytest.raises(ValueError, match="`processor` to be a tokenizer .*Wav2Vec2FeatureExtractor"):
        predict_logits(model, _text_dataset(text=TEXTS), extractor, progress=False)


# audio

RATE = 16000
LENGTHS = (4000, 2400, 3200, 1600, 4000, 2800)


@pytest.fixture(scope="module")
def wav2vec2():
    model, extractor = tiny_wav2vec2(num_labels=3, seed=0)
    rng = np.random.default_rng(0)
    waves = [rng.normal(size=n).astype(np.float32) for n in LENGTHS]
    batch = dict(
        extractor(waves, sampling_rate=RATE, padding=True, return_tensors="pt"), labels=torch.tensor(LABELS[:6])
    )
    return _train(model, [batch]), extractor, waves


def _audio_dataset(waves, rate: int = RATE):
    return datasets.Dataset.from_dict(
        {"audio": [{"array": w.tolist(), "sampling_rate": rate} for w in waves], "label": LABELS[: len(waves)]}
    )


def test_audio_logits_are_the_models_forward_on_the_extracted_features(wav2vec2):
    model, extractor, waves = wav2vec2
    logits, labels = predict_logits(
        model, _audio_dataset(waves), extractor, batch_size=len(waves), num_workers=0, progress=False
    )
    want = _forward(model, extractor(waves, sampling_rate=RATE, padding=True, return_tensors="pt"))
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, LABELS[:6])


def test_audio_at_another_rate_is_refused_with_the_cast_that_resamples_it(wav2vec2):
    model, extractor, waves = wav2vec2
    with pytest.raises(ValueError, match=r"sampling_rate=16000.*sampled at 8000.*cast_column\('audio', datasets.Audio"):
        predict_logits(model, _audio_dataset(waves, rate=8000), extractor, num_workers=0, progress=False)


def _wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def test_an_audio_feature_at_another_rate_is_cast_to_the_extractors(wav2vec2):
    """A ``datasets.Audio`` column recorded at 8 kHz is cast to the feature extractor's 16 kHz (datasets resamples as
    it decodes); the column is found without being named."""
    _, extractor, waves = wav2vec2
    data = datasets.Dataset.from_dict(
        {"clip": [{"bytes": _wav(w / 4, 8000), "path": None} for w in waves], "label": LABELS[:6]}
    ).cast_column("clip", datasets.Audio(sampling_rate=8000))
    columns = find_input_columns(data.features, "audio-classification")
    assert columns == ("clip",)
    prepared = prepare_dataset(data, "audio-classification", columns, extractor)
    assert prepared.features["clip"].sampling_rate == extractor.sampling_rate == RATE
    assert data.features["clip"].sampling_rate == 8000  # the caller's dataset is left as it is


def test_resampled_audio_logits(wav2vec2):
    """With datasets' decoder installed: the 8 kHz clip is decoded at 16 kHz, and the logits are the model's on it."""
    pytest.importorskip("torchcodec", reason="datasets decodes (and resamples) audio with torchcodec")
    try:
        from torchcodec.decoders import AudioDecoder  # noqa: F401  (loads its libraries: it needs the system's FFmpeg)
    except (ImportError, OSError, RuntimeError) as err:
        pytest.skip(f"torchcodec cannot decode audio here (FFmpeg on the system): {str(err).splitlines()[0]}")
    model, extractor, waves = wav2vec2
    data = datasets.Dataset.from_dict(
        {"audio": [{"bytes": _wav(w / 4, 8000), "path": None} for w in waves], "label": LABELS[:6]}
    ).cast_column("audio", datasets.Audio(sampling_rate=8000))
    logits, _ = predict_logits(model, data, extractor, batch_size=len(waves), num_workers=0, progress=False)
    decoded = data.cast_column("audio", datasets.Audio(sampling_rate=RATE))
    arrays = [row["audio"].get_all_samples().data.mean(0).numpy() for row in decoded]
    assert abs(len(arrays[0]) - 2 * len(waves[0])) <= 2
    want = _forward(model, extractor(arrays, sampling_rate=RATE, padding=True, return_tensors="pt"))
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-6)


def test_video_logits_are_the_models_forward_on_the_processed_frames():
    import transformers

    torch.manual_seed(0)
    config = transformers.VideoMAEConfig(
        image_size=32,
        patch_size=16,
        num_frames=4,
        tubelet_size=2,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    model = transformers.VideoMAEForVideoClassification(config).eval()
    processor = transformers.VideoMAEVideoProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    rng = np.random.default_rng(0)
    videos = [(rng.random((4, 40, 40, 3)) * 255).astype(np.uint8) for _ in range(5)]
    features = datasets.Features({"video": datasets.Array4D((4, 40, 40, 3), "uint8"), "label": datasets.Value("int64")})
    data = datasets.Dataset.from_dict({"video": videos, "label": [0, 1, 2, 0, 1]}, features=features)
    logits, labels = predict_logits(model, data, processor, num_workers=0, progress=False)
    want = _forward(model, {"pixel_values": processor(videos, return_tensors="pt")["pixel_values"]})
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, [0, 1, 2, 0, 1])


def test_a_model_without_a_config_takes_its_task_from_the_processors_kind(bert, wav2vec2):
    """A bare torch module names no task: the processor's kind does (a tokenizer: text, a feature extractor: audio);
    with neither, images, as before."""
    from hf_calibration.io.model_loading import pipeline_task_of

    bare = torch.nn.Linear(2, 2)
    assert pipeline_task_of(bare, processor=bert[1]) == "text-classification"
    assert pipeline_task_of(bare, processor=wav2vec2[1]) == "audio-classification"
    assert pipeline_task_of(bare) == "image-classification"
    assert pipeline_task_of(bert[0], processor=wav2vec2[1]) == "text-classification"  # the config wins; the
    # processor is then refused by name (test_a_processor_of_another_kind_is_refused)
