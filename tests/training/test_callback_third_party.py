"""``CalibrationCallback`` in a third-party ``Trainer`` subclass from the registries: TRL's ``RewardTrainer`` (TRL's one
trainer with a classification head, a ``...ForSequenceClassification`` with ``num_labels=1``). A reward model scores
one sequence with one logit and is trained on (chosen, rejected) pairs, with no class labels: there are no class scores
to calibrate, and the callback says so when the trainer is built, not after training (before, it trained, then failed
with a message about temperature scaling and a binary head)."""

from __future__ import annotations

import pytest
import torch

from hf_calibration import CalibrationCallback

trl = pytest.importorskip("trl")


def test_trl_reward_trainer_is_refused_when_built_with_a_clear_message(tmp_path):
    from datasets import Dataset
    from transformers import BertConfig, BertForSequenceClassification

    from hf_calibration.demo import tiny_text_classifier

    _, tokenizer = tiny_text_classifier(steps=0)
    tokenizer.eos_token = "[SEP]"
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=1,  # what RewardTrainer requires: one reward logit per sequence
    )
    pairs = Dataset.from_list([{"chosen": "good great film", "rejected": "bad awful film"}] * 8)
    args = trl.RewardConfig(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    with pytest.raises(ValueError, match=r"RewardTrainer's model gives none.*num_labels=1.*regression"):
        trl.RewardTrainer(
            model=BertForSequenceClassification(config),
            args=args,
            train_dataset=pairs,
            eval_dataset=pairs,
            processing_class=tokenizer,
            callbacks=[CalibrationCallback()],
        )
