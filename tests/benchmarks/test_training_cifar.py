"""`benchmarks/training_cifar.py`'s bookkeeping: the record schema, resuming run by run, atomic writes, the table.

The numbers are the benchmark's business; here it runs on a few synthetic 32x32 images with a tiny model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import training_cifar as tc  # noqa: E402

torch.set_num_threads(1)
TINY = tc.Settings(train_size=48, holdout_size=32, epochs=1, batch_size=16, widths=(4, 8, 8))


def _tensors(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def split(n):
        return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)

    return {"train": split(48), "holdout": split(32), "val": split(40), "test": split(40)}


def test_one_run_writes_records_with_the_documented_keys(tmp_path):
    """A real run (CE: stage 1 and MaC-Cal) through CalibrationTrainer; every record has the documented keys."""
    out = tmp_path / "training_cifar.json"
    tc.run_all([("overconfident", "CE", 0)], _tensors(), TINY, out, progress=False)
    data = json.loads(out.read_text())
    assert data["settings"]["train_size"] == 48 and data["settings"]["widths"] == [4, 8, 8]
    records = data["records"]
    assert [r["stage"] for r in records] == ["stage1", "maccal"]
    for r in records:
        assert set(tc.RECORD_KEYS) <= set(r)
        assert (r["regime"], r["loss"], r["seed"]) == ("overconfident", "CE", 0)
        for key in ("accuracy", "ece", "adaece", "o_ece", "u_ece", "ece_ts"):
            assert 0.0 <= r[key] <= 1.0, key
        assert r["nll"] > 0
        assert r["o_ece"] + r["u_ece"] == pytest.approx(r["ece"], abs=1e-12)  # the split adds up (15 bins)


def _fake_runner(calls):
    def runner(regime, loss_key, seed, tensors, settings, progress, **kwargs):
        calls.append((regime, loss_key, seed))
        stages = ["stage1", "maccal"] if loss_key in tc.MACCAL_LOSSES else ["stage1"]
        return [
            {
                "regime": regime,
                "loss": loss_key,
                "seed": seed,
                "stage": s,
                **{k: 0.1 for k in tc.METRICS},
                "mean_confidence": 0.5,
                "train_accuracy": 1.0,
                "seconds": 1.0,
            }
            for s in stages
        ]

    return runner


def test_resume_skips_finished_runs_and_redoes_incomplete_ones(tmp_path):
    out = tmp_path / "results.json"
    plan = [("overconfident", "CE", 0), ("overconfident", "LS", 0), ("wellfitted", "LS", 1)]
    calls: list = []
    tc.run_all(plan, {}, TINY, out, progress=False, runner=_fake_runner(calls))
    assert calls == plan
    calls.clear()
    tc.run_all(plan, {}, TINY, out, progress=False, runner=_fake_runner(calls))
    assert calls == []  # everything was there
    # a run interrupted between its stages (CE's MaC-Cal record missing) is done again, and only it
    data = json.loads(out.read_text())
    data["records"] = [r for r in data["records"] if not (r["loss"] == "CE" and r["stage"] == "maccal")]
    out.write_text(json.dumps(data))
    tc.run_all(plan, {}, TINY, out, progress=False, runner=_fake_runner(calls))
    assert calls == [("overconfident", "CE", 0)]
    records = json.loads(out.read_text())["records"]
    assert sorted((r["loss"], r["stage"]) for r in records) == [
        ("CE", "maccal"),
        ("CE", "stage1"),
        ("LS", "stage1"),
        ("LS", "stage1"),
    ]


def test_resume_refuses_other_settings(tmp_path):
    out = tmp_path / "results.json"
    tc.run_all([("overconfident", "LS", 0)], {}, TINY, out, progress=False, runner=_fake_runner([]))
    other = tc.Settings(**{**TINY.__dict__, "epochs": 2})
    with pytest.raises(SystemExit, match="other settings"):
        tc.run_all([("overconfident", "LS", 0)], {}, other, out, progress=False, runner=_fake_runner([]))


def test_json_is_written_atomically(tmp_path):
    out = tmp_path / "results.json"
    tc.write_json_atomic(out, {"settings": {}, "records": [1]})
    with pytest.raises(TypeError):
        tc.write_json_atomic(out, {"settings": {}, "records": [object()]})  # fails half-way through the dump
    assert json.loads(out.read_text()) == {"settings": {}, "records": [1]}  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left behind


def test_table_shows_mean_and_std_over_seeds(tmp_path):
    records = []
    for seed, ece in enumerate((0.10, 0.20, 0.36)):
        records.append(
            {
                "regime": "overconfident",
                "loss": "LS",
                "seed": seed,
                "stage": "stage1",
                **{k: 0.5 for k in tc.METRICS},
                "ece": ece,
                "mean_confidence": 0.7,
                "train_accuracy": 1.0,
                "val_ece": 0.2,
            }
        )
    row = [line for line in tc.table(records, "overconfident").splitlines() if line.startswith("| LS")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    eces = np.array([10.0, 20.0, 36.0])
    assert cells[2] == "3" and cells[4] == f"{eces.mean():.2f} ± {eces.std(ddof=1):.2f}"  # 22.00 ± 13.11
