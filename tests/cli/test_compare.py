"""`hf-calibration compare` and `fit --method auto`: the printed table is compare_calibrators', files, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_calibration.calibrators import compare_calibrators, load_calibrator
from hf_calibration.cli import main


@pytest.fixture(scope="module")
def npz_file(tmp_path_factory):
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 5, 500)
    logits = (3.0 * (2.0 * rng.standard_normal((500, 5)) + 2.5 * np.eye(5)[labels])).astype(np.float32)
    path = tmp_path_factory.mktemp("logits") / "split.npz"
    np.savez(path, logits_val=logits[:400], labels_val=labels[:400], logits_test=logits[400:], labels_test=labels[400:])
    return path, logits[:400], labels[:400]


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--logits",
        "--split",
        "--methods",
        "--cv",
        "--metric",
        "--fit-seeds",
        "--no-race",
        "--out",
        "--overwrite",
        "--json",
    ):
        assert option in out


def test_json_table_is_the_library_table_and_diagrams_are_written(capsys, npz_file, tmp_path):
    path, z, y = npz_file
    out_dir = tmp_path / "cmp"
    code, out, err = _run(
        capsys, "compare", "--logits", path, "--methods", "ts,isotonic,spline", "--cv", "3", "--json", "--out", out_dir
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["source"] == "split.npz[val]"  # the calibration split only
    table = compare_calibrators(z, y, ["temperature_scaling", "isotonic", "spline"], cv=3, progress_bar=False)
    for method in ("uncalibrated", "temperature_scaling", "isotonic", "spline"):
        for metric in ("ece", "adaece", "smce", "nll", "brier", "accuracy_change"):
            assert report["table"][method][metric]["mean"] == pytest.approx(table[method].mean(metric), abs=1e-12)
    assert report["best"] == table.best("ece")
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "reliability_isotonic.png",
        "reliability_spline.png",
        "reliability_temperature_scaling.png",
        "reliability_uncalibrated.png",
    ]
    # the diagrams are not replaced without --overwrite
    code, _, err = _run(capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "3", "--out", out_dir)
    assert code == 1 and "--overwrite" in err
    code, out, err = _run(
        capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "3", "--out", out_dir, "--overwrite"
    )
    assert code == 0, err
    assert (
        "| temperature_scaling" in out
        and "best by ece, the lowest NLL within one standard error of the lowest ece: temperature_scaling" in out
    )


def test_bad_method_and_cv(capsys, npz_file, tmp_path):
    path, _, _ = npz_file
    code, _, err = _run(capsys, "compare", "--logits", path, "--methods", "no_such_method", "--out", tmp_path)
    assert code == 1 and "unknown --method 'no_such_method'" in err
    code, _, err = _run(capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "1", "--out", tmp_path)
    assert code == 1 and "`cv`" in err


def test_fit_method_auto(capsys, npz_file, tmp_path):
    path, z, y = npz_file
    out_dir = tmp_path / "auto"
    code, out, err = _run(
        capsys,
        "fit",
        "--logits",
        path,
        "--method",
        "auto",
        "--cv",
        "2",
        "--fit-seeds",
        "1",
        "--metric",
        "nll",
        "--out",
        out_dir,
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    selection = report["selection"]
    uncalibrated = selection["table"]["uncalibrated"]["nll"]["mean"]
    candidates = {
        m: v["nll"]["mean"]
        for m, v in selection["table"].items()
        if m != "uncalibrated"
        and not v["errors"]
        and v["folds_run"] == 2
        and v["accuracy_change"]["mean"] >= 0
        and v["nll"]["mean"] <= uncalibrated
    }
    assert report["method"] == selection["chosen"] == min(candidates, key=candidates.get)
    calibrator = load_calibrator(out_dir)
    assert calibrator.kind == report["method"] and calibrator.fit_info_["selection"]["metric"] == "nll"
    code, _, err = _run(
        capsys, "fit", "--logits", path, "--method", "auto", "--objective", "nll", "--out", tmp_path / "x"
    )
    assert code == 1 and "--objective" in err
    code, _, err = _run(capsys, "fit", "--logits", path, "--method", "isotonic", "--seed", "3", "--out", tmp_path / "y")
    assert code == 1 and "--seed" in err


def test_fit_method_auto_chooses_among_the_given_methods(capsys, npz_file, tmp_path):
    path, z, y = npz_file
    code, out, err = _run(
        capsys,
        "fit",
        "--logits",
        path,
        "--method",
        "auto",
        "--methods",
        "ts,spline,histogram_binning",
        "--cv",
        "3",
        "--metric",
        "smce",
        "--out",
        tmp_path / "auto",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    table = compare_calibrators(
        z, y, ["temperature_scaling", "spline", "histogram_binning"], cv=3, metric="smce", progress_bar=False
    )
    assert sorted(report["selection"]["table"]) == [
        "histogram_binning",
        "spline",
        "temperature_scaling",
        "uncalibrated",
    ]
    assert report["method"] == table.best("smce")
    code, _, err = _run(
        capsys, "fit", "--logits", path, "--method", "auto", "--methods", "no_such_method", "--out", tmp_path / "x"
    )
    assert code == 1 and "unknown --method 'no_such_method'" in err and not (tmp_path / "x").exists()


def test_out_is_written_only_when_asked_and_never_into_a_model_folder(capsys, npz_file, tmp_path, monkeypatch):
    # issue 23 item 12: compare wrote ./calibrator_comparison without being asked; item 7: --out took a model's folder
    from _models import make_model

    path, _, _ = npz_file
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "3")
    assert code == 0, err
    assert list(tmp_path.iterdir()) == [] and "reliability diagrams" not in out
    make_model("vit").save_pretrained(tmp_path / "model")
    before = sorted(p.name for p in (tmp_path / "model").iterdir())
    code, out, err = _run(
        capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "3", "--out", tmp_path / "model"
    )
    assert code == 1 and "--out" in err and "is a model's folder (config.json, model.safetensors)" in err
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == before


def test_diagrams_say_they_pool_the_folds_and_the_table_averages_them(capsys, npz_file, tmp_path, monkeypatch):
    """The diagram's ECE is that of all held-out predictions pooled; the table's is the mean over folds. The
    diagram's title says so and gives the table's number beside it."""
    import hf_calibration.cli.compare as compare

    path, z, y = npz_file
    titles = {}
    monkeypatch.setattr(
        compare, "save_diagram", lambda logits, labels, out, n_bins, title, **kw: titles.update({out.name: title})
    )
    code, out, err = _run(capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "3", "--out", tmp_path / "d")
    assert code == 0, err
    table = compare_calibrators(z, y, ["temperature_scaling"], cv=3, progress_bar=False)
    for method in ("uncalibrated", "temperature_scaling"):
        title = titles[f"reliability_{method}.png"]
        assert "pooled" in title and method in title
        assert f"{100 * table[method].mean('ece'):.2f} ± {100 * table[method].std('ece'):.2f} %" in title
    assert "pooled" in out and "mean over folds" in out


def test_paired_bootstrap_against_the_best(capsys, npz_file, tmp_path):
    path, z, y = npz_file
    code, out, err = _run(
        capsys,
        "compare",
        "--logits",
        path,
        "--methods",
        "ts,isotonic",
        "--cv",
        "3",
        "--json",
        "--out",
        tmp_path / "p",
        "--n-boot",
        "200",
    )
    assert code == 0, err
    report = json.loads(out)
    table = compare_calibrators(
        z, y, ["temperature_scaling", "isotonic"], cv=3, keep_predictions=True, progress_bar=False
    )
    expected = table.paired_bootstrap("ece", n_boot=200)
    assert report["paired"]["best"] == report["best"] == expected.best
    for method, entry in report["paired"]["methods"].items():
        assert entry["difference"]["low"] == pytest.approx(expected.difference[method].low, abs=1e-12)
        assert entry["wins"] == pytest.approx(expected.wins[method])
    code, out, err = _run(capsys, "compare", "--logits", path, "--methods", "ts", "--cv", "3", "--out", tmp_path / "q")
    assert code == 0 and "Paired bootstrap against the best by ece" in out and "beats" in out
    code, out, err = _run(
        capsys,
        "compare",
        "--logits",
        path,
        "--methods",
        "ts",
        "--cv",
        "3",
        "--out",
        tmp_path / "q",
        "--overwrite",
        "--ci",
        "0",
    )
    assert code == 0 and "Paired bootstrap" not in out  # --ci 0 leaves it out
    # a bad level is refused before anything is written
    code, _, err = _run(capsys, "compare", "--logits", path, "--methods", "ts", "--out", tmp_path / "r", "--ci", "95")
    assert code == 1 and "--ci" in err and not (tmp_path / "r").exists()


def test_default_candidates_racing_and_the_nll_column(capsys, npz_file, tmp_path):
    from hf_calibration.calibrators.selection.auto import DEFAULT_METHODS

    path, z, y = npz_file
    code, out, err = _run(capsys, "compare", "--logits", path, "--cv", "3", "--metric", "smce", "--out", tmp_path / "a")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("| method"))
    assert [c.strip() for c in header.strip("|").split("|")][:3] == ["method", "smCE (%)", "NLL"]
    table_lines = (
        out[out.index(header) :].split("\n\n")[0].splitlines()
    )  # the comparison table, not the paired one after it
    rows = [
        line.split("|")[1].strip() for line in table_lines if line.startswith("| ") and not line.startswith("| method")
    ]
    assert rows == ["uncalibrated", *DEFAULT_METHODS]
    code, out, err = _run(
        capsys,
        "compare",
        "--logits",
        path,
        "--methods",
        "ts,histogram_binning",
        "--cv",
        "3",
        "--no-race",
        "--json",
        "--out",
        tmp_path / "b",
    )
    assert code == 0, err
    table = json.loads(out)["table"]
    assert all(entry["folds_run"] == 3 and entry["stopped"] is None for entry in table.values())


def test_print_table_shows_the_rule_and_the_pick(npz_file):
    """Item 13: ``print(table)`` omitted the rule and the pick the CLI printed; the text now ends with both, and says
    that the fold means rank while pooled values differ."""
    _, z, y = npz_file
    table = compare_calibrators(z, y, ["temperature_scaling", "isotonic"], cv=3, progress_bar=False)
    text = str(table)
    assert f"best by ece, the lowest NLL within one standard error of the lowest ece: {table.best()}" in text
    assert "the columns are means over the folds, which rank the methods" in text
