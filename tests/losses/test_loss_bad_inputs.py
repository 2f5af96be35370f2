"""Bad and tricky input to the losses: hyper-parameters, labels, non-finite rows (one case a test; see
``tests/_bad_inputs.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from _bad_inputs import (
    Case,
    K,
    case_params,
    check,
)

from hf_calibration import losses


def loss_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, K, generator=g)
    labels = torch.randint(0, K, (16,), generator=g)

    def focal_grad():
        z = torch.zeros(4, K)
        z[:, 0] = 40.0  # p_y rounds to 1 in float32
        z.requires_grad_(True)
        losses.FocalLoss(gamma=0.5)(z, torch.zeros(4, dtype=torch.long)).backward()
        return z.grad.abs().max().item()

    add(
        Case(
            "NaN / inf",
            "losses",
            "FocalLoss(gamma=0.5) gradient on confident float32 rows",
            focal_grad,
            reference=lambda: 0.0,
            atol=1e-6,
        )
    )
    for value in (0, -4, float("nan"), float("inf")):
        add(
            Case(
                "hyper-parameters",
                "losses",
                f"LabelSmoothingLoss(num_items_in_batch={value})",
                lambda value=value: losses.LabelSmoothingLoss(alpha=0.1)(
                    logits, labels, num_items_in_batch=value
                ).item(),
                ("num_items_in_batch",),
            )
        )
    add(Case("hyper-parameters", "losses", "FocalLoss(gamma=-1)", lambda: losses.FocalLoss(gamma=-1.0), ("gamma",)))
    add(
        Case(
            "hyper-parameters",
            "losses",
            "LabelSmoothingLoss(alpha=1.5)",
            lambda: losses.LabelSmoothingLoss(alpha=1.5),
            ("alpha",),
        )
    )
    add(Case("hyper-parameters", "losses", "MbLSLoss(margin=-1)", lambda: losses.MbLSLoss(margin=-1.0), ("margin",)))
    add(
        Case(
            "rank / shape",
            "losses",
            "CrossEntropyLoss(N mismatch)",
            lambda: losses.CrossEntropyLoss()(logits, labels[:-1]),
            ("labels", "logits"),
        )
    )
    add(
        Case(
            "labels",
            "losses",
            "CrossEntropyLoss(label = K)",
            lambda: losses.CrossEntropyLoss()(logits, torch.full((16,), K)),
            ("labels",),
        )
    )
    add(
        Case(
            "labels",
            "losses",
            "CrossEntropyLoss(-100 ignored)",
            lambda: losses.CrossEntropyLoss()(logits, torch.where(torch.arange(16) % 2 == 0, -100, labels)).item(),
            reference=lambda: torch.nn.functional.cross_entropy(logits[1::2], labels[1::2]).item(),
            atol=1e-6,
        )
    )

    def fedlas_after_inf():
        loss = losses.FeDLaSLoss(num_classes=K, variant="ls")
        loss.train()
        features = torch.randn(16, 8, generator=g)
        features[0] = float("inf")
        loss(logits, labels, features=features)
        return loss(logits, labels, features=torch.randn(16, 8, generator=g)).item()

    add(
        Case(
            "NaN / inf",
            "losses",
            "FeDLaS: an inf feature row, then a clean batch: finite loss",
            lambda: math.isfinite(fedlas_after_inf()),
            ("features",),
            lambda: True,
        )
    )
    return cases


@pytest.mark.parametrize("case", case_params(loss_cases))
def test_bad_input(case: Case) -> None:
    check(case)
