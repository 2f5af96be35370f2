"""Which dense-prediction pipeline task a model's config is for: object detection or semantic segmentation.

Kept apart from :mod:`hf_calibration.serving.detection` (which imports the detection machinery) so that loading a
classifier asks the question without importing it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DENSE_TASKS", "dense_task_of_config"]

# the pipeline task -> (Auto model class, transformers' table of the classes it loads, class-name ending)
DENSE_TASKS = {
    "object-detection": (
        "AutoModelForObjectDetection",
        "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
        "ForObjectDetection",
    ),
    "image-segmentation": (
        "AutoModelForSemanticSegmentation",
        "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        "ForSemanticSegmentation",
    ),
}


def dense_task_of_config(config: Any) -> str | None:
    """``"object-detection"`` / ``"image-segmentation"`` when a transformers config (or its ``config.json`` as a dict)
    is a detector's / semantic segmenter's (its ``architectures`` in transformers' Auto tables, or by the class name's
    ending), else None."""
    from transformers.models.auto import modeling_auto

    def field(key):
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    for name in field("architectures") or ():
        for task, (_, table, suffix) in DENSE_TASKS.items():
            if name in getattr(modeling_auto, table, {}).values() or str(name).endswith(suffix):
                return task
    return None
