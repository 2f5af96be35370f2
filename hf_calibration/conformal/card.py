"""The model card of a saved ``ConformalPredictor``: what its sets guarantee, how it was fitted, how to load it.

The card names the model's modality: its pipeline task (given as ``model_card_kwargs={"pipeline_task": ...}``, else
read from the ``config.json`` of the model saved in the parent folder), which sets the title, the tags and an input
the usage snippet runs on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_calibration._core.tasks import check_pipeline_task, pipeline_task_of_folder

CONFORMAL_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

Conformal prediction sets for {{ model_kind }}, saved with the `hf_calibration` library
(`pip install hf-calibration`). {{ method_description }}

{% if citation %}Method: {{ citation }}.
{% endif %}
## Guarantee

{{ guarantee }}

## Fit

| | |
|---|---|
| method | `{{ method }}` ({{ randomization }}) |
| alpha | {{ alpha }} (target coverage {{ target }}) |
| calibration samples | {{ num_samples }} ({{ num_classes }} classes){% if num_tune %}, after {{ num_tune }} held out to {{ tuned }}{% endif %} |
| threshold | {{ q_hat }} (the {{ quantile_rank }} smallest of the {{ num_samples }} calibration scores) |
| coverage on the calibration data | {{ coverage }} |
| mean set size on the calibration data | {{ mean_set_size }} |
{% if raps %}| RAPS k_reg, lambda | {{ k_reg }}, {{ penalty }}{% if tuned_raps %} (chosen on the tuning split){% endif %} |
{% endif %}| calibrator applied first | {{ calibrator }} |
| checkpoint format | {{ format_version }} |

The coverage on the calibration data is about ceil((n+1)(1-alpha))/n by construction: it checks the arithmetic, not
the guarantee. Measure coverage and set size on held-out data for a fair picture.

## Usage

Saved in the model repo's `conformal/` folder (beside `calibrator/`), one call serves the calibrated scores and the sets
(the task read from the model's config):

```python
{{ example_imports }}import hf_calibration

classifier = hf_calibration.pipeline(model="{{ model_repo | default("<model repo>", true) }}")
{{ example }}
rows = classifier(example, top_k=None)  # each row has "in_set"; every class of the set is listed
prediction_set = [row["label"] for row in rows if row["in_set"]]
```

The predictor alone, on a transformers pipeline or on the model's logits:

```python
{% if pipeline_task %}from transformers import pipeline
{% endif %}from hf_calibration.conformal import ConformalPredictor

{% if model_repo %}predictor = ConformalPredictor.from_pretrained("{{ model_repo }}", subfolder="{{ subfolder | default("conformal", true) }}")
{% else %}predictor = ConformalPredictor.from_pretrained("<this repo>")  # or ("<model repo>", subfolder="conformal")
{% endif %}{% if pipeline_task %}classifier = predictor.attach(pipeline("{{ pipeline_task }}", model="{{ model_repo | default("<model repo>", true) }}"))
{% endif %}sets = predictor.predict_sets(logits)  # (N, K) boolean mask from the model's logits
```
"""

# per pipeline task: (one input, the classifier, the snippet's imports, an input it runs on, given `classifier`)
_MODALITIES = {
    "image-classification": (
        "image",
        "an image classifier",
        "from PIL import Image\n",
        'example = Image.new("RGB", (224, 224))  # or Image.open("photo.jpg")',
    ),
    "text-classification": ("text", "a text classifier", "", 'example = "a fine film, if a long one"'),
    "audio-classification": (
        "audio clip",
        "an audio classifier",
        "import numpy as np\n",
        "rate = classifier.feature_extractor.sampling_rate\n"
        'example = {"raw": np.zeros(rate, dtype=np.float32), "sampling_rate": rate}  # or "clip.wav"',
    ),
    "video-classification": ("video", "a video classifier", "", 'example = "clip.mp4"  # a video file'),
}
_ANY = ("input", "a classifier", "", "example = ...  # an input of the model's pipeline task")


def modality_values(task: str | None) -> dict[str, Any]:
    """The card's words for the model's pipeline task (None: unknown): ``noun``, ``model_kind``, the snippet's
    ``example_imports`` and ``example``."""
    noun, kind, imports, example = _MODALITIES.get(task, _ANY)
    return {"pipeline_task": task, "noun": noun, "model_kind": kind, "example_imports": imports, "example": example}


def with_pipeline_task(card_kwargs: dict[str, Any] | None, folder: Any) -> dict[str, Any]:
    """``model_card_kwargs`` with the model's ``pipeline_task``: the one given (checked before anything is written),
    else that of the model saved in the parent of ``folder`` (None where there is none)."""
    card = dict(card_kwargs or {})
    if card.get("pipeline_task") is None:
        card["pipeline_task"] = pipeline_task_of_folder(Path(folder).parent)
    else:
        check_pipeline_task(card["pipeline_task"], "model_card_kwargs['pipeline_task']")
    return card


def task_only(card_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a predictor's own calibrator card takes from the predictor's card values: the pipeline task."""
    return {"pipeline_task": card_kwargs.get("pipeline_task")}


def add_task_tag(card: Any, task: str | None) -> Any:
    """``card`` (a ``ModelCard``) with ``task`` among its tags; the class's own card data is left untouched."""
    if task:
        card.data.tags = sorted({*(card.data.tags or ()), task})
    return card


_TITLES = {"thr": "THR (LAC)", "aps": "APS", "raps": "RAPS"}
_DESCRIPTIONS = {
    "thr": "A class is in the set when its probability is at least 1 - q, with q calibrated so that the true class is "
    "covered at the target rate; this gives the smallest sets on average.",
    "aps": "The set holds the most probable classes until their cumulative probability reaches a calibrated level, so "
    "uncertain images get larger sets than confident ones.",
    "raps": "Like APS, with a penalty lambda on every class ranked beyond k_reg, which keeps the unreliable tail of "
    "small probabilities out of the sets and makes them smaller and more stable.",
}
_CITATIONS = {
    "thr": "Sadinle, Lei & Wasserman (2019), *Least Ambiguous Set-Valued Classifiers with Bounded Error Levels*, JASA",
    "aps": "Romano, Sesia & Candès (2020), *Classification with Valid and Adaptive Coverage*, NeurIPS; as in "
    "Angelopoulos, Bates, Malik & Jordan (2021), *Uncertainty Sets for Image Classifiers using Conformal Prediction*, ICLR",
    "raps": "Angelopoulos, Bates, Malik & Jordan (2021), *Uncertainty Sets for Image Classifiers using Conformal "
    "Prediction*, ICLR",
}


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _ordinal(k) -> str:
    if not isinstance(k, int):
        return "n/a"
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def guarantee_statement(alpha: float, n: int, *, exact: bool, ties: int | None = None, noun: str = "image") -> str:
    """What the sets promise, in words: the split-conformal bound, and the upper one when it holds (``exact``: empty
    sets kept; ``ties``: calibration scores equal to the threshold, the ceiling needing at most one; None: unknown).
    ``noun``: one input of the model (image, text, audio clip, video)."""
    text = (
        f"For a new {noun} drawn from the same distribution as the {n} calibration {noun}s (exchangeable with them), the "
        f"prediction set contains its true class with probability at least 1 - alpha = {1 - alpha:.4g}"
    )
    if exact and ties is not None and ties > 1:
        text += (
            f"; the ceiling 1 - alpha + 1/(n+1) = {1 - alpha + 1 / (n + 1):.4g} does not hold here: {ties} calibration "
            "scores tie at the threshold (a randomised score breaks such ties)"
        )
    elif exact:
        text += f", and at most 1 - alpha + 1/(n+1) = {1 - alpha + 1 / (n + 1):.4g}" + (
            " (no calibration scores tie at the threshold)"
            if ties is not None
            else " when no two calibration scores tie"
        )
    else:
        text += " (it may exceed it: an empty set is given the most probable class)"
    return text + (
        f". The guarantee is marginal: an average over {noun}s, not a promise for each {noun} or each class, and it "
        f"does not survive a shift in the data (other {noun}s, corruptions, a changed class balance)."
    )


def card_values(predictor: Any, task: str | None = None) -> dict[str, Any]:
    """The template's values for a fitted predictor of a ``task`` model (a pipeline task; None: unknown)."""
    modality = modality_values(task)
    info = predictor.fit_info_ or {}
    method = info.get("method", predictor.method)
    alpha = info.get("alpha", float("nan"))
    n = info.get("num_samples", 0)
    calibrator = info.get("calibrator")
    return {
        "title": f"{_TITLES.get(method, method)} conformal prediction sets",
        "method": method,
        "method_description": _DESCRIPTIONS.get(method, ""),
        "citation": _CITATIONS.get(method, ""),
        "randomization": "randomised" if info.get("randomized") else "not randomised",
        "alpha": alpha,
        "target": f"{100 * (1 - alpha):.2f}%",
        "num_samples": n,
        "num_classes": info.get("num_classes", "n/a"),
        "num_tune": info.get("num_tune", 0),
        "tuned": _and(info.get("tuned", [])),
        "q_hat": f"{info.get('q_hat', float('nan')):.6g}",
        "quantile_rank": _ordinal(info.get("quantile_rank")),
        "coverage": f"{100 * info.get('coverage', float('nan')):.2f}%",
        "mean_set_size": f"{info.get('mean_set_size', float('nan')):.3f} of {info.get('num_classes', 'n/a')} classes",
        "raps": method == "raps",
        "k_reg": info.get("k_reg"),
        "penalty": info.get("penalty"),
        "tuned_raps": any(t.startswith("choose") for t in info.get("tuned", [])),
        "calibrator": "none"
        if not calibrator
        else f"`{calibrator['kind']}` ({calibrator['fitted_on']}; saved in `calibrator/`)",
        "format_version": predictor.format_version,
        "guarantee": guarantee_statement(
            alpha, n, exact=bool(info.get("allow_empty")), ties=info.get("ties_at_threshold"), noun=modality["noun"]
        ),
        **modality,
    }
