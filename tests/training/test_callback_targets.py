"""The issue's target, per modality: a tiny BERT, wav2vec2 and ViT (built from configs, with their tokenizer, feature
extractor and image processor), each trained briefly with a plain ``Trainer`` + ``CalibrationCallback(conformal="thr")``,
reload with ``load_calibrated_model(folder)`` and ``hf_calibration.pipeline(model=folder)`` without ``task=``. Checked:
the served scores equal ``softmax(calibrator(z))`` (1e-6), ``z`` the trained model's logits computed here; a class is in
a served set iff its calibrated score is at least ``1 - q_hat`` (THR; an empty set gets the top class); the calibrator's
and the sets' cards name the model's task, Auto class and tags."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import Trainer, TrainingArguments

import hf_calibration
from hf_calibration import CalibrationCallback, load_calibrated_model
from hf_calibration.calibrators import load_calibrator
from hf_calibration.conformal import ConformalPredictor

torch.set_num_threads(1)
RATE = 16000


class Rows(torch.utils.data.Dataset):
    """Preprocessed tensors as rows with ``labels`` (what the Trainer's default collator stacks)."""

    def __init__(self, features: dict, labels):
        self.features = {k: torch.as_tensor(np.asarray(v)) for k, v in features.items()}
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {**{k: v[i] for k, v in self.features.items()}, "labels": self.labels[i]}


def _text():
    from hf_calibration.demo import text_dataset, tiny_text_classifier

    model, tokenizer = tiny_text_classifier(steps=0)  # the untrained model of the demo's config, and its tokenizer
    data = text_dataset(0, size=200, train_size=80)  # a small fine-tuning set: over-confident after it

    def rows(split):
        encoded = tokenizer(split["text"], padding="max_length", max_length=12, return_tensors="np")
        return Rows(dict(encoded), split["label"])

    raw = data["test"]["text"][:12]
    return (
        model,
        tokenizer,
        rows(data["train"][:]),
        rows(data["validation"][:]),
        raw,
        lambda x: tokenizer(x, padding=True, return_tensors="np"),
    )


def _audio():
    from hf_calibration.demo import audio_dataset, tiny_audio_classifier

    model, extractor = tiny_audio_classifier(steps=0)
    data = audio_dataset(0, size=150, train_size=40)  # a small fine-tuning set: over-confident after it

    def waves(split):
        return [np.asarray(a["array"][:2000], dtype=np.float32) for a in split["audio"]]  # 1/8 s: cheaper steps

    def rows(split):
        return Rows(dict(extractor(waves(split), sampling_rate=RATE, return_tensors="np")), split["label"])

    raw = waves(data["test"][:12])
    return (
        model,
        extractor,
        rows(data["train"][:]),
        rows(data["validation"][:]),
        raw,
        lambda x: extractor(x, sampling_rate=RATE, return_tensors="np"),
    )


def _image():
    from hf_calibration.demo import PixelDataset, digits_image_processor, digits_splits, tiny_vit

    processor = digits_image_processor()
    splits = digits_splits(0, calibration_size=300, test_size=100, train_size=100)  # fitted closely: over-confident
    model = tiny_vit(hidden_size=32, num_layers=1, num_heads=2)
    train = PixelDataset(splits.train_images, splits.train_labels, processor)
    val = PixelDataset(splits.calibration_images, splits.calibration_labels, processor)
    return model, processor, train, val, splits.test_images[:12], lambda x: processor(images=x, return_tensors="np")


MODALITIES = {
    "text-classification": (_text, "BertForSequenceClassification", "AutoModelForSequenceClassification", 150),
    "audio-classification": (_audio, "Wav2Vec2ForSequenceClassification", "AutoModelForAudioClassification", 60),
    "image-classification": (_image, "ViTForImageClassification", "AutoModelForImageClassification", 200),
}


@pytest.fixture(scope="module", params=list(MODALITIES))
def trained(request, tmp_path_factory):
    task = request.param
    make, *_, steps = MODALITIES[task]
    model, processor, train, val, raw, preprocess = make()
    out = tmp_path_factory.mktemp(task) / "out"
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=32,
        per_device_eval_batch_size=100,
        max_steps=steps,
        learning_rate=3e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    callback = CalibrationCallback(conformal="thr", alpha=0.1)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=val,
        processing_class=processor,
        callbacks=[callback],
    )
    trainer.train()
    trainer.save_model()  # the model and its processor beside calibrator/ and conformal/
    return task, trainer.model.eval(), out, raw, preprocess


def test_reloads_without_task_and_serves_softmax_of_the_calibrator(trained):
    task, model, out, raw, preprocess = trained
    served = load_calibrated_model(out)  # no task=: read from the saved config
    assert type(served).__name__ == MODALITIES[task][1]
    calibrator = load_calibrator(out / "calibrator")
    inputs = {k: torch.as_tensor(np.asarray(v)) for k, v in preprocess(raw).items()}
    with torch.no_grad():
        z = model(**inputs).logits  # the trained model, no calibrator attached
        expected = torch.softmax(calibrator(z.double()), dim=1).numpy()
        scores = torch.softmax(served(**inputs).logits.double(), dim=1).numpy()
    assert not calibrator.is_identity and not np.allclose(expected, torch.softmax(z.double(), 1).numpy(), atol=1e-3)
    np.testing.assert_allclose(scores, expected, atol=1e-6, rtol=0)


def test_pipeline_sets_hold_a_class_only_if_its_calibrated_score_passes_the_threshold(trained):
    task, model, out, raw, preprocess = trained
    pipe = hf_calibration.pipeline(model=out)  # no task=
    assert pipe.task == task
    predictor = ConformalPredictor.from_pretrained(out / "conformal")
    calibrator = load_calibrator(out / "calibrator")
    assert predictor.method == "thr"
    assert predictor.fit_info_["calibrator_fingerprint"] == calibrator.fingerprint()
    threshold = 1 - float(predictor.q_hat)
    labels = model.config.id2label
    rows = pipe(list(raw), top_k=len(labels))  # every class's score
    assert len(rows) == len(raw)
    for i, result in enumerate(rows):
        inputs = {k: torch.as_tensor(np.asarray(v)) for k, v in preprocess(raw[i : i + 1]).items()}
        with torch.no_grad():
            p = torch.softmax(calibrator(model(**inputs).logits.double()), dim=1)[0].numpy()
        scores = {r["label"]: r["score"] for r in result}
        for k, name in labels.items():
            assert scores[name] == pytest.approx(p[k], abs=1e-6)
        in_set = {r["label"] for r in result if r["in_set"]}
        passing = {labels[k] for k in range(len(p)) if p[k] >= threshold}
        assert in_set == (passing or {labels[int(p.argmax())]}), (i, p, threshold)


def test_cards_name_the_task_auto_class_and_tags(trained):
    task, _, out, *_ = trained
    auto_class = MODALITIES[task][2]
    for sub in ("calibrator", "conformal"):
        card = ModelCard.load(out / sub / "README.md")
        assert task in card.data.tags, sub
        assert {t for t in card.data.tags if t.endswith("-classification")} == {task}, sub
        assert f'pipeline("{task}"' in card.text or f"{auto_class}" in card.text, sub
        assert "image-classification" not in card.text or task == "image-classification", sub
    # the sets card's snippet, pointed at this folder, runs as a reader runs it
    card = ConformalPredictor.from_pretrained(out / "conformal").generate_model_card(
        model_repo=str(out), pipeline_task=task
    )
    namespace = {}
    exec(re.findall(r"```python\n(.*?)```", card.text, re.S)[0], namespace)
    assert namespace["prediction_set"] and set(namespace["prediction_set"]) <= {r["label"] for r in namespace["rows"]}
    # and the calibrator card's: the Auto class, the calibrator attached, the task's pipeline with its preprocessor
    card = load_calibrator(out / "calibrator").generate_model_card(
        pipeline_task=task, model_repo=str(out), calibrator_args=f'"{out}", subfolder="calibrator"'
    )
    namespace = {}
    exec(re.findall(r"```python\n(.*?)```", card.text, re.S)[0], namespace)
    assert type(namespace["model"]).__name__ == MODALITIES[task][1] and namespace["classifier"].task == task
