"""The `hf-calibration` command line: help, reports checked against torchmetrics, fit/apply, bad input, published numbers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _paths import SHARED_LOGITS  # noqa: E402

from hf_calibration.cli import main

RESNET50_CE = SHARED_LOGITS / "cifar10_resnet50_cross_entropy_calibench.npz"


def _reference_ece(logits: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> float:
    """torchmetrics' top-label ECE (float64 probabilities, away from its p = 1.0 edge case)."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs = torch.softmax(torch.from_numpy(logits).double(), dim=1)
    return float(
        multiclass_calibration_error(probs, torch.from_numpy(labels), logits.shape[1], n_bins=n_bins, norm="l1")
    )


@pytest.fixture(scope="module")
def synthetic():
    """Over-confident logits: 600 samples, 5 classes, about 70 % accuracy."""
    g = np.random.default_rng(0)
    labels = g.integers(0, 5, 600)
    logits = 2.0 * g.standard_normal((600, 5)) + 2.5 * np.eye(5)[labels]
    logits *= 3.0  # sharpen: over-confident
    return logits.astype(np.float32), labels.astype(np.int64)


@pytest.fixture(scope="module")
def npz_file(tmp_path_factory, synthetic):
    logits, labels = synthetic
    path = tmp_path_factory.mktemp("logits") / "split.npz"
    np.savez(path, logits_val=logits[:300], labels_val=labels[:300], logits_test=logits[300:], labels_test=labels[300:])
    return path


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- help


@pytest.mark.parametrize("command", [[], ["report"], ["fit"], ["apply"], ["demo"]])
def test_help_of_every_subcommand(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main(command + ["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hf-calibration")
    for option in {
        "report": ["--logits", "--diagram", "--json", "--split"],
        "fit": ["--method", "--objective", "--out", "--push-to-hub"],
        "apply": ["--calibrator", "--logits"],
        "demo": ["--output-dir", "--epochs", "--seed"],
    }.get(command[0] if command else "", []):
        assert option in out


# ----------------------------------------------------------------------------- report


def test_report_json_matches_torchmetrics(capsys, npz_file, synthetic):
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--split", "test", "--json")
    assert code == 0, err
    data = json.loads(out)
    logits, labels = synthetic[0][300:], synthetic[1][300:]
    assert data["source"] == "split.npz[test]"
    assert data["n"] == 300
    assert data["accuracy"] == pytest.approx(float((logits.argmax(1) == labels).mean()), abs=1e-12)
    assert data["ece"] == pytest.approx(_reference_ece(logits, labels), abs=1e-6)


def test_report_table_and_diagram(capsys, npz_file, synthetic, tmp_path):
    diagram = tmp_path / "figs" / "rel.png"
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", diagram, "--margin-groups", "2")
    assert code == 0, err
    logits, labels = synthetic[0][300:], synthetic[1][300:]  # --split defaults to test
    expected = f"{100 * _reference_ece(logits, labels):.2f}"
    assert re.search(rf"^ECE \(%\)\s+{re.escape(expected)}$", out, re.M), out
    assert diagram.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_with_bootstrap_intervals(capsys, npz_file, synthetic):
    from hf_calibration.metrics import calibration_report

    logits, labels = synthetic[0][300:], synthetic[1][300:]
    want = calibration_report(logits, labels, ci=0.9, n_boot=100)
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--ci", "0.9", "--n-boot", "100")
    assert code == 0, err
    assert re.search(rf"^ECE\s+{re.escape(want.ece.format(100, 2, ' %'))}( \(\d\))?$", out, re.M), (
        out
    )  # "ECE  3.21 % [2.40, 4.05]"
    assert "MCE" in out and "[no interval]" in out and "maximum over bins" in out
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--ci", "0.9", "--n-boot", "100", "--json")
    data = json.loads(out)
    assert data["ece"] == pytest.approx(float(want.ece), abs=1e-12)
    assert (data["intervals"]["ece"]["low"], data["intervals"]["nll"]["high"]) == pytest.approx(
        (want.ece.low, want.nll.high), abs=1e-12
    )
    assert data["intervals"]["ece"]["method"] == "basic" and data["intervals"]["nll"]["method"] == "percentile"
    # MCE has no interval: null ends (strict JSON) and the reason
    assert data["intervals"]["mce"]["low"] is None and "maximum over bins" in data["intervals"]["mce"]["note"]
    code, _, err = _run(capsys, "report", "--logits", npz_file, "--ci", "95")
    assert code == 1 and "--ci" in err


def test_report_json_with_intervals_and_an_infinite_nll(capsys, tmp_path):
    """Issue 29 item 9: --json --ci crashed on an infinite interval end ("Out of range float values are not JSON
    compliant"); the ends are null and listed under non_finite, as the values are."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    p = np.full((200, 3), 0.25)
    p[np.arange(200), y] = 0.5
    p[0] = [0.0, 0.5, 0.5] if y[0] == 0 else [0.5, 0.5, 0.0] if y[0] == 2 else [0.5, 0.0, 0.5]  # the true class at 0
    path = tmp_path / "probs.npz"
    np.savez(path, logits=p, labels=y)
    code, out, err = _run(capsys, "report", "--logits", path, "--probs", "--json", "--ci", "0.9", "--n-boot", "100")
    assert code == 0, err
    data = json.loads(out)
    assert data["nll"] is None and data["non_finite"]["nll"] == "inf" and data["non_finite"]["nll.high"] == "inf"
    assert data["intervals"]["nll"]["high"] is None
    from hf_calibration.metrics import ece

    assert data["intervals"]["ece"]["high"] == pytest.approx(
        ece(p, y, from_logits=False, ci=0.9, n_boot=100).high, abs=1e-12
    )
    code, _, err = _run(
        capsys, "report", "--logits", path, "--probs", "--n-boot", "100"
    )  # item 15: not ignored silently
    assert code == 1 and err.count("\n") == 1 and "n_boot" in err


def test_report_reads_npy_pair_pt_and_plain_npz_alike(capsys, tmp_path, synthetic):
    logits, labels = synthetic
    np.save(tmp_path / "z.npy", logits)
    np.save(tmp_path / "y.npy", labels)
    torch.save({"logits": torch.from_numpy(logits), "labels": torch.from_numpy(labels)}, tmp_path / "d.pt")
    torch.save((torch.from_numpy(logits), torch.from_numpy(labels)), tmp_path / "pair.pt")
    np.savez(tmp_path / "plain.npz", logits=logits, labels=labels)
    expected = _reference_ece(logits, labels)
    for argv in (
        ["--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy"],
        ["--logits", tmp_path / "d.pt"],
        ["--logits", tmp_path / "pair.pt"],
        ["--logits", tmp_path / "plain.npz"],
    ):
        code, out, err = _run(capsys, "report", *argv, "--json")
        assert code == 0, err
        assert json.loads(out)["ece"] == pytest.approx(expected, abs=1e-6)


def test_report_probabilities(capsys, tmp_path, synthetic):
    logits, labels = synthetic
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    np.savez(tmp_path / "p.npz", logits=probs, labels=labels)
    code, out, err = _run(capsys, "report", "--logits", tmp_path / "p.npz", "--probs", "--json")
    assert code == 0, err
    assert json.loads(out)["ece"] == pytest.approx(_reference_ece(logits, labels), abs=1e-6)


@pytest.fixture
def saved_figures(monkeypatch):
    """Every matplotlib Figure the CLI saves, kept for inspection (and still written to disk)."""
    from matplotlib.figure import Figure

    figures, original = [], Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _panels(fig):
    """Per reliability panel: (title, ECE % printed in it, N printed in it, per-bin counts of its count panel)."""
    out = []
    reliability = [a for a in fig.axes if a.get_ylabel() == "accuracy"]
    counts = [a for a in fig.axes if a.get_ylabel() == "count"]
    for rel_ax, count_ax in zip(reliability, counts):
        text = " ".join(t.get_text() for t in rel_ax.texts)
        bars = next(c for c in count_ax.containers if c.get_label() == "count")
        out.append(
            (
                rel_ax.get_title(),
                re.search(r"ECE = ([0-9.]+) ?%", text).group(1),
                int(re.search(r"N = (\d+)", text).group(1)),
                [int(p.get_height()) for p in bars.patches],
            )
        )
    return out


def test_report_probs_diagram_shows_the_table_numbers(capsys, tmp_path, synthetic, saved_figures):
    # issue 11, case 3: the table read the file as probabilities, the diagram as logits (10.55 % vs 33.98 %)
    logits, labels = synthetic
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    np.savez(tmp_path / "p.npz", logits=probs, labels=labels)
    code, out, err = _run(capsys, "report", "--logits", tmp_path / "p.npz", "--probs", "--diagram", tmp_path / "d.png")
    assert code == 0, err
    table_ece = re.search(r"^ECE \(%\)\s+([0-9.]+)$", out, re.M).group(1)
    assert table_ece == f"{100 * _reference_ece(logits, labels):.2f}"
    ((_, diagram_ece, n, counts),) = _panels(saved_figures[-1])
    assert diagram_ece == table_ece and n == 600
    # the counts panel against an independent binning of the top-label confidences (lo < p <= hi)
    conf = probs.max(1)
    assert counts == [int(((conf > b / 15) & (conf <= (b + 1) / 15)).sum()) for b in range(15)]


@pytest.mark.parametrize("flag", [[], ["--probs"]])
def test_report_probs_margin_groups_are_the_logit_margin_groups(capsys, tmp_path, synthetic, saved_figures, flag):
    logits, labels = synthetic
    np.savez(tmp_path / "z.npz", logits=logits.astype(np.float64), labels=labels)
    np.savez(tmp_path / "p.npz", logits=torch.softmax(torch.from_numpy(logits).double(), 1).numpy(), labels=labels)
    assert (
        _run(capsys, "report", "--logits", tmp_path / "z.npz", "--diagram", tmp_path / "z.png", "--margin-groups", "3")[
            0
        ]
        == 0
    )
    code, out, err = _run(
        capsys, "report", "--logits", tmp_path / "p.npz", *flag, "--diagram", tmp_path / "p.png", "--margin-groups", "3"
    )
    assert code == 0, err
    from_logits, from_probs = _panels(saved_figures[0]), _panels(saved_figures[1])
    assert len(from_probs) == 3 and from_probs == from_logits  # the same groups, titles, ECEs and counts
    # and the groups are those of the logit margin z_(1) - z_(2), cut in three equal runs
    top2 = np.sort(logits.astype(np.float64), axis=1)[:, -2:]
    order = np.argsort(top2[:, 1] - top2[:, 0], kind="stable")
    for (_, diagram_ece, n, _), idx in zip(from_probs, np.array_split(order, 3)):
        assert n == len(idx) and diagram_ece == f"{100 * _reference_ece(logits[idx], labels[idx]):.2f}"


def test_report_detects_probabilities_and_from_logits_overrides(capsys, tmp_path, synthetic):
    logits, labels = synthetic
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    np.savez(tmp_path / "p.npz", logits=probs, labels=labels)
    code, out, err = _run(capsys, "report", "--logits", tmp_path / "p.npz", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["inputs"] == "probabilities" and data["ece"] == pytest.approx(_reference_ece(logits, labels), abs=1e-6)
    with pytest.warns(UserWarning, match="looks like probabilities"):
        code, out, err = _run(capsys, "report", "--logits", tmp_path / "p.npz", "--from-logits", "--json")
    assert code == 0 and json.loads(out)["inputs"] == "logits"
    assert json.loads(out)["ece"] == pytest.approx(
        _reference_ece(probs, labels), abs=1e-6
    )  # softmax of probabilities, as asked
    with pytest.raises(SystemExit) as exit_info:  # one or the other
        main(["report", "--logits", str(tmp_path / "p.npz"), "--probs", "--from-logits"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("command", ["report", "fit"])
def test_a_file_mixing_probability_and_logit_rows_is_refused(capsys, tmp_path, synthetic, command):
    # issue 23 item 1: probabilities with one malformed row (or followed by logits) were read as logits
    logits, labels = synthetic
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    malformed = probs.copy()
    malformed[5] *= 1.02
    mixed = np.vstack([probs[:100], logits[100:]])
    extra = ["--method", "ts", "--out", tmp_path / "cal"] if command == "fit" else []
    for name, preds in (("malformed", malformed), ("mixed", mixed)):
        np.savez(tmp_path / f"{name}.npz", logits=preds, labels=labels)
        code, out, err = _run(capsys, command, "--logits", tmp_path / f"{name}.npz", *extra)
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "either logits or probabilities" in err and f"row {5 if name == 'malformed' else 100} is not" in err
        assert "--probs" in err and "--from-logits" in err  # the command line's own switches
    assert not (tmp_path / "cal").exists()


# ----------------------------------------------------------------------------- fit / apply


def test_fit_ts_then_apply_matches_a_scipy_temperature(capsys, npz_file, synthetic, tmp_path):
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    out_dir = tmp_path / "ts"
    code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", out_dir)
    assert code == 0, err
    assert {"config.json", "model.safetensors"} <= {p.name for p in out_dir.iterdir()}
    assert "split.npz[val]" in out  # fit defaults to the val split

    # independent temperature: NLL minimised over log T by scipy on the val split
    z_val, y_val = synthetic[0][:300].astype(np.float64), synthetic[1][:300]
    nll = lambda log_t: -log_softmax(z_val / np.exp(log_t), axis=1)[np.arange(300), y_val].mean()  # noqa: E731
    t_ref = float(np.exp(minimize_scalar(nll, bounds=(-5, 5), method="bounded", options={"xatol": 1e-10}).x))
    t_printed = float(re.search(r"T = ([0-9.]+)", out).group(1))
    assert t_printed == pytest.approx(t_ref, rel=2e-3)

    saved = tmp_path / "calibrated.npz"
    code, out, err = _run(
        capsys, "apply", "--calibrator", out_dir, "--logits", npz_file, "--save-logits", saved, "--json"
    )
    assert code == 0, err
    reports = json.loads(out)["reports"]
    z_test, y_test = synthetic[0][300:], synthetic[1][300:]
    assert reports["uncalibrated"]["ece"] == pytest.approx(_reference_ece(z_test, y_test), abs=1e-6)
    assert reports["temperature_scaling"]["ece"] == pytest.approx(_reference_ece(z_test / t_ref, y_test), abs=2e-3)
    assert reports["temperature_scaling"]["accuracy"] == reports["uncalibrated"]["accuracy"]
    with np.load(saved) as calibrated:
        np.testing.assert_allclose(calibrated["logits"], z_test / t_ref, rtol=3e-3)
        np.testing.assert_array_equal(calibrated["labels"], y_test)


def test_fit_smart_and_apply_report_before_after(capsys, npz_file, synthetic, tmp_path, saved_figures):
    out_dir = tmp_path / "smart"
    code, out, err = _run(
        capsys, "fit", "--logits", npz_file, "--method", "smart", "--objective", "nll", "--seed", "1", "--out", out_dir
    )
    assert code == 0, err
    assert "(nll)" in out
    config = json.loads((out_dir / "config.json").read_text())
    assert (
        config["calibrator"] == "smart" and config["fit"]["objective"] == "nll" and config["fit"]["num_samples"] == 300
    )
    code, out, err = _run(
        capsys, "apply", "--calibrator", out_dir, "--logits", npz_file, "--diagram", tmp_path / "after.png"
    )
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| uncalibrated") or line.startswith("| smart")]
    assert len(rows) == 2
    z_test, y_test = synthetic[0][300:], synthetic[1][300:]
    assert f"{100 * _reference_ece(z_test, y_test):.2f}" in rows[0]
    assert (tmp_path / "after.png").read_bytes()[:4] == b"\x89PNG"
    # issue 11, case 16: the diagram is the before / after pair, with the table's ECEs and all N samples counted
    ece_cells = [[c.strip() for c in row.strip("|").split("|")][2] for row in rows]
    before, after = _panels(saved_figures[-1])
    assert before[0] == "uncalibrated" and after[0] == "smart"
    assert [before[1], after[1]] == ece_cells
    assert before[2] == after[2] == 300 and sum(before[3]) == sum(after[3]) == 300


# ----------------------------------------------------------------------------- bad input


def _bad(tmp_path, synthetic, case):
    logits, labels = synthetic
    if case == "missing file":
        return ["report", "--logits", tmp_path / "nope.npz"], "no such file"
    if case == "wrong keys":
        np.savez(tmp_path / "k.npz", scores=logits, targets=labels)
        return ["report", "--logits", tmp_path / "k.npz"], "expected arrays `logits` and `labels`"
    if case == "mismatched shapes":
        np.savez(tmp_path / "m.npz", logits=logits, labels=labels[:-3])
        return ["report", "--logits", tmp_path / "m.npz"], "same number of samples"
    if case == "labels out of range":
        np.savez(tmp_path / "r.npz", logits=logits, labels=labels + 5)
        return ["report", "--logits", tmp_path / "r.npz"], "class indices in [0, 5)"
    if case == "float labels":
        np.savez(tmp_path / "f.npz", logits=logits, labels=labels.astype(np.float32))
        return ["report", "--logits", tmp_path / "f.npz"], "integer array"
    if case == "nan logits":
        bad = logits.copy()
        bad[3, 1] = np.nan
        np.savez(tmp_path / "n.npz", logits=bad, labels=labels)
        return ["report", "--logits", tmp_path / "n.npz"], "NaN"
    if case == "missing split":
        np.savez(tmp_path / "s.npz", logits_val=logits, labels_val=labels)
        return ["report", "--logits", tmp_path / "s.npz", "--split", "test"], "no split 'test'"
    if case == "npy without labels":
        np.save(tmp_path / "z.npy", logits)
        return ["report", "--logits", tmp_path / "z.npy"], "--labels"
    if case == "corrupted npz":
        (tmp_path / "c.npz").write_bytes(b"not a zip file at all")
        return ["report", "--logits", tmp_path / "c.npz"], "not a readable .npz"
    if case == "unknown suffix":
        (tmp_path / "t.csv").write_text("1,2\n")
        return ["report", "--logits", tmp_path / "t.csv"], "unknown logits file type"
    np.savez(tmp_path / "ok.npz", logits=logits, labels=labels)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    if case == "unwritable output dir":
        return ["fit", "--logits", tmp_path / "ok.npz", "--method", "ts", "--out", blocker / "sub"], "not writable"
    if case == "output dir is a file":
        return ["fit", "--logits", tmp_path / "ok.npz", "--method", "ts", "--out", blocker], "to be a folder, but"
    if case == "unwritable diagram":
        return ["report", "--logits", tmp_path / "ok.npz", "--diagram", blocker / "d.png"], "not a folder"
    if case == "bad method":
        return [
            "fit",
            "--logits",
            tmp_path / "ok.npz",
            "--method",
            "no_such_method",
            "--out",
            tmp_path / "o",
        ], "unknown --method 'no_such_method'"
    if case == "seed for ts":
        return [
            "fit",
            "--logits",
            tmp_path / "ok.npz",
            "--method",
            "ts",
            "--seed",
            "3",
            "--out",
            tmp_path / "o",
        ], "--seed applies"
    if case == "calibrator folder missing":
        return ["apply", "--calibrator", tmp_path / "none", "--logits", tmp_path / "ok.npz"], "no such folder"
    if case == "calibrator without config":
        (tmp_path / "empty").mkdir()
        return ["apply", "--calibrator", tmp_path / "empty", "--logits", tmp_path / "ok.npz"], "no config.json"
    if case == "too few samples for smart":
        np.savez(tmp_path / "few.npz", logits=logits[:20], labels=labels[:20])
        return ["fit", "--logits", tmp_path / "few.npz", "--method", "smart", "--out", tmp_path / "o"], "at least 50"
    if case == "bad demo setting":
        return ["demo", "--epochs", "0", "--output_dir", tmp_path / "demo"], "epochs"
    raise AssertionError(case)


BAD_CASES = [
    "missing file",
    "wrong keys",
    "mismatched shapes",
    "labels out of range",
    "float labels",
    "nan logits",
    "missing split",
    "npy without labels",
    "corrupted npz",
    "unknown suffix",
    "unwritable output dir",
    "output dir is a file",
    "unwritable diagram",
    "bad method",
    "seed for ts",
    "calibrator folder missing",
    "calibrator without config",
    "too few samples for smart",
    "bad demo setting",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_on_stderr(capsys, tmp_path, synthetic, case):
    argv, fragment = _bad(tmp_path, synthetic, case)
    code, out, err = _run(capsys, *argv)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"hf-calibration {argv[0]}: error: "), err
    assert fragment in err
    assert "Traceback" not in err


def test_corrupted_calibrator_checkpoint(capsys, npz_file, tmp_path):
    out_dir = tmp_path / "ts"
    assert _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", out_dir)[0] == 0
    (out_dir / "model.safetensors").write_bytes(b"\x00" * 16)
    code, out, err = _run(capsys, "apply", "--calibrator", out_dir, "--logits", npz_file)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err and "corrupted" in err


@pytest.mark.parametrize(
    "argv", [["report"], ["fit", "--logits", "x.npz"], ["bogus"], ["report", "--logits", "x", "--n-bins", "many"]]
)
def test_malformed_command_line_exits_2_with_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err


def test_console_script_process_has_no_traceback(tmp_path):
    """The installed entry point, as a user runs it: a missing file is one line on stderr and exit status 1."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hf_calibration.cli import main; sys.exit(main())",
            "report",
            "--logits",
            str(tmp_path / "x.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"hf-calibration report: error: {tmp_path / 'x.npz'}: no such file."]


# ----------------------------------------------------------------------------- published numbers


@pytest.mark.skipif(not RESNET50_CE.is_file(), reason="the shared logits folder (../shared) is absent")
def test_reproduces_published_resnet50_numbers(capsys, tmp_path):
    """Mukhoti et al. 2020, CIFAR-10 ResNet-50 cross-entropy: test ECE 4.35 %; after TS fitted by NLL on val, 1.37 %."""
    code, out, err = _run(capsys, "report", "--logits", RESNET50_CE, "--split", "test")
    assert code == 0, err
    assert re.search(r"^ECE \(%\)\s+4\.35$", out, re.M), out

    code, out, err = _run(capsys, "fit", "--logits", RESNET50_CE, "--method", "ts", "--out", tmp_path / "ts")
    assert code == 0, err
    assert float(re.search(r"T = ([0-9.]+)", out).group(1)) == pytest.approx(2.50, abs=0.01)
    code, out, err = _run(capsys, "apply", "--calibrator", tmp_path / "ts", "--logits", RESNET50_CE)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| temperature_scaling"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "95.05" and cells[2] == "1.37", row


def test_fit_push_to_hub_uploads_the_saved_calibrator(capsys, npz_file, tmp_path, monkeypatch):
    """`--push-to-hub` pushes what was fitted (HfApi intercepted: no network)."""
    import huggingface_hub

    calls = {}

    class FakeApi:
        def __init__(self, *args, **kwargs):
            pass

        def create_repo(self, repo_id, **kwargs):
            calls["create_repo"] = (repo_id, kwargs.get("private"))
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            calls["files"] = sorted(p.name for p in Path(folder_path).iterdir())
            calls["config"] = json.loads((Path(folder_path) / "config.json").read_text())
            return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(huggingface_hub.hub_mixin, "HfApi", FakeApi, raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    code, out, err = _run(
        capsys,
        "fit",
        "--logits",
        npz_file,
        "--method",
        "ts",
        "--out",
        tmp_path / "ts",
        "--push-to-hub",
        "someone/ts-calibrator",
        "--private",
    )
    assert code == 0, err
    assert calls["create_repo"] == ("someone/ts-calibrator", True)
    assert {"config.json", "model.safetensors", "README.md"} <= set(calls["files"])
    assert calls["config"]["calibrator"] == "temperature_scaling"
    assert "pushed to https://huggingface.co/someone/ts-calibrator" in out


# ----------------------------------------------------------------------------- outputs a user owns, strict JSON, probabilities


def _strict_json(text: str):
    """json.loads that refuses NaN / Infinity tokens (not JSON)."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_fit_validates_before_writing_anything(capsys, npz_file, tmp_path):
    out = tmp_path / "ts"
    with pytest.raises(SystemExit) as exit_info:  # used to fit, save, and only then fail on n_bins = 0 (exit 1)
        main(["fit", "--logits", str(npz_file), "--method", "ts", "--out", str(out), "--n-bins", "0"])
    assert exit_info.value.code == 2 and "--n_bins: expected an integer >= 1, got 0" in capsys.readouterr().err
    assert not out.exists()
    few = tmp_path / "few.npz"
    np.savez(few, logits=np.zeros((20, 3), np.float32), labels=np.zeros(20, np.int64))
    code, _, err = _run(capsys, "fit", "--logits", few, "--method", "smart", "--out", out)
    assert code == 1 and "at least 50" in err
    assert not out.exists()  # a failed fit used to leave an empty folder behind


def test_fit_never_writes_into_a_model_folder(capsys, npz_file, tmp_path):
    from _models import make_model

    model_dir = tmp_path / "vit"
    make_model("vit", num_labels=5).save_pretrained(model_dir)
    capsys.readouterr()  # transformers' own output while saving
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    for extra in ([], ["--overwrite"]):
        code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", model_dir, *extra)
        assert (
            code == 1
            and err.count("\n") == 1
            and "holds a model's files" in err
            and str(model_dir / "calibrator") in err
        )
    assert {
        p.name: p.read_bytes() for p in model_dir.iterdir()
    } == before  # config.json and model.safetensors used to be replaced
    code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", model_dir / "calibrator")
    assert code == 0, err


def test_refit_needs_overwrite_and_replaces_the_whole_calibrator(capsys, npz_file, tmp_path):
    out_dir = tmp_path / "cal"
    assert (
        _run(capsys, "fit", "--logits", npz_file, "--method", "smart", "--objective", "nll", "--out", out_dir)[0] == 0
    )
    code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", out_dir)
    assert code == 1 and "holds a calibrator; pass --overwrite" in err
    assert json.loads((out_dir / "config.json").read_text())["calibrator"] == "smart"
    code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", out_dir, "--overwrite")
    assert code == 0, err
    card = (out_dir / "README.md").read_text()
    assert "TemperatureScaling" in card and "SMART" not in card  # the old card used to stay
    assert json.loads((out_dir / "config.json").read_text())["calibrator"] == "temperature_scaling"


def test_apply_outputs_never_replace_inputs_or_existing_files(capsys, npz_file, tmp_path):
    cal = tmp_path / "ts"
    assert _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", cal)[0] == 0
    data = tmp_path / "data.npz"
    data.write_bytes(npz_file.read_bytes())
    original = data.read_bytes()
    for extra in ([], ["--overwrite"]):  # its own input: refused even with --overwrite (the val split would be lost)
        code, out, err = _run(capsys, "apply", "--calibrator", cal, "--logits", data, "--save-logits", data, *extra)
        assert code == 1 and "is one of this command's input files" in err
        code, out, err = _run(
            capsys, "apply", "--calibrator", cal, "--logits", data, "--save-logits", tmp_path / "data", *extra
        )
        assert code == 1 and "input files" in err  # `data` is written as data.npz: the same file
    assert data.read_bytes() == original
    taken = tmp_path / "taken.npz"
    taken.write_bytes(b"someone's file")
    code, out, err = _run(capsys, "apply", "--calibrator", cal, "--logits", data, "--save-logits", taken)
    assert code == 1 and "exists; pass --overwrite" in err and taken.read_bytes() == b"someone's file"
    code, out, err = _run(capsys, "apply", "--calibrator", cal, "--logits", data, "--save-logits", taken, "--overwrite")
    assert code == 0, err
    with np.load(taken) as saved:
        assert saved["logits"].shape == (300, 5)


def test_report_diagram_never_replaces_an_existing_file(capsys, npz_file, tmp_path):
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"someone's picture")
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", taken)
    assert code == 1 and "exists; pass --overwrite" in err and taken.read_bytes() == b"someone's picture"
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", npz_file, "--overwrite")
    assert code == 1 and "input files" in err  # its own input: refused even with --overwrite
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", taken, "--overwrite")
    assert code == 0, err
    assert taken.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_apply_prints_the_file_it_wrote(capsys, npz_file, tmp_path):
    cal = tmp_path / "ts"
    assert _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", cal)[0] == 0
    code, out, err = _run(
        capsys, "apply", "--calibrator", cal, "--logits", npz_file, "--save-logits", tmp_path / "cal_out"
    )
    assert code == 0, err
    assert f"calibrated logits: {tmp_path / 'cal_out.npz'}" in out  # printed `cal_out`, wrote `cal_out.npz`
    assert (tmp_path / "cal_out.npz").is_file() and not (tmp_path / "cal_out").exists()


def test_json_is_strict_when_a_metric_is_infinite(capsys, synthetic, tmp_path):
    logits, labels = synthetic
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    probs[0] = 0.0
    probs[0, (labels[0] + 1) % 5] = 1.0  # the true class gets probability 0: NLL = inf
    np.savez(tmp_path / "p.npz", logits_val=probs, labels_val=labels, logits_test=probs, labels_test=labels)
    cal = tmp_path / "ts"
    code, out, err = _run(capsys, "fit", "--logits", tmp_path / "p.npz", "--method", "ts", "--out", cal, "--json")
    assert code == 0, err
    fit = _strict_json(out)  # used to contain `Infinity`
    assert fit["inputs"] == "probabilities"
    assert fit["reports"]["uncalibrated"]["nll"] is None and fit["reports"]["uncalibrated"]["non_finite"] == {
        "nll": "inf"
    }
    code, out, err = _run(capsys, "apply", "--calibrator", cal, "--logits", tmp_path / "p.npz", "--json")
    assert code == 0, err
    applied = _strict_json(out)
    assert applied["reports"]["uncalibrated"]["non_finite"] == {"nll": "inf"}
    assert np.isfinite(applied["reports"]["temperature_scaling"]["nll"])  # log(0) is floored: finite after calibration
    assert "non_finite" not in applied["reports"]["temperature_scaling"]


def test_fit_and_apply_on_probabilities_match_logits(capsys, npz_file, synthetic, tmp_path):
    """A probabilities file is detected: the same temperature and the same reports as its logits (to print precision)."""
    logits, labels = synthetic
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    np.savez(
        tmp_path / "p.npz",
        logits_val=probs[:300],
        labels_val=labels[:300],
        logits_test=probs[300:],
        labels_test=labels[300:],
    )
    results = {}
    for name, source, extra in (
        ("logits", npz_file, []),
        ("probs", tmp_path / "p.npz", []),
        ("forced", tmp_path / "p.npz", ["--probs"]),
    ):
        code, out, err = _run(capsys, "fit", "--logits", source, "--method", "ts", "--out", tmp_path / name, *extra)
        assert code == 0, err
        results[name] = float(re.search(r"T = ([0-9.]+)", out).group(1))
        code, out, err = _run(capsys, "apply", "--calibrator", tmp_path / name, "--logits", source, "--json", *extra)
        assert code == 0, err
        results[name + " ece"] = json.loads(out)["reports"]["temperature_scaling"]["ece"]
    assert results["logits"] == results["probs"] == results["forced"]
    # the logits file is float32 (calibrated in float32), the probabilities float64: equal to float32 rounding
    assert results["logits ece"] == pytest.approx(results["probs ece"], abs=1e-6)
    assert results["probs ece"] == results["forced ece"]
    code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", tmp_path / "bad", "--probs")
    assert code == 1 and "probabilities in [0, 1]" in err


def test_apply_to_a_different_class_count_warns_once(capsys, npz_file, synthetic, tmp_path):
    cal = tmp_path / "ts"
    assert _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", cal)[0] == 0
    logits, labels = synthetic
    np.savez(tmp_path / "k6.npz", logits=np.concatenate([logits, logits[:, :1] - 1], axis=1), labels=labels)
    code, out, err = _run(capsys, "apply", "--calibrator", cal, "--logits", tmp_path / "k6.npz")
    assert code == 0
    assert err.count("fitted on K = 5") == 1, err


def test_push_offline_says_where_the_calibrator_is(capsys, npz_file, tmp_path):
    import os

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    out_dir = tmp_path / "ts"
    code, out, err = _run(
        capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", out_dir, "--push-to-hub", "me/ts"
    )
    assert code == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert (
        "the Hugging Face Hub is unreachable (offline mode is on: HF_HUB_OFFLINE=1)" in err
        and f"saved in {out_dir}." in err
    )
    assert {p.name for p in out_dir.iterdir()} == {"README.md", "config.json", "model.safetensors"}


def test_push_dry_run_builds_the_upload_folder(capsys, npz_file, tmp_path, monkeypatch):
    import huggingface_hub

    class NoNetwork:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a dry run must not create an HfApi client")

    monkeypatch.setattr(huggingface_hub, "HfApi", NoNetwork)
    import tempfile

    leftovers = set(Path(tempfile.gettempdir()).glob("hf_calibration_push_*"))
    code, out, err = _run(
        capsys,
        "fit",
        "--logits",
        npz_file,
        "--method",
        "ts",
        "--out",
        tmp_path / "ts",
        "--push-to-hub",
        "me/vit",
        "--path-in-repo",
        "calibrator",
        "--dry-run",
    )
    assert code == 0, err
    listed = re.search(r"https://huggingface.co/me/vit/tree/main/calibrator would receive (.*)", out).group(1)
    assert re.findall(r"([\w.]+) \([\d,]+ bytes\)", listed) == ["README.md", "config.json", "model.safetensors"]
    sizes = dict(re.findall(r"([\w.]+) \(([\d,]+) bytes\)", listed))
    assert int(sizes["model.safetensors"].replace(",", "")) == (tmp_path / "ts" / "model.safetensors").stat().st_size
    # issue 23 item 12: the temporary upload folder is not left behind
    assert set(Path(tempfile.gettempdir()).glob("hf_calibration_push_*")) == leftovers
    code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", tmp_path / "x", "--dry-run")
    assert code == 1 and "apply to --push-to-hub only" in err


# ----------------------------------------------------------------------------- issue 23: files, and checks before writing


def test_diagram_without_an_extension_is_the_png_matplotlib_writes(capsys, npz_file, tmp_path):
    # issue 23 item 6: the check looked at NAME while matplotlib wrote NAME.png, replacing it without --overwrite
    (tmp_path / "fig.png").write_bytes(b"the user's figure")
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", tmp_path / "fig")
    assert code == 1 and f"--diagram {tmp_path / 'fig.png'} exists; pass --overwrite" in err
    assert (tmp_path / "fig.png").read_bytes() == b"the user's figure" and not (tmp_path / "fig").exists()
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", tmp_path / "new")
    assert code == 0, err
    assert f"reliability diagram: {tmp_path / 'new.png'}" in out
    assert (tmp_path / "new.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "new").exists()
    code, out, err = _run(capsys, "report", "--logits", npz_file, "--diagram", tmp_path / "fig.v2")
    assert code == 1 and "matplotlib cannot write .v2 files; give one of" in err and ".pdf" in err


def test_push_arguments_are_checked_before_the_folder_is_written(capsys, npz_file, tmp_path):
    # issue 23 item 7: `fit --out DIR --push-to-hub "bad id!!" --dry-run` wrote DIR and then exited 1
    for extra, flag in (
        (["--push-to-hub", "bad id!!", "--dry-run"], "--push-to-hub"),
        (["--push-to-hub", "me/ts", "--path-in-repo", "/", "--dry-run"], "--path-in-repo"),
    ):
        code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", tmp_path / "cal", *extra)
        assert code == 1 and f"Expected {flag} to be" in err and err.count("\n") == 1, err
        assert not (tmp_path / "cal").exists()


def test_fit_out_beside_a_users_readme_keeps_it(capsys, npz_file, tmp_path):
    # issue 23 item 5, from the command line: `fit --out . --overwrite` in a folder with the user's README.md
    (tmp_path / "README.md").write_text("# my experiments\n")
    for _ in range(2):
        code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", tmp_path, "--overwrite")
        assert code == 0, err
        assert (tmp_path / "README.md").read_text() == "# my experiments\n"
        assert "the model card is written to README.hf_calibration.md instead" in err
        assert "TemperatureScaling calibrator" in (tmp_path / "README.hf_calibration.md").read_text()


def test_an_output_that_cannot_be_written_names_its_option(capsys, npz_file, tmp_path, monkeypatch):
    # issue 23 item 10: "[Errno 2] No such file or directory" without the option
    import hf_calibration.cli._common as common

    if Path("/proc/self").is_dir():  # a virtual file system: no folder can be made there, whatever the permissions say
        code, out, err = _run(capsys, "fit", "--logits", npz_file, "--method", "ts", "--out", "/proc/nope/cal")
        assert code == 1 and "--out /proc/nope/cal is not writable" in err, err

    def unwritable(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(common.tempfile, "mkdtemp", unwritable)  # what a read-only or virtual file system answers
    for argv, flag in (
        (["fit", "--method", "ts", "--out", tmp_path / "cal"], "--out"),
        (["report", "--diagram", tmp_path / "d.png"], "--diagram"),
    ):
        code, out, err = _run(capsys, argv[0], "--logits", npz_file, *argv[1:])
        assert code == 1 and f"{flag} {argv[-1]} is not writable (No such file or directory" in err, err
