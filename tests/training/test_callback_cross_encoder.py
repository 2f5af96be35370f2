"""``CalibrationCallback`` in sentence-transformers' ``CrossEncoderTrainer`` (a ``transformers.Trainer`` subclass
through ``BaseTrainer``): a ``CrossEncoder`` wrapping a tiny three-class ``BertForSequenceClassification`` (an NLI-like
head) built from a config, trained a few steps on sentence pairs. Its collator hands the loss raw text and
``trainer.predict`` returns no logits, so the callback computes them as the trainer's losses do; the test recomputes them
from the pairs with the tokenizer and the inner BERT, and fits the temperature itself (scipy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax

from hf_calibration import CalibrationCallback, load_calibrated_model, load_calibrator
from hf_calibration.demo import tiny_text_classifier

# words of the demo tokenizer's vocabulary
POSITIVE, NEGATIVE, NEUTRAL = ("good", "great", "fine"), ("bad", "awful", "dull"), ("the", "film", "plot", "was")

cross_encoder = pytest.importorskip("sentence_transformers.cross_encoder")


def _pairs(n: int, seed: int):
    """(premise, hypothesis, label): the hypothesis agrees (0), disagrees (1) or is neutral (2), read off its word; a
    fifth of the labels drawn at random."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    rows = {"premise": [], "hypothesis": [], "label": []}
    for _ in range(n):
        label = int(rng.integers(0, 3))
        word = rng.choice((POSITIVE, NEGATIVE, NEUTRAL)[label])
        rows["premise"].append(f"{rng.choice(NEUTRAL)} {rng.choice(POSITIVE)}")
        rows["hypothesis"].append(f"{word} {rng.choice(NEUTRAL)}")
        rows["label"].append(label if rng.random() > 0.2 else int(rng.integers(0, 3)))
    return Dataset.from_dict(rows)


def _temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The NLL-minimising temperature (Guo et al. 2017, eq. 9 with one parameter), by scipy over log T."""
    nll = lambda t: -log_softmax(logits / np.exp(t), axis=1)[np.arange(len(labels)), labels].mean()  # noqa: E731
    return float(np.exp(minimize_scalar(nll, bounds=(-3, 3), method="bounded", options={"xatol": 1e-8}).x))


def test_cross_encoder_trainer_fits_and_saves_the_calibration_of_its_inner_classifier(tmp_path):
    import transformers

    _, tokenizer = tiny_text_classifier(steps=0)  # a word-level tokenizer with a [CLS] a [SEP] b [SEP] pair template
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
    )
    base = tmp_path / "base"
    transformers.BertForSequenceClassification(config).save_pretrained(base)
    tokenizer.save_pretrained(base)
    model = cross_encoder.CrossEncoder(str(base), local_files_only=True, device="cpu")

    train, val = _pairs(16, 0), _pairs(120, 1)  # 16 rows, 40 steps: over-confident, as a fine-tuned model is
    out = tmp_path / "out"
    args = cross_encoder.CrossEncoderTrainingArguments(
        str(out), max_steps=40, per_device_train_batch_size=16, learning_rate=3e-2, seed=0,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callback = CalibrationCallback(conformal="thr", alpha=0.2)
    trainer = cross_encoder.CrossEncoderTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=val, callbacks=[callback]
    )
    assert trainer.predict(val).predictions is None  # why the callback cannot use trainer.predict here
    trainer.train()
    trainer.save_model()

    # the eval logits, computed here from the pairs with the tokenizer and the CrossEncoder's inner BERT
    inputs = tokenizer(list(val["premise"]), list(val["hypothesis"]), padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model.model.eval()(**inputs).logits.double().numpy()
    labels = np.asarray(val["label"])
    nll = -log_softmax(logits, axis=1)[np.arange(len(labels)), labels].mean()
    assert callback.eval_calibration.num_samples == len(val)
    assert callback.eval_calibration.before["nll"].value == pytest.approx(nll, rel=1e-5)

    assert callback.eval_calibration.reason is None  # the temperature was kept, not the identity
    saved = load_calibrator(out / "calibrator")
    temperature = _temperature(logits, labels)
    assert saved.fitted_temperature == pytest.approx(temperature, rel=1e-3)
    reference = softmax(logits / temperature, axis=1)
    calibrated = saved(torch.as_tensor(logits)).softmax(-1).numpy()
    np.testing.assert_allclose(calibrated, reference, atol=1e-4)

    # the CrossEncoder's folder holds the BERT's config.json: it reloads as a calibrated classifier, sets beside it
    assert (out / "conformal").is_dir()
    served = load_calibrated_model(out)
    with torch.no_grad():
        probabilities = served(**inputs).logits.softmax(-1).double().numpy()
    np.testing.assert_allclose(probabilities, calibrated, atol=1e-6)
    predictor = served.conformal_predictor
    sets = np.asarray(predictor.predict_sets(logits.astype(np.float32)), dtype=bool)
    passes = calibrated >= 1 - float(predictor.q_hat)  # THR (Sadinle et al. 2019): the classes scored 1 - q_hat or more
    if not predictor.allow_empty:  # an empty set gets the top class
        passes[~passes.any(1), calibrated[~passes.any(1)].argmax(1)] = True
    near = np.abs(calibrated - (1 - float(predictor.q_hat))) < 1e-6  # float32 rounding at the threshold
    np.testing.assert_array_equal(sets[~near], passes[~near])


def test_an_embedding_models_trainer_is_refused_when_built(tmp_path):
    import transformers
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    _, tokenizer = tiny_text_classifier(steps=0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    model = SentenceTransformer(str(tmp_path / "base"), local_files_only=True, device="cpu")
    pairs = Dataset.from_dict({"anchor": ["good film"] * 8, "positive": ["great plot"] * 8, "label": [0, 1] * 4})
    with pytest.raises(
        ValueError, match=r"SentenceTransformerTrainer's model \(SentenceTransformer\) holds no sequence"
    ):
        SentenceTransformerTrainer(
            model=model,
            args=SentenceTransformerTrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True),
            train_dataset=pairs,
            eval_dataset=pairs,
            loss=losses.SoftmaxLoss(model, model.get_embedding_dimension(), num_labels=2),
            callbacks=[CalibrationCallback()],
        )
