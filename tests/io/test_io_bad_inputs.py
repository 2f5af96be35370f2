"""The logits cache never serves logits keyed without a forward hook or a plain callable processor (one case a test; see
``tests/_bad_inputs.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _bad_inputs import (
    Case,
    K,
    case_params,
    check,
    saved_route,
    tiny_vit,
)


def cache_cases(tmp: Path) -> list[Case]:
    """Item 4: a forward hook, a plain callable processor: never served logits keyed without them."""
    from transformers import ViTImageProcessor

    from hf_calibration.io import predict_logits
    from hf_calibration.io.data import load_image_dataset
    from hf_calibration.io.logits_cache import cache_key

    cases: list[Case] = []
    add = cases.append
    model_dir, data_dir = saved_route(tmp)
    processor = ViTImageProcessor.from_pretrained(model_dir)

    def hooked_run(where: str):
        from transformers import AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(model_dir)
        cache = tmp / f"cache_{where}"
        predict_logits(model, str(data_dir), processor, split="test", cache_dir=cache, progress=False)
        shift = torch.arange(float(K))
        module = {"model": model, "classifier": model.classifier}[where]
        if where == "model":
            module.register_forward_hook(
                lambda mod, args, output: output.__setitem__("logits", output["logits"] + shift) or output
            )
        else:
            module.register_forward_hook(lambda mod, args, output: output + shift)
        logits, _ = predict_logits(model, str(data_dir), processor, split="test", cache_dir=cache, progress=False)
        return logits

    def hooked_reference(where: str):
        from transformers import AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
        data = load_image_dataset(str(data_dir), "test")
        with torch.no_grad():
            pixels = processor(images=[im.convert("RGB") for im in data["img"]], return_tensors="pt")["pixel_values"]
            return (model(pixel_values=pixels).logits + torch.arange(float(K))).numpy()

    for where in ("model", "classifier"):
        add(
            Case(
                "logits cache",
                "inference",
                f"predict_logits after a forward hook on the {where} (cached before): the hooked logits",
                lambda where=where: hooked_run(where),
                reference=lambda: hooked_reference("model"),
                atol=1e-5,
            )
        )
    data = load_image_dataset(str(data_dir), "test")
    for label, proc in (
        ("a lambda", lambda images, return_tensors: None),
        ("a string", "P"),
        ("a callable object", type("Proc", (), {"__call__": lambda self, **kw: None})()),
    ):
        add(
            Case(
                "logits cache",
                "inference",
                f"cache_key with {label} as the processor: not keyed",
                lambda proc=proc: (
                    cache_key(
                        tiny_vit(), proc, data, split="test", image_column="img", label_column="label", image_mode="RGB"
                    )[0]
                    is None
                ),
                reference=lambda: True,
            )
        )
    return cases


@pytest.mark.parametrize("case", case_params(cache_cases))
def test_bad_input(case: Case) -> None:
    check(case)
