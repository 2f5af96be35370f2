"""The command line on a multi-label and a binary head: report / fit / apply / compare read the task from the arrays
(or --task), print macro and pooled tables, fit sigmoid calibrators and refuse a softmax one naming the head."""

import json

import numpy as np
import pytest

from hf_calibration.cli import main
from hf_calibration.io.logits_files import save_logits
from hf_calibration.metrics import ece


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_multilabel")
    rng = np.random.default_rng(0)
    y = (rng.random((1200, 3)) < 0.35).astype(np.int64)
    z = 4.0 * (2 * y - 1) + 3.0 * rng.normal(size=y.shape)  # over-confident
    multi = save_logits(root / "multi.npz", val=(z[:600], y[:600]), test=(z[600:], y[600:]))
    yb = y[:, 0]
    binary = save_logits(root / "binary.npz", val=(z[:600, 0], yb[:600]), test=(z[600:, 0], yb[600:]))
    return root, multi, binary, z, y


def test_report_multilabel_json_and_text(files, capsys):
    root, multi, _, z, y = files
    assert main(["report", "--logits", str(multi), "--split", "test", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task"] == "multilabel" and out["macro"]["ece"] == pytest.approx(ece(z[600:], y[600:]), rel=1e-12)
    assert main(["report", "--logits", str(multi), "--split", "test", "--diagram", str(root / "d.png")]) == 0
    text = capsys.readouterr().out
    assert "multilabel head" in text and "pooled (micro)" in text and "macro (mean over labels)" in text
    assert (root / "d.png").is_file()


def test_fit_and_apply_sigmoid_calibrator(files, capsys, tmp_path):
    _, multi, binary, z, y = files
    assert main(["fit", "--logits", str(multi), "--method", "platt", "--out", str(tmp_path / "platt")]) == 0
    assert "Multi-label: macro" in capsys.readouterr().out
    assert (
        main(["apply", "--calibrator", str(tmp_path / "platt"), "--logits", str(multi), "--split", "test", "--json"])
        == 0
    )
    reports = json.loads(capsys.readouterr().out)["reports"]
    assert reports["platt"]["macro"]["nll"] < reports["uncalibrated"]["macro"]["nll"]
    assert main(["fit", "--logits", str(binary), "--method", "auto", "--out", str(tmp_path / "auto")]) == 0
    assert main(["fit", "--logits", str(multi), "--method", "ts", "--out", str(tmp_path / "ts")]) == 1
    assert "calibrates a softmax head" in capsys.readouterr().err
    assert main(["apply", "--calibrator", str(tmp_path / "platt"), "--logits", str(binary), "--split", "test"]) == 1


def test_compare_multilabel(files, capsys, tmp_path):
    _, multi, _, _, _ = files
    assert main(["compare", "--logits", str(multi), "--json", "--out", str(tmp_path / "cmp")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["table"]) == {
        "uncalibrated",
        "sigmoid_temperature_scaling",
        "platt",
        "beta",
        "sigmoid_isotonic",
        "sigmoid_histogram_binning",
    }
    assert out["best"] in out["table"] and len(out["diagrams"]) >= 2


def test_conformal_on_a_multilabel_head_is_conformal_risk_control(tmp_path, capsys):
    """`hf-calibration conformal --task multilabel` failed with "Expected labels rank 1" (issue 40, item 2): a multi-label
    head's sets are CRC's, here equal to MultiLabelConformalPredictor's on the same arrays."""
    from hf_calibration.conformal import MultiLabelConformalPredictor

    rng = np.random.default_rng(4)
    y = (rng.random((800, 4)) < 0.3).astype(np.int64)
    z = 2 * (2 * y - 1) + 2 * rng.normal(size=y.shape)
    path = save_logits(tmp_path / "ml.npz", val=(z[:500], y[:500]), test=(z[500:], y[500:]))
    code = main(["conformal", "--logits", str(path), "--split", "val", "--task", "multilabel", "--alpha", "0.1",
                 "--test-split", "test", "--out", str(tmp_path / "crc"), "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    expected = MultiLabelConformalPredictor().fit(z[:500], y[:500], alpha=0.1)
    assert got["method"] == "crc" and got["threshold"] == pytest.approx(expected.fit_info_["threshold"], abs=1e-12)
    assert {k: got["test"][k] for k in ("false_negative_rate", "mean_set_size")} == pytest.approx(
        expected.evaluate(z[500:], y[500:])
    )
    code = main(["conformal", "--logits", str(path), "--task", "multilabel", "--method", "aps"])
    assert code != 0 and "do not apply" in capsys.readouterr().err
