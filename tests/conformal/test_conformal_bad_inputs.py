"""Bad and tricky input to the conformal predictors: probabilities vs logits, tampered folders, ties (one case a test;
see ``tests/_bad_inputs.py``)."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from _bad_inputs import (
    Case,
    K,
    case_params,
    check,
    cli,
    make_data,
    own_tempdir,
    softmax,
    tiny_pipeline,
)

from hf_calibration.calibrators import TemperatureScaling


def conformal_cases(tmp: Path) -> list[Case]:
    """Items 3, 4, 5, 6, 11 and 12: conformal prediction sets."""
    from hf_calibration.conformal import ConformalPredictor

    cases: list[Case] = []
    add = cases.append
    rng = np.random.default_rng(3)
    y2 = rng.integers(0, 2, 400)
    z2 = (3 * rng.normal(size=(400, 2)) + 4 * np.eye(2)[y2]).astype(np.float32)
    thr = ConformalPredictor("thr", allow_empty=True).fit(z2, y2, alpha=0.1)
    thr.q_hat.fill_(0.509)  # between the two readings of the row: as logits {0, 1}, as probabilities {0}
    row = np.array([[0.5078, 0.4828]], dtype=np.float32)
    add(
        Case(
            "probabilities vs logits",
            "conformal",
            "predict_sets([[0.5078, 0.4828]]) alone, fitted on logits: the logits' set",
            lambda: thr.predict_sets(row)[0].tolist(),
            reference=lambda: (softmax(row)[0] >= 1 - float(thr.q_hat)).tolist(),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "conformal",
            "predict_sets: the same row alone and in a batch of 6",
            lambda: thr.predict_sets(row)[0].tolist() == thr.predict_sets(np.vstack([row, z2[:5]]))[0].tolist(),
            reference=lambda: True,
        )
    )
    add(
        Case(
            "rank / shape",
            "conformal",
            "predict_sets(nested list), as fit takes: the array's sets",
            lambda: thr.predict_sets(z2[:5].tolist()).tolist(),
            reference=lambda: (softmax(z2[:5]) >= 1 - float(thr.q_hat)).tolist(),
        )
    )
    # item 4: a tampered conformal/config.json
    zc, yc = make_data(1200, 10, seed=2)
    ConformalPredictor("aps", seed=1).fit(zc, yc, calibrator=TemperatureScaling()).save_pretrained(tmp / "cp")
    for label, edit in (
        ("fit.alpha 0.1 -> 0.2", lambda c: c["fit"].__setitem__("alpha", 0.2)),
        ("fit.q_hat edited", lambda c: c["fit"].__setitem__("q_hat", 0.5)),
        ("randomized: false", lambda c: c.__setitem__("randomized", False)),
        ("calibrator: null (calibrator/ kept)", lambda c: c["fit"].__setitem__("calibrator", None)),
        ("fit.coverage edited (shown in the card)", lambda c: c["fit"].__setitem__("coverage", 0.99)),
    ):
        folder = tmp / f"cp_{len(cases)}"
        shutil.copytree(tmp / "cp", folder)
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
        add(
            Case(
                "corrupted / tampered checkpoints",
                "conformal",
                f"ConformalPredictor.from_pretrained: config.json {label}",
                lambda folder=folder: ConformalPredictor.from_pretrained(folder),
                ("does not match its weights",),
            )
        )
    folder = tmp / "cp_nocal"
    shutil.copytree(tmp / "cp", folder)
    shutil.rmtree(folder / "calibrator")
    add(
        Case(
            "corrupted / tampered checkpoints",
            "conformal",
            "ConformalPredictor.from_pretrained: calibrator/ deleted",
            lambda: ConformalPredictor.from_pretrained(folder),
            ("folder is missing", "calibrator"),
        )
    )
    junk = tmp / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("x")
    add(
        Case(
            "corrupted / tampered checkpoints",
            "conformal",
            "ConformalPredictor.from_pretrained(a folder of junk)",
            lambda: ConformalPredictor.from_pretrained(junk),
            ("conformal predictor checkpoint",),
        )
    )
    # item 5: ties at cumulative mass 1
    yw = rng.integers(0, 2, 1000)
    zw = (rng.normal(size=(1000, 2)) + np.eye(2)[yw]).astype(np.float32)

    def ties():
        from hf_calibration.conformal.card import card_values

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            predictor = ConformalPredictor("aps", randomized=False, allow_empty=True).fit(zw, yw, alpha=0.1)
        return predictor.fit_info_["ties_at_threshold"], "does not hold here" in card_values(predictor)["guarantee"]

    def ties_by_hand():
        pw = softmax(zw)
        scores = np.where(pw.argmax(1) == yw, pw.max(1), 1.0)
        q = np.sort(scores)[math.ceil(1001 * 0.9) - 1]
        return int((scores == q).sum()), True

    add(
        Case(
            "extreme values",
            "conformal",
            "non-randomised APS, K = 2, allow_empty: ties at q_hat counted, no ceiling claimed",
            ties,
            reference=ties_by_hand,
        )
    )
    # item 6: one image, one set
    pipe, images = tiny_pipeline()
    predictor = ConformalPredictor("raps", allow_empty=True, seed=2).fit(
        rng.normal(scale=0.05, size=(1000, K)).astype(np.float32), rng.integers(0, K, 1000), alpha=0.4
    )
    predictor.attach(pipe)
    from PIL import Image

    pictures = [
        Image.fromarray((255 * (images[i].permute(1, 2, 0).numpy().clip(-1, 1) + 1) / 2).astype(np.uint8))
        for i in range(4)
    ]

    def sets(results):
        return [sorted(r["label"] for r in rows if r["in_set"]) for rows in results]

    add(
        Case(
            "processes",
            "conformal",
            "pipeline: the same 4 images, two calls and one at a time: the same sets",
            lambda: (
                sets(pipe(pictures, top_k=1))
                == sets(pipe(pictures, top_k=1))
                == [sets([pipe(p, top_k=1)])[0] for p in pictures]
            ),
            reference=lambda: True,
        )
    )
    # item 12: conformal --dry-run
    np.savez(tmp / "cp.npz", logits=zc, labels=yc)

    def dry_run():
        with own_tempdir(tmp / "tempdir") as scratch:
            out = cli(
                "conformal", "--logits", tmp / "cp.npz", "--method", "thr", "--push-to-hub", "me/vit", "--dry-run"
            )
        return (
            "would receive README.md (" in out
            and "config.json (" in out
            and not any(scratch.iterdir())
            and (str(scratch) not in out)
        )

    add(
        Case(
            "existing output files",
            "CLI",
            "conformal --dry-run: lists the files, prints no folder that is gone, leaves none",
            dry_run,
            reference=lambda: True,
        )
    )
    return cases


@pytest.mark.parametrize("case", case_params(conformal_cases))
def test_bad_input(case: Case) -> None:
    check(case)
