"""Published numbers on real logits (Mukhoti et al. 2020, focal_calibration README table).

The logits live in the project's shared folder beside the repository; a user's clone has no
such folder, so these tests skip cleanly without it.
"""

from pathlib import Path

import _metric_reference as ref
import numpy as np
import pytest

from hf_calibration.metrics import calibration_report, ece

LOGITS = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "logits"


def _load(name):
    path = LOGITS / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"shared logits not available ({path.name})")
    data = np.load(path)
    return data["logits_test"], data["labels_test"]


@pytest.mark.parametrize(
    "name,error,ece_pct,temperature,ece_ts_pct",
    [("cifar10_resnet50_cross_entropy_calibench", 4.95, 4.35, 2.5, 1.35)],
)
def test_resnet50_cross_entropy(name, error, ece_pct, temperature, ece_ts_pct):
    logits, labels = _load(name)
    assert f"{100 * ece(logits, labels):.2f}" == f"{ece_pct:.2f}"
    assert f"{100 * ece(logits / temperature, labels):.2f}" == f"{ece_ts_pct:.2f}"
    report = calibration_report(logits, labels)
    assert f"{100 * (1 - report.accuracy):.2f}" == f"{error:.2f}"
    assert f"{100 * report.ece:.2f}" == f"{ece_pct:.2f}"


def test_resnet50_flsd53():
    logits, labels = _load("cifar10_resnet50_focal_loss_calibench")
    report = calibration_report(logits, labels)
    assert f"{100 * (1 - report.accuracy):.2f}" == "4.98"
    assert f"{100 * report.ece:.2f}" == "1.55"
    # The README prints 0.95 % after TS at T = 1.1. On these logits the paper's own ECE code
    # (re-implemented literally in float32 torch, ``focal_calibration_ece_torch``) gives 0.91 %
    # at T = 1.1; the printed 0.95 sits between T = 1.10 (0.91) and T = 1.11 (0.98), so the
    # published T was presumably rounded. We check agreement with the paper's code instead.
    scaled = ece(logits / 1.1, labels)
    assert scaled == pytest.approx(ref.focal_calibration_ece_torch(logits, labels, 1.1), abs=1e-6)
    assert 0.0090 < scaled < 0.0095  # below the printed 0.95 %, well below the uncalibrated 1.55 %


def test_paper_reference_code_agrees_on_all_published_cases():
    for name, temperatures in [
        ("cifar10_resnet50_cross_entropy_calibench", (1.0, 2.5)),
        ("cifar10_resnet50_focal_loss_calibench", (1.0, 1.1)),
    ]:
        logits, labels = _load(name)
        for t in temperatures:
            assert ece(logits / t, labels) == pytest.approx(
                ref.focal_calibration_ece_torch(logits, labels, t), abs=1e-6
            )


def test_resnet50_flsd53_published_ts_value_is_reached_by_a_temperature_that_rounds_to_1_1():
    # The table's T = 1.1 is printed to one decimal: some T in [1.05, 1.15) must print the published 0.95 %.
    logits, labels = _load("cifar10_resnet50_focal_loss_calibench")
    temperatures = np.linspace(1.05, 1.15, 801, endpoint=False)
    printed = [round(100 * ece(logits / t, labels), 2) for t in temperatures]
    assert 0.95 in printed
    assert round(100 * ece(logits / 1.109375, labels), 2) == 0.95
