"""The one head-type rule (hf_calibration._core.tasks): configs, data shapes, explicit task=, and the refusals' wording."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_calibration._core.tasks import compatible_head, resolve_task, task_of_config


def _model(problem_type=None, num_labels=3):
    from transformers import ViTConfig

    return SimpleNamespace(config=ViTConfig(problem_type=problem_type, num_labels=num_labels))


@pytest.mark.parametrize(
    "problem_type, num_labels, expected",
    [
        ("multi_label_classification", 5, "multilabel"),
        ("multi_label_classification", 1, "binary"),
        ("single_label_classification", 3, "multiclass"),
        ("single_label_classification", 2, "multiclass"),
        (None, 2, "multiclass"),
        (None, 10, "multiclass"),
    ],
)
def test_task_from_problem_type(problem_type, num_labels, expected):
    assert resolve_task(model=_model(problem_type, num_labels)) == expected


def test_one_logit_without_problem_type_is_regression_and_refused():
    # transformers trains num_labels=1, problem_type=None with MSELoss: no probability to calibrate
    with pytest.raises(ValueError, match=r"problem_type=None.*regression.*multi_label_classification.*task='binary'"):
        resolve_task(model=_model(None, 1))
    with pytest.raises(ValueError, match="problem_type is 'regression'"):
        resolve_task(model=_model("regression", 1))
    # an explicit task wins over the config
    assert resolve_task("binary", model=_model(None, 1)) == "binary"


def test_task_from_data_shapes():
    z = np.zeros((4, 3))
    assert resolve_task(preds=z, target=np.array([[0, 1, 1]] * 4)) == "multilabel"
    assert resolve_task(preds=z, target=np.array([0, 2, 1, 0])) == "multiclass"
    assert resolve_task(preds=np.zeros(4), target=np.array([0, 1, 1, 0])) == "binary"
    assert resolve_task(preds=np.zeros((4, 1)), target=np.array([0, 1, 1, 0])) == "binary"
    assert resolve_task(preds=torch.zeros(4, 1), target=torch.tensor([[0], [1], [1], [0]])) == "binary"
    # the model's config beats the data's shapes, an explicit task beats both
    assert resolve_task(model=_model("multi_label_classification", 3), preds=z, target=np.ones((4, 3))) == "multilabel"
    assert resolve_task("binary", preds=np.zeros((4, 2)), target=np.array([0, 1, 1, 0])) == "binary"


def test_explicit_task_is_checked_against_the_data():
    with pytest.raises(ValueError, match=r"\(N, L\) 0/1 labels are multi-label.*task='multilabel'"):
        resolve_task("multiclass", preds=np.zeros((4, 3)), target=np.ones((4, 3)))
    with pytest.raises(ValueError, match="task='multiclass'"):
        resolve_task("multilabel", preds=np.zeros((4, 3)), target=np.zeros(4))
    with pytest.raises(ValueError, match="Expected argument `task`"):
        resolve_task("multi-label")


def test_config_without_labels_reads_nothing():
    assert task_of_config(None) is None
    assert (
        resolve_task(model=torch.nn.Linear(2, 2), preds=np.zeros((3, 2)), target=np.zeros(3, dtype=int)) == "multiclass"
    )


def test_compatible_head_refuses_the_other_kind_naming_problem_type():
    multi = _model("multi_label_classification", 3)
    with pytest.raises(
        ValueError,
        match=r"softmax \(multi-class\) head.*multi-label sigmoid one.*problem_type='multi_label_classification'",
    ):
        compatible_head("multiclass", multi)
    with pytest.raises(ValueError, match=r"problem_type='single_label_classification'"):
        compatible_head("multilabel", _model("single_label_classification", 3))
    with pytest.raises(ValueError, match="fitted on the model's 3 labels, but it was fitted on 4"):
        compatible_head("multilabel", multi, num_labels=4)
    with pytest.raises(ValueError, match="problem_type=None.*regression"):
        compatible_head("binary", _model(None, 1))
    compatible_head("multilabel", multi, num_labels=3)
    compatible_head("binary", _model("multi_label_classification", 1))
    compatible_head("binary", _model("single_label_classification", 2))  # two softmax logits: the binary map fits
    compatible_head("multiclass", _model(None, 5))
    compatible_head("multilabel", torch.nn.Linear(2, 2))  # no config: nothing to check


def test_multiclass_shape_error_names_the_problem():
    """The round-3 message was "Expected `target` to have shape (N,) (rank 1), but got rank 2": it must say what the
    (N, L) labels are and where to go."""
    from hf_calibration.losses import CrossEntropyLoss
    from hf_calibration.metrics import classwise_ece

    z, multi_hot = np.random.default_rng(0).normal(size=(8, 3)), np.ones((8, 3), dtype=int)
    with pytest.raises(ValueError, match=r"multi-label.*problem_type='multi_label_classification'.*task='multilabel'"):
        classwise_ece(z, multi_hot)
    with pytest.raises(ValueError, match=r"multi-label.*problem_type.*BinaryCrossEntropyLoss"):
        CrossEntropyLoss()(torch.from_numpy(z), torch.from_numpy(multi_hot).float())


# the pipeline task (modality) a config names (issue 54, item 1)


@pytest.mark.parametrize(
    "config, task",
    [
        ({"architectures": ["BertForSequenceClassification"], "model_type": "bert"}, "text-classification"),
        ({"architectures": ["Wav2Vec2ForSequenceClassification"]}, "audio-classification"),
        ({"architectures": ["VideoMAEForVideoClassification"]}, "video-classification"),
        ({"architectures": ["ViTForImageClassification"]}, "image-classification"),
        ({"architectures": ["TimmWrapperForImageClassification"]}, "image-classification"),
        ({"architectures": ["MyOwnForAudioClassification"]}, "audio-classification"),  # by the name's ending
        ({"architectures": ["MyOwnForSequenceClassification"]}, "text-classification"),
        ({"model_type": "timm_wrapper"}, "image-classification"),  # a timm config: no architectures
        ({"model_type": "wav2vec2"}, "audio-classification"),
        ({"architectures": ["ResNetModel"], "maccal_head": {"hidden": 8}}, "image-classification"),
        ({"architectures": ["Nothing"], "model_type": "nothing"}, None),
        (None, None),
    ],
)
def test_the_pipeline_task_of_a_config(config, task):
    from hf_calibration._core.tasks import pipeline_task_of_config

    assert pipeline_task_of_config(config)[0] == task


def test_transformers_configs_name_their_task():
    import transformers

    from hf_calibration._core.tasks import pipeline_task_of_config, resolve_pipeline_task

    config = transformers.BertConfig(architectures=["BertForSequenceClassification"])
    assert pipeline_task_of_config(config)[0] == "text-classification"
    assert resolve_pipeline_task(None, config) == "text-classification"
    with pytest.raises(ValueError, match=r"task='audio-classification' for a text-classification model"):
        resolve_pipeline_task("audio-classification", config)
    bare = transformers.PretrainedConfig()  # names no task: the override decides, the default is images
    assert resolve_pipeline_task("audio-classification", bare) == "audio-classification"
    assert resolve_pipeline_task(None, bare) == "image-classification"
    with pytest.raises(ValueError, match="Expected argument `task` to be one of"):
        resolve_pipeline_task("text-generation", config)
