"""Bad and tricky input to the command line: files, flags, the model + dataset route, users' files (one case a test; see
``tests/_bad_inputs.py``)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _bad_inputs import (
    Z32,
    Case,
    K,
    P,
    Y,
    Z,
    case_params,
    check,
    cli,
    cli_err,
    own_tempdir,
    ref_ece,
    ref_ts_temperature,
    refuse,
    saved_route,
    stderr_count,
    tiny_model_folder,
    tiny_pipeline,
    tiny_vit,
    unchanged,
)

from hf_calibration import metrics
from hf_calibration.calibrators import SMARTCalibrator, TemperatureScaling, load_calibrator


def _few(tmp: Path) -> Path:
    np.savez(tmp / "few.npz", logits=Z32[:20], labels=Y[:20])
    return tmp / "few.npz"


def output_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=50).fit(Z, Y, progress_bar=False)
    model = tiny_model_folder(tmp / "model")
    snapshot = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}

    def model_untouched():
        return {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()} == snapshot

    smart.save_pretrained(tmp / "cal_smart")
    card = (tmp / "cal_smart" / "README.md").read_bytes()
    (tmp / "data.npz").write_bytes(b"")
    np.savez(tmp / "data.npz", logits_val=Z32[:300], labels_val=Y[:300], logits_test=Z32[300:], labels_test=Y[300:])
    data_bytes = (tmp / "data.npz").read_bytes()
    (tmp / "mine.npz").write_bytes(b"the user's own file")

    def data_untouched():
        return (tmp / "data.npz").read_bytes() == data_bytes and (
            tmp / "mine.npz"
        ).read_bytes() == b"the user's own file"

    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(a model's folder)",
            lambda: ts.save_pretrained(model),
            ("save_directory", "calibrator"),
            untouched=model_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(a model's folder, overwrite=True)",
            lambda: ts.save_pretrained(model, overwrite=True),
            ("save_directory",),
            untouched=model_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(a SMART folder) without overwrite",
            lambda: ts.save_pretrained(tmp / "cal_smart"),
            ("save_directory", "overwrite"),
            untouched=lambda: (tmp / "cal_smart" / "README.md").read_bytes() == card,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(overwrite=True): the card is the new one",
            lambda: (
                ts.save_pretrained(tmp / "cal_smart", overwrite=True),
                "SMART" in (tmp / "cal_smart" / "README.md").read_text(),
            )[1],
            reference=lambda: False,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_logits(an existing file)",
            lambda: __import__("hf_calibration.io", fromlist=["save_logits"]).save_logits(tmp / "mine.npz", Z, Y),
            ("path", "mine.npz"),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "fit --out <model folder> --overwrite",
            lambda: cli("fit", "--logits", tmp / "data.npz", "--method", "ts", "--out", model, "--overwrite"),
            ("--out",),
            untouched=model_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "fit --out <calibrator folder>",
            lambda: cli("fit", "--logits", tmp / "data.npz", "--method", "ts", "--out", tmp / "cal_smart"),
            ("--out", "--overwrite"),
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits <its input>",
            lambda: cli(
                "apply",
                "--calibrator",
                tmp / "cal_smart",
                "--logits",
                tmp / "data.npz",
                "--save-logits",
                tmp / "data.npz",
                "--overwrite",
            ),
            ("--save-logits",),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits <its input, without .npz>",
            lambda: cli(
                "apply", "--calibrator", tmp / "cal_smart", "--logits", tmp / "data.npz", "--save-logits", tmp / "data"
            ),
            ("--save-logits",),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits <an existing file>",
            lambda: cli(
                "apply",
                "--calibrator",
                tmp / "cal_smart",
                "--logits",
                tmp / "data.npz",
                "--save-logits",
                tmp / "mine.npz",
            ),
            ("--save-logits", "--overwrite"),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --diagram <its input>",
            lambda: cli(
                "apply", "--calibrator", tmp / "cal_smart", "--logits", tmp / "data.npz", "--diagram", tmp / "data.npz"
            ),
            ("--diagram",),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "fit --n-bins 0 writes nothing",
            lambda: cli("fit", "--logits", tmp / "data.npz", "--method", "ts", "--out", tmp / "nb0", "--n-bins", "0"),
            ("--n-bins", "--n_bins"),
            untouched=lambda: not (tmp / "nb0").exists(),
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "failed fit leaves no --out folder",
            lambda: cli("fit", "--logits", _few(tmp), "--method", "smart", "--out", tmp / "few"),
            ("50", "samples"),
            untouched=lambda: not (tmp / "few").exists(),
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits cal_out prints the file written",
            lambda: (
                f"calibrated logits: {tmp / 'cal_out.npz'}"
                in cli(
                    "apply",
                    "--calibrator",
                    tmp / "cal_smart",
                    "--logits",
                    tmp / "data.npz",
                    "--save-logits",
                    tmp / "cal_out",
                )
            ),
            reference=lambda: True,
        )
    )
    return cases


def cli_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    np.savez(tmp / "split.npz", logits_val=Z[:300], labels_val=Y[:300], logits_test=Z[300:], labels_test=Y[300:])
    np.savez(tmp / "probs.npz", logits_val=P[:300], labels_val=Y[:300], logits_test=P[300:], labels_test=Y[300:])
    t_val = ref_ts_temperature(Z[:300], Y[:300])

    def fit_t(source, out, *extra):
        import re

        return float(
            re.search(
                r"T = ([0-9.]+)", cli("fit", "--logits", source, "--method", "ts", "--out", tmp / out, *extra)
            ).group(1)
        )

    def apply_json(source, cal, *extra):
        return json.loads(cli("apply", "--calibrator", tmp / cal, "--logits", source, "--json", *extra))

    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "fit --method ts (logits file): T",
            lambda: fit_t(tmp / "split.npz", "c_logits"),
            reference=lambda: t_val,
            atol=1e-4,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "fit --method ts (probabilities file): T",
            lambda: fit_t(tmp / "probs.npz", "c_probs"),
            ("--probs",),
            lambda: t_val,
            atol=1e-4,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "apply (probabilities file): uncalibrated ECE",
            lambda: apply_json(tmp / "probs.npz", "c_logits")["reports"]["uncalibrated"]["ece"],
            ("--probs",),
            lambda: ref_ece(P[300:], Y[300:]),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "fit --probs on a logits file",
            lambda: cli("fit", "--logits", tmp / "split.npz", "--method", "ts", "--out", tmp / "c_bad", "--probs"),
            ("probabilities", "logits"),
        )
    )
    p_zero = P.copy()
    p_zero[300] = np.eye(K)[(Y[300] + 1) % K]
    np.savez(tmp / "pzero.npz", logits=p_zero[300:], labels=Y[300:])
    add(
        Case(
            "extreme values",
            "CLI",
            "apply --json with an infinite NLL: strict JSON",
            lambda: json.loads(
                cli("apply", "--calibrator", tmp / "c_logits", "--logits", tmp / "pzero.npz", "--json"),
                parse_constant=refuse,
            )["reports"]["uncalibrated"]["non_finite"],
            reference=lambda: {"nll": "inf"},
        )
    )
    bad = Z.copy()
    bad[2, 2] = np.nan
    np.savez(tmp / "nan.npz", logits=bad, labels=Y)
    add(Case("NaN / inf", "CLI", "report (NaN logits)", lambda: cli("report", "--logits", tmp / "nan.npz"), ("NaN",)))
    add(
        Case(
            "NaN / inf",
            "CLI",
            "fit (NaN logits)",
            lambda: cli("fit", "--logits", tmp / "nan.npz", "--method", "ts", "--out", tmp / "c_nan"),
            ("NaN",),
        )
    )
    np.savez(tmp / "k6.npz", logits=np.c_[Z, Z[:, :1]], labels=Y)
    add(
        Case(
            "rank / shape",
            "CLI",
            "apply to K = 6 logits (fitted on 5): warns once, runs",
            lambda: stderr_count(
                lambda: cli("apply", "--calibrator", tmp / "c_logits", "--logits", tmp / "k6.npz"), "fitted on K = 5"
            ),
            reference=lambda: 1,
        )
    )
    np.savez(tmp / "mismatch.npz", logits=Z, labels=Y[:-1])
    add(
        Case(
            "rank / shape",
            "CLI",
            "report (N mismatch)",
            lambda: cli("report", "--logits", tmp / "mismatch.npz"),
            ("same number of samples",),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "report --n-bins many",
            lambda: cli("report", "--logits", tmp / "split.npz", "--n-bins", "many"),
            ("--n-bins", "--n_bins"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "apply --margin-groups 0",
            lambda: cli(
                "apply",
                "--calibrator",
                tmp / "c_logits",
                "--logits",
                tmp / "split.npz",
                "--diagram",
                tmp / "d.png",
                "--margin-groups",
                "0",
            ),
            ("--margin-groups", "--margin_groups"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "fit --method platt",
            lambda: cli("fit", "--logits", tmp / "split.npz", "--method", "platt", "--out", tmp / "c_p"),
            ("--method",),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "fit --seed with ts",
            lambda: cli("fit", "--logits", tmp / "split.npz", "--method", "ts", "--seed", "1", "--out", tmp / "c_s"),
            ("--seed",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "CLI",
            "apply --calibrator <missing folder>",
            lambda: cli("apply", "--calibrator", tmp / "none", "--logits", tmp / "split.npz"),
            ("--calibrator",),
        )
    )
    (tmp / "bad.npz").write_bytes(b"not a zip")
    add(
        Case(
            "corrupted / tampered checkpoints",
            "CLI",
            "report (corrupted .npz)",
            lambda: cli("report", "--logits", tmp / "bad.npz"),
            ("bad.npz",),
        )
    )
    add(
        Case(
            "Hub and attach",
            "CLI",
            "fit --push-to-hub offline",
            lambda: cli(
                "fit",
                "--logits",
                tmp / "split.npz",
                "--method",
                "ts",
                "--out",
                tmp / "c_push",
                "--push-to-hub",
                "me/ts",
            ),
            ("unreachable",),
            untouched=lambda: (tmp / "c_push" / "model.safetensors").is_file(),
        )
    )
    add(
        Case(
            "Hub and attach",
            "CLI",
            "fit --push-to-hub --dry-run: files listed",
            lambda: re.findall(
                r"([\w.]+) \([\d,]+ bytes\)",
                cli(
                    "fit",
                    "--logits",
                    tmp / "split.npz",
                    "--method",
                    "ts",
                    "--out",
                    tmp / "c_dry",
                    "--push-to-hub",
                    "me/ts",
                    "--dry-run",
                ),
            ),
            reference=lambda: ["README.md", "config.json", "model.safetensors"],
        )
    )
    return cases


def user_file_cases(tmp: Path) -> list[Case]:
    """Items 5, 6, 7 and item 12's dry runs and compare: only files the package wrote are replaced, checks come first."""

    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=50).fit(Z, Y, progress_bar=False)
    readme = b"# my project\n"

    def with_readme(name: str) -> Path:
        folder = tmp / name
        folder.mkdir()
        (folder / "README.md").write_bytes(readme)
        (folder / "notes.txt").write_bytes(b"mine")
        return folder

    def users_files_kept(folder: Path) -> Callable[[], bool]:
        return lambda: (folder / "README.md").read_bytes() == readme and (folder / "notes.txt").read_bytes() == b"mine"

    for first, second in ((ts, ts), (smart, ts), (ts, smart)):
        folder = with_readme(f"readme_{first.kind}_{second.kind}")

        def twice(folder=folder, first=first, second=second):
            first.save_pretrained(folder, overwrite=True)
            second.save_pretrained(folder, overwrite=True)
            card = (folder / "README.hf_calibration.md").read_text()
            return f"{type(second).__name__} calibrator" in card and load_calibrator(folder).kind == second.kind

        add(
            Case(
                "existing output files",
                "calibrators",
                f"{first.kind} then {second.kind} saved (overwrite) beside the user's README.md",
                twice,
                reference=lambda: True,
                untouched=users_files_kept(folder),
            )
        )
    edited = tmp / "edited_card"
    ts.save_pretrained(edited)
    (edited / "README.md").write_bytes(readme)  # the card, edited by hand: the user's now
    (edited / "notes.txt").write_bytes(b"mine")
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) over a card the user edited: kept",
            lambda: ts.save_pretrained(edited, overwrite=True) or (edited / "README.hf_calibration.md").is_file(),
            reference=lambda: True,
            untouched=users_files_kept(edited),
        )
    )
    foreign = tmp / "foreign_weights"
    ts.save_pretrained(foreign)
    (foreign / "model.safetensors").write_bytes(b"someone else's weights")
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) over weights that changed since: refused",
            lambda: ts.save_pretrained(foreign, overwrite=True),
            ("model.safetensors", "did not write"),
            untouched=unchanged(foreign),
        )
    )
    both = with_readme("both_cards")
    (both / "README.hf_calibration.md").write_bytes(b"also mine")
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) where both card names are the user's: refused",
            lambda: ts.save_pretrained(both, overwrite=True),
            ("README.md", "README.hf_calibration.md"),
            untouched=unchanged(both),
        )
    )
    legacy = tmp / "legacy"
    ts.save_pretrained(legacy)
    config = json.loads((legacy / "config.json").read_text())
    config.pop("files", None)  # a save from before the record
    (legacy / "config.json").write_text(json.dumps(config))
    card = (legacy / "README.md").read_bytes()
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) over a save without a file record: its README.md kept",
            lambda: ts.save_pretrained(legacy, overwrite=True) or load_calibrator(legacy).fitted_temperature,
            reference=lambda: ts.fitted_temperature,
            atol=0,
            untouched=lambda: (legacy / "README.md").read_bytes() == card,
        )
    )
    np.savez(tmp / "split.npz", logits_val=Z32[:300], labels_val=Y[:300], logits_test=Z32[300:], labels_test=Y[300:])
    for command in ("fit", "fit again"):
        folder = tmp / "cli_readme" if command == "fit again" else with_readme("cli_readme")
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command} --out <folder with the user's README.md> --overwrite",
                lambda folder=folder: (
                    "README.hf_calibration.md instead"
                    in cli_err("fit", "--logits", tmp / "split.npz", "--method", "ts", "--out", folder, "--overwrite")[
                        1
                    ]
                ),
                reference=lambda: True,
                untouched=users_files_kept(folder),
            )
        )

    # --diagram NAME without an extension: NAME.png, as matplotlib writes it
    figures = tmp / "figures"
    figures.mkdir()
    (figures / "fig.png").write_bytes(b"the user's figure")
    ts.save_pretrained(tmp / "ts_cal")
    for command in (["report"], ["apply", "--calibrator", tmp / "ts_cal"]):
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command[0]} --diagram fig (fig.png exists)",
                lambda command=command: cli(
                    command[0], *command[1:], "--logits", tmp / "split.npz", "--diagram", figures / "fig"
                ),
                ("--diagram", "fig.png", "--overwrite"),
                untouched=lambda: (
                    (figures / "fig.png").read_bytes() == b"the user's figure" and not (figures / "fig").exists()
                ),
            )
        )
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command[0]} --diagram new: prints new.png, writes new.png",
                lambda command=command: (
                    f"reliability diagram: {figures / (command[0] + '_new.png')}"
                    in cli(
                        command[0],
                        *command[1:],
                        "--logits",
                        tmp / "split.npz",
                        "--diagram",
                        figures / (command[0] + "_new"),
                    ),
                    (figures / (command[0] + "_new.png")).is_file(),
                    (figures / (command[0] + "_new")).exists(),
                ),
                reference=lambda: (True, True, False),
            )
        )
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command[0]} --diagram fig.v2 (no such format)",
                lambda command=command: cli(
                    command[0], *command[1:], "--logits", tmp / "split.npz", "--diagram", figures / "fig.v2"
                ),
                ("--diagram", ".v2"),
            )
        )

    # every argument is checked before anything is written; model folders refused everywhere
    model = tiny_model_folder(tmp / "model")
    for push, flag in (
        (["--push-to-hub", "bad id!!", "--dry-run"], "--push-to-hub"),
        (["--push-to-hub", "a/b/c"], "--push-to-hub"),
        (["--push-to-hub", "me/ts", "--path-in-repo", "/", "--dry-run"], "--path-in-repo"),
    ):
        out = tmp / f"never_{len(cases)}"
        add(
            Case(
                "existing output files",
                "CLI",
                f"fit --out DIR {' '.join(push)}: nothing written",
                lambda push=push, out=out: cli(
                    "fit", "--logits", tmp / "split.npz", "--method", "ts", "--out", out, *push
                ),
                (flag,),
                untouched=lambda out=out: not out.exists(),
            )
        )
    add(
        Case(
            "existing output files",
            "CLI",
            "compare --out <a model's folder>",
            lambda: cli("compare", "--logits", tmp / "split.npz", "--methods", "ts", "--cv", "3", "--out", model),
            ("--out", "model's folder"),
            untouched=unchanged(model),
        )
    )
    cwd = tmp / "compare_cwd"
    cwd.mkdir()

    def compare_in(folder: Path):
        here = os.getcwd()
        os.chdir(folder)
        try:
            return "best by ece" in cli("compare", "--logits", tmp / "split.npz", "--methods", "ts", "--cv", "3")
        finally:
            os.chdir(here)

    add(
        Case(
            "existing output files",
            "CLI",
            "compare without --out writes nothing",
            lambda: compare_in(cwd),
            reference=lambda: True,
            untouched=lambda: list(cwd.iterdir()) == [],
        )
    )

    def dry_run_leftovers():
        with own_tempdir(tmp / "tempdir") as scratch:
            cli(
                "fit",
                "--logits",
                tmp / "split.npz",
                "--method",
                "ts",
                "--out",
                tmp / "dry",
                "--push-to-hub",
                "me/ts",
                "--dry-run",
            )
        return sorted(p.name for p in scratch.iterdir())

    add(
        Case(
            "existing output files",
            "CLI",
            "fit --push-to-hub --dry-run: no temporary folder left",
            dry_run_leftovers,
            reference=lambda: [],
        )
    )
    return cases


def model_route_cases(tmp: Path) -> list[Case]:
    """Items 10, 11 and 7 (shift --out): the model + dataset route names the flag and the cause."""
    cases: list[Case] = []
    add = cases.append
    model, data = saved_route(tmp)
    route = ["--model", model, "--dataset", data, "--split", "test", "--no-cache", "--batch-size", "8"]
    for argv, names in (
        (["--model", "./nomodel", "--dataset", data, "--split", "test"], ("--model", "./nomodel")),
        (["--model", model, "--dataset", "./nodata"], ("--dataset", "./nodata")),
        (["--model", "no/such/model", "--dataset", data], ("--model",)),
        ([*route, "--image-column", "label"], ("--image-column", "label")),
        (["--model", model, "--dataset", tmp / "nolabels", "--no-cache"], ("--dataset", "no labels")),
        ([*route, "--device", "tpu"], ("--device", "tpu")),
        ([*route, "--device", "cuda:7"], ("--device",)),
        ([*route, "--split", "train"], ("--split", "train")),
        ([*route, "--label-column", "img"], ("--label-column", "img")),
    ):
        add(
            Case(
                "model + dataset route",
                "CLI",
                f"report {' '.join(str(a) for a in argv if str(a).startswith('-') or str(a).startswith('./') or a in ('tpu', 'cuda:7', 'label', 'train', 'img', 'no/such/model'))}",
                lambda argv=argv: cli("report", *argv),
                names,
            )
        )
    unwritable = Path("/proc/nope") if Path("/proc/self").is_dir() else None
    if unwritable is not None:
        for command, names in (
            (["fit", *route, "--method", "ts", "--out", unwritable / "cal"], ("--out",)),
            (["report", *route, "--diagram", unwritable / "d.png"], ("--diagram",)),
            (
                [
                    "apply",
                    "--calibrator",
                    tmp / "ts_route",
                    "--logits",
                    tmp / "route.npz",
                    "--save-logits",
                    unwritable / "c.npz",
                ],
                ("--save-logits",),
            ),
        ):
            if command[0] == "apply" and not (tmp / "ts_route").exists():
                TemperatureScaling().fit(Z, Y, progress_bar=False).save_pretrained(tmp / "ts_route")
                np.savez(tmp / "route.npz", logits=Z32, labels=Y)
            add(
                Case(
                    "model + dataset route",
                    "CLI",
                    f"{command[0]} {names[0]} <not writable>",
                    lambda command=command: cli(*command),
                    names,
                )
            )
    # shift --calibrator: the spelling decides; duplicates and unknown names are refused before the model runs
    work = tmp / "shift_cwd"
    work.mkdir()
    TemperatureScaling().fit(Z, Y, progress_bar=False).save_pretrained(work / "smart")  # a folder named like a method

    def shift(*argv):
        here = os.getcwd()
        os.chdir(work)
        try:
            out, _ = cli_err("shift", *route, "--corruptions", "contrast", "--severities", "1", "--json", *argv)
            return json.loads(out)  # cli_err: a warning line (a folder named like the method) may come first
        finally:
            os.chdir(here)

    # the spelling decides (a path is a folder, a bare name the method), and a bare name beside a folder of that name
    # says which it took: tests/shift/test_cli_shift.py (checked there before the model runs)
    for calibrators, names in (
        (["ts", "temperature_scaling"], ("--calibrator", "same method")),
        (["smart", "SMART"], ("--calibrator", "same method")),
        (["platt"], ("--calibrator", "platt")),
        (["./nothing"], ("--calibrator", "./nothing")),
        (["./smart", str(work / "smart")], ("--calibrator", "same folder")),
    ):
        add(
            Case(
                "model + dataset route",
                "CLI",
                f"shift --calibrator {' '.join(calibrators)}",
                lambda calibrators=calibrators: shift("--calibrator", *calibrators),
                names,
            )
        )
    # --val-split test --split test warns: tests/shift/test_cli_shift.py
    add(
        Case(
            "existing output files",
            "CLI",
            "shift --out <a model's folder>",
            lambda: shift("--out", model),
            ("--out", "model's folder"),
            untouched=unchanged(model),
        )
    )
    return cases


def friction_cases(tmp: Path) -> list[Case]:
    """Items 9, 11, 13, 14 and 15: the JSON report, merge, calibrated=, the compare table, exports, notices, options."""
    import types

    from hf_calibration.calibrators import compare_calibrators
    from hf_calibration.metrics import CalibrationAccumulator

    cases: list[Case] = []
    add = cases.append

    # item 8
    def trainer_with(labels):
        import datasets
        from transformers import TrainingArguments

        from hf_calibration.training import CalibrationTrainer

        table = datasets.Dataset.from_dict(
            {"pixel_values": np.zeros((len(labels), 3, 8, 8), np.float32).tolist(), "labels": labels}
        )
        args = TrainingArguments(
            output_dir=str(tmp / "trainer"), report_to=[], use_cpu=True, save_strategy="no", max_steps=1
        )
        return CalibrationTrainer(
            model=tiny_vit(), args=args, train_dataset=table, eval_dataset=table, calibrate_on_eval=True
        )

    add(
        Case(
            "labels",
            "CLI",
            "CalibrationTrainer(calibrate_on_eval): 60 eval rows, 55 labelled -100 (before training)",
            lambda: trainer_with([0, 1, 2, 3, 4] + [-100] * 55),
            ("labelled",),
        )
    )
    # item 9
    p = P.copy()
    p[0] = 0.0
    p[0, (Y[0] + 1) % K] = 1.0  # the true class at probability 0: NLL inf
    np.savez(tmp / "inf.npz", logits=p, labels=Y)

    def json_inf():
        data = json.loads(
            cli("report", "--logits", tmp / "inf.npz", "--probs", "--json", "--ci", "0.9", "--n-boot", "50")
        )
        return data["nll"], data["intervals"]["nll"]["high"], data["non_finite"]["nll.high"]

    add(
        Case(
            "extreme values",
            "CLI",
            "report --json --ci with an infinite NLL: null ends, listed in non_finite",
            json_inf,
            reference=lambda: (None, None, "inf"),
        )
    )
    # item 11
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "CalibrationAccumulator(ci=0.9).merge(no interval): names ci / n_boot / seed",
            lambda: CalibrationAccumulator(ci=0.9, n_boot=50).merge(CalibrationAccumulator(confidence_dtype="float64")),
            ("ci=",),
        )
    )
    for shape in ((len(Y), K - 1), (len(Y), K + 1)):
        add(
            Case(
                "rank / shape",
                "metrics",
                f"reliability_diagram(calibrated=<{shape}>) for (N, {K}) preds",
                lambda shape=shape: metrics.reliability_diagram(Z, Y, calibrated=np.zeros(shape)),
                ("calibrated",),
            )
        )
    # item 13
    table = compare_calibrators(
        Z, Y, ["temperature_scaling", "isotonic"], cv=3, keep_predictions=True, progress_bar=False
    )
    add(
        Case(
            "hyper-parameters",
            "calibrators",
            "print(compare table): the rule and the pick",
            lambda: f"lowest ece: {table.best()}" in str(table),
            reference=lambda: True,
        )
    )

    def wins_agree():
        paired = table.paired_bootstrap("ece", n_boot=200)
        return all(paired.wins[m] <= 0.5 for m in paired.pooled if float(paired.difference[m]) > 0)

    add(
        Case(
            "hyper-parameters",
            "calibrators",
            "paired bootstrap: a worse pooled Δ never 'beats' the best in most resamples",
            wins_agree,
            reference=lambda: True,
        )
    )
    # item 14: the names the README imports are the public face's, checked by tests/test_package.py

    def identity_notice():
        from hf_calibration.calibrators.selection.auto import identity_calibrator
        from hf_calibration.conformal import ConformalPredictor

        pipe, _ = tiny_pipeline()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            identity_calibrator(Z, Y, None, "nothing helped", who="test").attach(pipe.model)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        log = logging.getLogger("hf_calibration")
        log.addHandler(handler)
        level = log.level
        log.setLevel(logging.WARNING)
        try:
            ConformalPredictor("thr").fit(Z, Y).attach(pipe)
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
        return [r.getMessage() for r in records if "calibrator is attached" in r.getMessage()]

    add(
        Case(
            "Hub and attach",
            "conformal",
            "conformal attach beside an identity calibrator (T = 1): no 'calibrator is attached' notice",
            identity_notice,
            reference=lambda: [],
        )
    )
    loader = types.SimpleNamespace(
        batch_sampler=types.SimpleNamespace(even_batches=True),
        total_batch_size=100,
        end_of_dataloader=True,
        remainder=97,
    )

    class GradientState:
        _shared_state = {"ready": True}
        in_dataloader, active_dataloader, end_of_dataloader, remainder = True, loader, True, 97

    class PartialState:
        num_processes, process_index = 2, 0

    def slices_on_rank0():
        saved = sys.modules.get("accelerate.state")
        sys.modules["accelerate.state"] = types.SimpleNamespace(GradientState=GradientState, PartialState=PartialState)
        try:
            acc = CalibrationAccumulator(confidence_dtype="float64")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for i in range(0, 50, 20):
                    acc.update(Z[i : min(i + 20, 50)], Y[i : min(i + 20, 50)])
            warned = any(
                "counted twice" in str(w.message) for w in caught
            )  # the false positive, not any warning
            return np.array([float(warned), acc.compute().ece])
        finally:
            if saved is None:
                sys.modules.pop("accelerate.state", None)
            else:
                sys.modules["accelerate.state"] = saved

    add(
        Case(
            "processes",
            "metrics",
            "even_batches: rank 0's last batch (no repeats) fed in 3 slices: no warning, all rows",
            slices_on_rank0,
            reference=lambda: np.array([0.0, ref_ece(P[:50], Y[:50])]),
        )
    )
    # item 15
    np.savez(tmp / "z.npz", logits=Z, labels=Y)
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "report --n-boot 100 without --ci",
            lambda: cli("report", "--logits", tmp / "z.npz", "--n-boot", "100"),
            ("n_boot", "--n-boot"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "ece(ci=0.95, seed=2**64)",
            lambda: metrics.ece(Z, Y, ci=0.95, seed=2**64),
            ("seed",),
        )
    )
    add(
        Case(
            "dtype",
            "metrics",
            "ece(ci=np.float32(0.95)).level",
            lambda: metrics.ece(Z, Y, ci=np.float32(0.95), n_boot=20).level,
            reference=lambda: 0.95,
            atol=0,
        )
    )
    spaces = tmp / "spaces"
    cli(
        "push-metrics",
        "--namespace",
        "org",
        "--dry-run",
        "--out",
        spaces,
        "--requirement",
        "hf-calibration==0.1.0",
        "--metrics",
        "ece",
    )
    card = spaces / "ece" / "README.md"
    card.write_text(card.read_text() + "\nmy notes\n")
    add(
        Case(
            "existing output files",
            "CLI",
            "push-metrics --dry-run --overwrite over a README edited after the first dry run",
            lambda: cli(
                "push-metrics",
                "--namespace",
                "org",
                "--dry-run",
                "--out",
                spaces,
                "--requirement",
                "hf-calibration==0.1.0",
                "--metrics",
                "ece",
                "--overwrite",
            ),
            ("README.md",),
            untouched=unchanged(spaces),
        )
    )
    return cases


# the demo with stderr not a terminal writes no progress-bar frames: tests/test_demo.py (a log that is not a terminal)
@pytest.mark.parametrize(
    "case", case_params(output_cases, cli_cases, user_file_cases, model_route_cases, friction_cases)
)
def test_bad_input(case: Case) -> None:
    check(case)
