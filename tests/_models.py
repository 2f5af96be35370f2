"""Shared test fixtures: tiny random-init image classifiers and scikit-learn's digits as a dataset.

Every model is built from a config (no hub access), sized for 8x8 images with 1 (or 3) channels, and
small enough that a Trainer step takes milliseconds on a CPU. Usage::

    from tests._models import make_model, digits_dataset, MODEL_NAMES
    model = make_model("vit", seed=0)            # vit | swin | resnet | timm
    train = digits_dataset(slice(0, 64))         # torch Dataset of {"pixel_values", "labels"}
"""

from __future__ import annotations

import functools

import numpy as np
import torch

NUM_LABELS = 10
MODEL_NAMES = ("vit", "swin", "resnet", "timm")

# dotted path of the final Linear (what `find_classifier_head` should resolve to) and how to compute its
# input by hand, independently of any hook: (model, pixel_values) -> features
HEAD_PATHS = {
    "vit": "classifier",
    "swin": "classifier",
    "resnet": "classifier.1",
    "timm": "timm_model.head",
}


def _seeded(fn):
    @functools.wraps(fn)
    def wrapper(*args, seed: int = 0, **kwargs):
        torch.manual_seed(seed)
        return fn(*args, **kwargs)

    return wrapper


@_seeded
def tiny_vit(num_labels: int = NUM_LABELS, num_channels: int = 1, image_size: int = 8, **overrides):
    from transformers import ViTConfig, ViTForImageClassification

    kw = dict(
        image_size=image_size,
        patch_size=2,
        num_channels=num_channels,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=num_labels,
    )
    kw.update(overrides)
    return ViTForImageClassification(ViTConfig(**kw))


@_seeded
def tiny_swin(num_labels: int = NUM_LABELS, num_channels: int = 1, image_size: int = 8, **overrides):
    from transformers import SwinConfig, SwinForImageClassification

    kw = dict(
        image_size=image_size,
        patch_size=2,
        num_channels=num_channels,
        embed_dim=8,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
        num_labels=num_labels,
    )
    kw.update(overrides)
    return SwinForImageClassification(SwinConfig(**kw))


@_seeded
def tiny_resnet(num_labels: int = NUM_LABELS, num_channels: int = 1, image_size: int = 8, **overrides):
    from transformers import ResNetConfig, ResNetForImageClassification

    kw = dict(
        num_channels=num_channels,
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
        num_labels=num_labels,
    )
    kw.update(overrides)
    return ResNetForImageClassification(ResNetConfig(**kw))


@_seeded
def tiny_timm(num_labels: int = NUM_LABELS, num_channels: int = 1, image_size: int = 8, **overrides):
    """timm's registered ``test_vit`` shrunk further, wrapped by transformers (no download: pretrained=False)."""
    from transformers import TimmWrapperConfig, TimmWrapperForImageClassification

    model_args = dict(img_size=image_size, patch_size=2, in_chans=num_channels, embed_dim=16, depth=1, num_heads=2)
    model_args.update(overrides)
    config = TimmWrapperConfig(architecture="test_vit", num_labels=num_labels, model_args=model_args)
    return TimmWrapperForImageClassification(config)


FACTORIES = {"vit": tiny_vit, "swin": tiny_swin, "resnet": tiny_resnet, "timm": tiny_timm}


def make_model(name: str, **kwargs):
    """A tiny random-init classifier by name (``vit``, ``swin``, ``resnet``, ``timm``); kwargs go to the factory."""
    return FACTORIES[name](**kwargs)


def head_input(name: str, model, pixel_values: torch.Tensor) -> torch.Tensor:
    """What the classifier sees, computed by hand from the backbone (no hook)."""
    with torch.no_grad():
        if name == "vit":
            # hidden_states[-1] is the encoder output *before* the final LayerNorm; the head sees the normed CLS token
            hidden = model.vit(pixel_values, output_hidden_states=True).hidden_states[-1]
            return model.vit.layernorm(hidden)[:, 0]
        if name == "swin":
            return model.swin(pixel_values).pooler_output
        if name == "resnet":
            return model.resnet(pixel_values).pooler_output.flatten(1)
        if name == "timm":
            timm_model = model.timm_model
            return timm_model.forward_head(timm_model.forward_features(pixel_values), pre_logits=True)
    raise KeyError(name)


# --------------------------------------------------------------------------------------- data


@functools.cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target.astype(np.int64)


def digits(
    index: slice | np.ndarray | None = None, *, num_channels: int = 1, image_size: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 digits as ``(pixel_values (N, C, S, S) float32 in [0, 1], labels (N,) int64)``."""
    images, labels = _digits()
    if index is not None:
        images, labels = images[index], labels[index]
    x = torch.from_numpy(np.ascontiguousarray(images))[:, None]
    if image_size != 8:
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    if num_channels != 1:
        x = x.expand(-1, num_channels, -1, -1).contiguous()
    return x, torch.from_numpy(np.ascontiguousarray(labels))


class DictDataset(torch.utils.data.Dataset):
    """Rows ``{"pixel_values": x[i], "labels": y[i]}`` — what the Trainer's default collator stacks."""

    def __init__(self, pixel_values: torch.Tensor, labels: torch.Tensor):
        if len(pixel_values) != len(labels):
            raise ValueError("pixel_values and labels differ in length")
        self.pixel_values, self.labels = pixel_values, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}


def digits_dataset(index: slice | np.ndarray | None = None, **kwargs) -> DictDataset:
    return DictDataset(*digits(index, **kwargs))


# text and audio classifiers: a tiny BERT with a word-level tokenizer built offline, and a tiny wav2vec2 with its
# feature extractor (16 kHz)
WORDS = "good bad movie plot the a was great awful film long short".split()


def tiny_tokenizer():
    """A ``PreTrainedTokenizerFast`` over a word-level vocabulary of :data:`WORDS` (no download)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", model_max_length=16
    )


@_seeded
def tiny_bert(num_labels: int = 3):
    """``(BertForSequenceClassification, tokenizer)`` from a tiny config, seeded."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=len(WORDS) + 4,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=num_labels,
    )
    return transformers.BertForSequenceClassification(config), tiny_tokenizer()


@_seeded
def tiny_wav2vec2(num_labels: int = 3):
    """``(Wav2Vec2ForSequenceClassification, Wav2Vec2FeatureExtractor)`` from a tiny config, seeded."""
    import transformers

    config = transformers.Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(5, 4),
        conv_kernel=(10, 4),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
        num_labels=num_labels,
    )
    extractor = transformers.Wav2Vec2FeatureExtractor(return_attention_mask=True)
    return transformers.Wav2Vec2ForSequenceClassification(config), extractor


@_seeded
def tiny_yolos(num_labels: int = 3, image_size: int = 32, detection_tokens: int = 12):
    """A one-layer YOLOS and its image processor (no padding: every image is ``image_size`` square)."""
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    config = YolosConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        image_size=[image_size, image_size],
        patch_size=8,
        num_detection_tokens=detection_tokens,
        num_labels=num_labels,
        use_mid_position_embeddings=False,
    )
    size = {"height": image_size, "width": image_size}
    return YolosForObjectDetection(config).eval(), YolosImageProcessor(size=size, do_pad=False)


@_seeded
def tiny_detr(num_labels: int = 3, image_size: int = 32, queries: int = 10):
    """A one-layer DETR on a two-stage ResNet built from its config (no timm, nothing downloaded)."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", out_features=["stage2"]
    )
    config = DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        num_queries=queries,
        num_labels=num_labels,
    )
    size = {"height": image_size, "width": image_size}
    return DetrForObjectDetection(config).eval(), DetrImageProcessor(size=size, do_pad=False)


@_seeded
def tiny_segformer(num_labels: int = 4, image_size: int = 32):
    """A one-block SegFormer (logits at half the input size) and its image processor."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor

    config = SegformerConfig(
        num_encoder_blocks=1,
        depths=[1],
        sr_ratios=[1],
        hidden_sizes=[8],
        num_attention_heads=[1],
        patch_sizes=[3],
        strides=[2],
        mlp_ratios=[1],
        decoder_hidden_size=8,
        num_labels=num_labels,
    )
    size = {"height": image_size, "width": image_size}
    return SegformerForSemanticSegmentation(config).eval(), SegformerImageProcessor(size=size, do_reduce_labels=False)


def tiny_mask2former(num_labels: int = 4, image_size: int = 32):
    """A one-layer Mask2Former (a one-block-per-stage Swin backbone, 8 queries) and its image processor."""
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessor,
        SwinConfig,
    )

    backbone = SwinConfig(
        image_size=image_size,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 1, 1],
        window_size=4,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        backbone_config=backbone,
        backbone=None,
        use_pretrained_backbone=False,
        num_labels=num_labels,
        num_queries=8,
        hidden_dim=32,
        mask_feature_size=32,
        feature_size=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_feedforward_dim=64,
        dim_feedforward=64,
        num_attention_heads=2,
    )
    size = {"height": image_size, "width": image_size}
    return Mask2FormerForUniversalSegmentation(config).eval(), Mask2FormerImageProcessor(size=size, do_pad=False)
