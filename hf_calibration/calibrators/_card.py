"""The model card a saved calibrator carries (huggingface_hub renders it with the fit's numbers)."""

CALIBRATOR_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A post-hoc calibrator for an image classifier, saved with the `hf_calibration` library
(`pip install hf-calibration`).
{{ method_description }} {{ argmax_statement }}

{% if citation %}Method: {{ citation }}{% if paper_url %} ({{ paper_url }}){% endif %}.
{% endif %}
## Fit

| | |
|---|---|
| calibrator | `{{ kind }}` |
| objective | `{{ objective }}` |
| fit-set size | {{ num_samples }} samples, {{ num_classes }} {{ class_word | default("classes") }} |
| fit-set accuracy | {{ accuracy }} |
| ECE before (fit set, 15 bins) | {{ ece_before }} |
| ECE after (fit set, 15 bins) | {{ ece_after }} |
| checkpoint format | {{ format_version }} |
{% if fitted_on %}| fitted on | {{ fitted_on }} |
{% endif %}

ECE is measured on the data the calibrator was fitted on; report held-out numbers for a fair picture.

## Usage

```python
from transformers import AutoModelForImageClassification, pipeline
from hf_calibration.calibrators import load_calibrator

{% if model_repo %}model = AutoModelForImageClassification.from_pretrained("{{ model_repo }}")
calibrator = load_calibrator({{ calibrator_args }})
{% else %}model = AutoModelForImageClassification.from_pretrained("<model repo>")
calibrator = load_calibrator("<this repo>")  # or load_calibrator("<model repo>", subfolder="calibrator")
{% endif %}calibrator.attach(model)      # model(...).logits and pipeline scores are now calibrated
calibrator.detach()           # back to the original model, bit for bit
```
{% if selection %}
## How this calibrator was chosen

{{ selection }}
{% endif %}{% if shift %}
## Calibration under shift

{{ shift }}
{% endif %}"""
