"""The model card a saved calibrator carries (huggingface_hub renders it with the fit's numbers)."""

CALIBRATOR_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A post-hoc calibrator for {{ model_kind }}, saved with the `hf_calibration` library
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

{% if pipeline_task == "image-segmentation" %}```python
import hf_calibration

segmenter = hf_calibration.pipeline("image-segmentation", model="{{ model_repo | default("<model repo>", true) }}")
segmenter(image)  # transformers' masks, each with a calibrated score and probability map
```

With the calibrator saved in the segmenter's `calibrator/` folder, `hf_calibration.load_calibrated_model` loads both
(`model(...).logits` calibrated per pixel).
{% else %}```python
{% if auto_class %}from transformers import {{ auto_class }}, {{ processor_class }}, pipeline
from hf_calibration.calibrators import load_calibrator

model = {{ auto_class }}.from_pretrained("{{ model_repo | default("<model repo>", true) }}")
{% else %}from hf_calibration.calibrators import load_calibrator
from hf_calibration.io import load_classifier

model = load_classifier("{{ model_repo | default("<model repo>", true) }}")[0]  # the Auto class its config names
{% endif %}{% if model_repo %}calibrator = load_calibrator({{ calibrator_args }})
{% else %}calibrator = load_calibrator("<this repo>")  # or load_calibrator("<model repo>", subfolder="calibrator")
{% endif %}calibrator.attach(model)      # model(...).logits and pipeline scores are now calibrated
{% if auto_class %}{{ processor_argument }} = {{ processor_class }}.from_pretrained("{{ model_repo | default("<model repo>", true) }}")
classifier = pipeline("{{ pipeline_task }}", model=model, {{ processor_argument }}={{ processor_argument }})
{% endif %}calibrator.detach()           # back to the original model, bit for bit
```

With the calibrator saved in the model repo's `calibrator/` folder, one call loads both (the task read from the model's
config): `hf_calibration.pipeline(model="{{ model_repo | default("<model repo>", true) }}")`.
{% endif %}{% if selection %}
## How this calibrator was chosen

{{ selection }}
{% endif %}{% if shift %}
## Calibration under shift

{{ shift }}
{% endif %}"""
