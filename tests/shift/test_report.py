"""shift_report against the metric functions applied by hand to logits calibrated by hand (fit on val only)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.metrics import adaece, ece, nll, ood_metrics, smce
from hf_calibration.shift import shift_report


def make(rng, n, scale, noise, k=5):
    y = rng.integers(0, k, n)
    z = rng.normal(0, 1, (n, k))
    z[np.arange(n), y] += 2.5
    return z * scale + rng.normal(0, noise, (n, k)), y


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    val, test = make(rng, 600, 2.0, 0.0), make(rng, 500, 2.0, 0.0)
    shifted = {(name, s): make(rng, 300, 2.0, 0.6 * s) for name in ("noise", "blur") for s in (1, 3)}
    ood = rng.normal(0, 1.5, (200, 5))
    return val, test, shifted, ood


@pytest.fixture(scope="module")
def report(data):
    val, test, shifted, ood = data
    return shift_report(val, test, shifted, calibrators=["ts"], ood_logits={"noise": ood, "half": ood[:100]},
                        ood_scores=("msp", "energy", "max_logit"))  # fmt: skip


def test_rows_equal_the_metrics_of_logits_calibrated_on_val_only(data, report):
    val, test, shifted, _ = data
    ts = TemperatureScaling().fit(*val, progress_bar=False)
    assert report.methods == ["uncalibrated", "ts"]
    sets = {("clean", 0): test, **shifted}
    assert len(report.rows) == 2 * len(sets)
    for row in report.rows:
        z, y = sets[(row["corruption"], row["severity"])]
        if row["method"] == "ts":
            z = ts(torch.from_numpy(z)).numpy()
        expected = {
            "accuracy": float((z.argmax(1) == y).mean()),
            "ece": ece(z, y),
            "adaece": adaece(z, y),
            "smce": smce(z, y),
            "nll": nll(z, y),
        }
        for key, value in expected.items():
            assert row[key] == pytest.approx(value, abs=1e-12), (row["method"], row["corruption"], key)


def test_ood_rows(data, report):
    val, test, _, ood = data
    ts = TemperatureScaling().fit(*val, progress_bar=False)
    for row in report.ood:
        z_in, z_out = test[0], ood if row["ood"] == "noise" else ood[:100]
        if row["method"] == "ts":
            z_in, z_out = ts(torch.from_numpy(z_in)).numpy(), ts(torch.from_numpy(z_out)).numpy()
        expected = ood_metrics(z_in, z_out, row["score"])
        assert {k: row[k] for k in expected} == pytest.approx(expected, abs=1e-12)
    assert len(report.ood) == 2 * 2 * 3
    assert {(r["method"], r["score"]) for r in report.ood} == {
        (m, s) for m in ("uncalibrated", "ts") for s in ("msp", "energy", "max_logit")
    }
    single = shift_report(val, test, {}, calibrators=[], ood_logits=ood)  # one unnamed OOD set
    assert [r["ood"] for r in single.ood] == ["ood", "ood"] and single.ood[0]["auroc"] == report.ood[0]["auroc"]


def test_severity_means_plot_table_and_json(report, tmp_path):
    means = report.severity_means("ece")
    assert report.severities == [0, 1, 3] and report.corruptions == ["noise", "blur"]
    for method in report.methods:
        by_hand = [
            np.mean([r["ece"] for r in report.rows if r["method"] == method and r["severity"] == s]) for s in (0, 1, 3)
        ]
        assert means[method] == pytest.approx(by_hand, abs=1e-15)
    fig = report.plot("ece")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["uncalibrated", "ts"]
    np.testing.assert_allclose(lines[1].get_ydata(), 100 * np.array(means["ts"]))
    fig.savefig(tmp_path / "ece.png")
    text = report.table(full=True)
    assert "mean of 2" in text and "noise" in text and "OOD detection" in text
    assert f"{100 * means['ts'][0]:.2f}" in str(report)
    assert json.loads(report.to_json(str(tmp_path / "r.json"))) == json.loads((tmp_path / "r.json").read_text())


def test_a_fitted_calibrator_is_used_as_it_is(data):
    val, test, shifted, _ = data
    ts = TemperatureScaling().fit(val[0][:100], val[1][:100], progress_bar=False)
    t = float(ts.temperature(torch.zeros(1, 5)))
    report = shift_report(val, test, {}, calibrators=[ts])
    assert report.methods == ["uncalibrated", "temperature_scaling"] and float(ts.temperature(torch.zeros(1, 5))) == t
    z = ts(torch.from_numpy(test[0])).numpy()
    assert report.rows[-1]["ece"] == pytest.approx(ece(z, test[1]), abs=1e-12)


def test_bad_input(data):
    val, test, shifted, _ = data
    with pytest.raises(TypeError, match="`val`"):
        shift_report(val[0], test, shifted)
    with pytest.raises(ValueError, match="hold logits"):
        shift_report(val, (np.full((4, 5), 0.2), np.zeros(4, dtype=int)), shifted)
    with pytest.raises(TypeError, match="keys of `shifted`"):
        shift_report(val, test, {"noise": test})
    with pytest.raises(ValueError, match="K = 5"):
        shift_report(val, test, {("noise", 1): (test[0][:, :4], test[1] % 4)})
    with pytest.raises(ValueError, match="`calibrators`"):
        shift_report(val, test, shifted, calibrators=["no_such_method"])
    with pytest.raises(
        ValueError, match="a sigmoid calibrator.*problem_type"
    ):  # a binary / multi-label one on a softmax head
        shift_report(val, test, shifted, calibrators=["platt"])
    with pytest.raises(ValueError, match="twice"):
        shift_report(val, test, shifted, calibrators=["ts", "ts"])
    with pytest.raises(ValueError, match="`ood_logits`"):
        shift_report(val, test, shifted, calibrators=[], ood_logits=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="`ood_scores`"):
        shift_report(val, test, shifted, calibrators=[], ood_logits=np.zeros((3, 5)), ood_scores=("odin",))


def test_ood_probabilities_are_refused_not_scored_as_logits(data):
    # softmax-ed a second time, probabilities of noise inputs scored an MSP AUROC near 99 % where the logits give ~70 %
    from scipy.special import softmax

    val, test, shifted, ood = data
    with pytest.raises(ValueError, match=r"`ood_logits` \(noise\) to hold logits"):
        shift_report(val, test, {}, calibrators=[], ood_logits={"noise": softmax(ood, axis=1)})


def test_a_mapping_labels_the_rows(data):
    """{label: calibrator}: a fitted calibrator beside a fresh fit of the same kind, each row under its own label."""
    val, test, _, _ = data
    saved = TemperatureScaling().fit(val[0][:100], val[1][:100], progress_bar=False)
    report = shift_report(val, test, {}, calibrators={"ts": "ts", "saved-ts": saved})
    assert report.methods == ["uncalibrated", "ts", "saved-ts"]
    rows = {r["method"]: r for r in report.rows}
    fresh = TemperatureScaling().fit(val[0], val[1], progress_bar=False)
    for label, calibrator in (("ts", fresh), ("saved-ts", saved)):
        z = calibrator(torch.from_numpy(test[0])).numpy()
        assert rows[label]["ece"] == pytest.approx(ece(z, test[1]), abs=1e-9)
    with pytest.raises(ValueError, match="appears twice; pass a mapping"):
        shift_report(val, test, {}, calibrators=["temperature_scaling", saved])  # a name and a kind: the same label
    with pytest.raises(TypeError, match="keys of `calibrators`"):
        shift_report(val, test, {}, calibrators={1: "ts"})


def test_logit_level_scores_only_where_a_temperature_keeps_the_level(data):
    # energy / max-logit read each row's logit level: log-probability outputs (isotonic) make energy constant, and
    # maps of z - max z (vector scaling, CTS) or of log p (Dirichlet) drop the level; TS keeps it
    from hf_calibration.calibrators import list_calibrators
    from hf_calibration.metrics import ood_metrics

    val, test, _, ood = data
    methods = [m for m in ("isotonic", "vector_scaling", "cts", "dirichlet") if m in list_calibrators()]
    report = shift_report(
        val, test, {}, calibrators=[*methods, "ts"], ood_logits=ood, ood_scores=("msp", "energy", "max_logit")
    )
    rows = {(r["method"], r["score"]): r for r in report.ood}
    for method in methods:
        assert rows[(method, "energy")]["auroc"] is None and rows[(method, "max_logit")]["auroc"] is None
        assert rows[(method, "msp")]["auroc"] is not None
    from hf_calibration.calibrators import TemperatureScaling

    ts = TemperatureScaling().fit(*val, progress_bar=False)
    expected = ood_metrics(ts(test[0]).numpy(), ts(ood).numpy(), "energy")["auroc"]
    assert rows[("ts", "energy")]["auroc"] == pytest.approx(expected, abs=1e-12)
    assert rows[("uncalibrated", "energy")]["auroc"] == pytest.approx(
        ood_metrics(test[0], ood, "energy")["auroc"], abs=1e-12
    )
    assert " - " in report.table()
