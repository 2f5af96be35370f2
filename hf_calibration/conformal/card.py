"""The model card of a saved ``ConformalPredictor``: what its sets guarantee, how it was fitted, how to load it."""

from __future__ import annotations

from typing import Any

CONFORMAL_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

Conformal prediction sets for an image classifier, saved with the `hf_calibration` library
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

```python
from transformers import pipeline
from hf_calibration.conformal import ConformalPredictor

{% if model_repo %}predictor = ConformalPredictor.from_pretrained("{{ model_repo }}", subfolder="{{ subfolder }}")
classifier = predictor.attach(pipeline("image-classification", model="{{ model_repo }}"))
{% else %}predictor = ConformalPredictor.from_pretrained("<this repo>")  # or ("<model repo>", subfolder="conformal")
classifier = predictor.attach(pipeline("image-classification", model="<model repo>"))
{% endif %}classifier(image)                  # each row has "in_set"; every class of the set is listed
sets = predictor.predict_sets(logits)  # (N, K) boolean mask from the model's logits
```
"""

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


def guarantee_statement(alpha: float, n: int, *, exact: bool, ties: int | None = None) -> str:
    """What the sets promise, in words: the split-conformal bound, and the upper one when it holds (``exact``: empty
    sets kept; ``ties``: calibration scores equal to the threshold, the ceiling needing at most one; None: unknown)."""
    text = (
        f"For a new image drawn from the same distribution as the {n} calibration images (exchangeable with them), the "
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
        ". The guarantee is marginal: an average over images, not a promise for each image or each class, and it does "
        "not survive a shift in the data (other images, corruptions, a changed class balance)."
    )


def card_values(predictor: Any) -> dict[str, Any]:
    """The template's values for a fitted predictor."""
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
            alpha, n, exact=bool(info.get("allow_empty")), ties=info.get("ties_at_threshold")
        ),
    }
